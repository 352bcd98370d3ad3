"""Values for Ansible as data, never as template text.

Ansible renders any string it trusts that holds ``{{``, ``{%`` or ``{#``: a scenario value, an action's
input or a path (a runs directory named ``r{{ lookup('pipe', ...) }}``) that reached a playbook, an
extra-vars file or an inventory as trusted text would run on the controller. Everything dit hands to
Ansible as a file goes through :func:`unsafe_yaml`, which tags those strings ``!unsafe``. A file that
mixes a user's own Ansible text (an inventory they edit by hand, whose templates are theirs) with values
dit sets from a request goes through :func:`marked_yaml`: only values wrapped in :class:`UnsafeText` are
tagged. :func:`load_unsafe_yaml` reads either back, a tagged string as :class:`UnsafeText`.
"""

from __future__ import annotations

import json
from typing import Any

import yaml


class UnsafeText(str):
    """A string that is data: written ``!unsafe`` wherever it could be read as a template."""

    __slots__ = ()


class _UnsafeDumper(yaml.SafeDumper):
    """YAML whose strings that could hold a template are tagged ``!unsafe``."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


class _MarkedDumper(yaml.SafeDumper):
    """YAML whose :class:`UnsafeText` strings that could hold a template are tagged ``!unsafe``."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


# Jinja's delimiters ({{ {% {#) all open with "{"; "%" and "#" are kept for a template whose delimiters
# were changed. ansible-core 2.19 resolves the type of a "!unsafe" scalar as if it were plain, quotes or
# not ('000…0' becomes the integer 0, 'yes' True), so a string that cannot be a template goes untagged
# and quoted as any string, and keeps its type; one holding these characters resolves to a string.
_TEMPLATE_CHARS = frozenset("{%#")


def _represent_unsafe(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    if _TEMPLATE_CHARS.isdisjoint(text):
        return dumper.represent_str(text)
    return dumper.represent_scalar("!unsafe", text, style="'" if "\n" not in text else "|")


_UnsafeDumper.add_representer(str, _represent_unsafe)
_UnsafeDumper.add_representer(UnsafeText, _represent_unsafe)
_MarkedDumper.add_representer(UnsafeText, _represent_unsafe)


def unsafe_yaml(data: Any) -> str:
    """``data`` (JSON-shaped) as YAML with every string that could hold a template, keys included,
    tagged ``!unsafe``.

    Values are normalised through JSON first (tuples become lists), as ansible-runner's own
    command-line extra vars were, so that what Ansible sees is exactly what was meant.
    """
    plain = json.loads(json.dumps(data, default=str))
    return yaml.dump(plain, Dumper=_UnsafeDumper, sort_keys=False, allow_unicode=True, width=1 << 16)


def marked_yaml(data: Any, **dump: Any) -> str:
    """``data`` as YAML with only its :class:`UnsafeText` strings (that could hold a template) tagged
    ``!unsafe``; every other string is written as it is, a template of the file's author included."""
    return str(yaml.dump(data, Dumper=_MarkedDumper, allow_unicode=True, **dump))


class _UnsafeLoader(yaml.SafeLoader):
    """Reads what :func:`unsafe_yaml` or :func:`marked_yaml` wrote (and plain YAML or JSON)."""


def _construct_unsafe(loader: yaml.SafeLoader, node: yaml.Node) -> UnsafeText:
    return UnsafeText(loader.construct_scalar(node))  # type: ignore[arg-type]


_UnsafeLoader.add_constructor("!unsafe", _construct_unsafe)


def load_unsafe_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_UnsafeLoader)  # noqa: S506 - a SafeLoader with one more string tag
