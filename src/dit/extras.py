"""The optional extras (``pyproject.toml``'s ``[project.optional-dependencies]``), and one sentence when one is missing.

A benchmark or command that needs TensorFlow or torch tells a newcomer which extra brings it and the
command that installs it, instead of ending in a ``ModuleNotFoundError`` traceback (issue 49, item 8).
"""

from __future__ import annotations

import importlib.util

#: The modules each extra provides, the first one named in the message.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "keras": ("tensorflow", "PIL"),
    "llm": ("torch", "transformers", "gguf", "accelerate"),
    "sim": ("simpy", "highspy"),
}


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that this interpreter cannot import."""
    return [name for name in EXTRA_MODULES[extra] if importlib.util.find_spec(name) is None]


def missing_extra_message(who: str, extras: tuple[str, ...]) -> str | None:
    """One line naming what ``who`` needs and how to install it, or None when everything is there."""
    lacking = {extra: missing_modules(extra) for extra in extras}
    lacking = {extra: names for extra, names in lacking.items() if names}
    if not lacking:
        return None
    spec = ",".join(lacking)
    names = ", ".join(name for names in lacking.values() for name in names)
    return (
        f"{who} needs the optional extra {spec!r} ({names} not installed): run "
        f"`.venv/bin/pip install -e '.[{spec}]'` from the checkout (or `./dev slow`, which installs it), then again"
    )


def require_extras(who: str, *extras: str) -> None:
    """Exit with :func:`missing_extra_message`'s line (status 2) when an extra is missing."""
    message = missing_extra_message(who, extras)
    if message is not None:
        raise SystemExit(message)
