"""The ``dit_config_txt`` filter: a Raspberry Pi ``config.txt`` with the wanted settings (pure).

``config.txt`` is read top to bottom, a later line overriding an earlier one, and ``[filter]`` lines
(``[pi4]``, ``[cm4]``, ...) make what follows apply only to some boards until the next filter;
``[all]`` (and the part before any filter) applies to every board. A setting is ``name=value``
(``arm_64bit=1``) or a device-tree parameter ``dtparam=name=value`` (``dtparam=i2c_arm=on``), and one
``dtparam`` line may set several parameters (``dtparam=i2c_arm=on,spi=on``; a bare ``i2c_arm`` means
``on``). For every wanted setting the filter:

1. rewrites every active line that sets it to another value, wherever it is (a ``[pi4]`` section that
   turns I2C off would override the global line);
2. if no line for every board sets it yet: uncomments the stock commented line (``#dtparam=i2c_arm=on``
   in the part for every board), else appends it, after an ``[all]`` line when the file ends in a
   filtered section.

The result of a file that already has every setting is the same text: the role writes (and reboots)
only when it differs. What raspi-config's ``do_i2c`` does, without a shell.
"""

from __future__ import annotations

import re

_FILTER = re.compile(r"^\s*\[([^\]]*)\]\s*(#.*)?$")
_COMMENTED = re.compile(r"^\s*#\s*(.*?)\s*$")


def _parse_setting(setting):
    """``dtparam=i2c_arm=on`` → ``("dtparam", "i2c_arm", "on")``; ``arm_64bit=1`` → ``("arm_64bit", None, "1")``."""
    if not isinstance(setting, str) or "=" not in setting or setting != setting.strip():
        raise ValueError(f"config.txt setting {setting!r} is not name=value or dtparam=name=value")
    directive, _, rest = setting.partition("=")
    if directive in ("dtparam", "dtoverlay_param"):
        name, sep, value = rest.partition("=")
        if not name or not sep or "," in rest:
            raise ValueError(f"config.txt setting {setting!r}: expected {directive}=name=value")
        return directive, name, value
    if not directive or not rest:
        raise ValueError(f"config.txt setting {setting!r} is not name=value")
    return directive, None, rest


def _assignments(line, directive, name):
    """The value(s) ``line`` gives the setting, as (index in its list or None, value); [] if none."""
    key, sep, rest = line.strip().partition("=")
    if not sep or key.strip() != directive:
        return []
    rest = rest.split("#", 1)[0].strip()
    if name is None:
        return [(None, rest)]
    found = []
    for index, item in enumerate(rest.split(",")):
        param, has_value, value = item.strip().partition("=")
        if param == name:
            found.append((index, value if has_value else "on"))
    return found


def _rewrite(line, directive, name, value):
    """``line`` with the setting's value(s) replaced by ``value``."""
    if name is None:
        return f"{directive}={value}"
    _, _, rest = line.strip().partition("=")
    items = [item.strip() for item in rest.split("#", 1)[0].split(",")]
    items = [(f"{name}={value}" if item.partition("=")[0] == name else item) for item in items]
    return "{}={}".format(directive, ",".join(items))


def config_txt(text, settings):
    """``text`` (a config.txt) with every one of ``settings`` in force for every board."""
    if isinstance(settings, str):
        settings = [settings]
    lines = text.splitlines()
    for setting in settings:
        directive, name, value = _parse_setting(setting)
        wanted = f"{directive}={value}" if name is None else setting
        everywhere = True  # before any filter, or after [all]
        set_for_all = False
        commented_at = None
        for i, line in enumerate(lines):
            section = _FILTER.match(line)
            if section:
                everywhere = section.group(1).strip().lower() == "all"
                continue
            found = _assignments(line, directive, name)
            if found:
                if any(v != value for _, v in found):
                    lines[i] = _rewrite(line, directive, name, value)
                set_for_all = set_for_all or everywhere
                continue
            comment = _COMMENTED.match(line)
            if everywhere and commented_at is None and comment and comment.group(1) == wanted:
                commented_at = i
        if set_for_all:
            continue
        if commented_at is not None:
            lines[commented_at] = wanted
            continue
        last_filter = None
        for line in lines:
            section = _FILTER.match(line)
            if section:
                last_filter = section.group(1).strip().lower()
        if last_filter not in (None, "all"):
            lines.append("[all]")
        lines.append(wanted)
    return "\n".join(lines) + "\n"


class FilterModule:
    def filters(self):
        return {"dit_config_txt": config_txt}
