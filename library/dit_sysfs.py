#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Write sysfs-like files (cpufreq caps, turbo switches), journaled, validated, idempotent."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dit_sysfs
version_added: "0.1.0"
short_description: Set sysfs attributes (cpufreq limits, governor, turbo) with journal and validation
description:
  - Each entry of O(files) names one attribute by a glob relative to O(root) (for example
    C(devices/system/cpu/cpufreq/policy*/scaling_max_freq)) and the value every matching file
    must hold, a literal O(files[].value) or the content of the first existing sibling file named
    in O(files[].value_from) (for example C(base_frequency), else C(cpuinfo_max_freq)).
  - >-
    Before anything is written, every target is validated against the sibling files named by
    O(files[].min_from), O(files[].max_from) (numeric range) and O(files[].choices_from) (the
    allowed values, checked only when that file exists). A refusal names the scenario field
    O(files[].field) and shows values divided by O(files[].scale) in O(files[].unit), for example
    C(hardware.device1.cpu_freq_mhz: 2000 MHz is above cpuinfo_max_freq 1800 MHz).
  - Reads the current content, compares (numerically when both sides are integers) and writes only
    the files that differ, in the order of O(files). Nothing is written in check mode.
  - Journaled through the C(dit_sysfs) action plugin; with O(_dit_plan=true) it returns the
    C(file) records (path and prior content) of the files it would write, and writes nothing.
options:
  root:
    description:
      - The sysfs directory (C(/sys) on a host; a fake tree in local mode). C(/) means the host's C(/sys).
    type: path
    required: true
  files:
    description: The attributes to set, in the order they are written.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: Glob relative to O(root).
        type: str
        required: true
      value:
        description: The value to write (compared as an integer when it is one).
        type: raw
      value_from:
        description: Sibling file names; the content of the first that exists is the value.
        type: list
        elements: str
      required:
        description: Fail when the glob matches nothing (else the entry is skipped).
        type: bool
        default: true
      min_from:
        description: Sibling file holding the lowest allowed value.
        type: str
      max_from:
        description: Sibling file holding the highest allowed value.
        type: str
      choices_from:
        description: Sibling file listing the allowed values (whitespace separated).
        type: str
      field:
        description: Scenario field named in refusals.
        type: str
      scale:
        description: Divide numbers by this in messages (1000 shows kHz as MHz).
        type: int
        default: 1
      unit:
        description: Unit shown in messages.
        type: str
        default: ""
extends_documentation_fragment:
  - dit
  - dit.linux
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Validates the targets and reports the files that would change; writes nothing.
  diff_mode:
    support: full
    details: One line per differing file, its path and content before and after.
author: The dit developers
"""

EXAMPLES = r"""
- name: Cap every cpufreq policy at 1.2 GHz
  dit_sysfs:
    root: "{{ sysfs_root | default('/sys') }}"
    files:
      - path: devices/system/cpu/cpufreq/policy*/scaling_max_freq
        value: 1200000
        min_from: cpuinfo_min_freq
        max_from: cpuinfo_max_freq
        choices_from: scaling_available_frequencies
        field: hardware.device1.cpu_freq_mhz
        scale: 1000
        unit: MHz

- name: Turbo off where the intel_pstate driver offers it
  dit_sysfs:
    root: /sys
    files:
      - path: devices/system/cpu/intel_pstate/no_turbo
        value: 1
        required: false
"""

RETURN = r"""
files:
  description: Every matched file with its content before and the target value.
  returned: always
  type: list
  elements: dict
journal:
  description: In plan mode, the C(file) records of the files that would be written.
  returned: plan mode
  type: list
diff:
  description: Before and after content of the files that differ, keyed by path.
  returned: always
  type: dict
"""

import glob
import os
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dit_files import as_int, read, same

FILE_SPEC = {
    "path": {"type": "str", "required": True},
    "value": {"type": "raw"},
    "value_from": {"type": "list", "elements": "str"},
    "required": {"type": "bool", "default": True},
    "min_from": {"type": "str"},
    "max_from": {"type": "str"},
    "choices_from": {"type": "str"},
    "field": {"type": "str"},
    "scale": {"type": "int", "default": 1},
    "unit": {"type": "str", "default": ""},
}


class Refused(Exception):
    """A target is outside what the hardware offers."""


def show(value: Any, spec: dict[str, Any]) -> str:
    """``value`` as the scenario states it: kHz shown as MHz with scale 1000 and unit MHz."""
    number = as_int(value)
    unit = spec.get("unit") or ""
    if number is None:
        return repr(str(value).strip())
    scale = spec.get("scale") or 1
    shown = number // scale if number % scale == 0 else number / scale
    return f"{shown} {unit}".strip()


def check(target: str, spec: dict[str, Any], siblings: dict[str, str | None]) -> list[str]:
    """Refusal messages for ``target`` given the sibling files' contents (``{name: text or None}``)."""
    field = spec.get("field") or spec["path"]
    problems = []
    number = as_int(target)
    low_name, high_name = spec.get("min_from"), spec.get("max_from")
    low = as_int(siblings.get(low_name)) if low_name else None
    high = as_int(siblings.get(high_name)) if high_name else None
    if number is not None and low is not None and number < low:
        problems.append(f"{field}: {show(number, spec)} is below {low_name} {show(low, spec)}")
    if number is not None and high is not None and number > high:
        problems.append(f"{field}: {show(number, spec)} is above {high_name} {show(high, spec)}")
    choices_name = spec.get("choices_from")
    choices_text = siblings.get(choices_name) if choices_name else None
    if not problems and choices_text is not None:
        choices = choices_text.split()
        if not any(same(choice, target) for choice in choices):
            plain = dict(spec, unit="")
            listed = " ".join(show(c, plain) if as_int(c) is not None else c for c in choices)
            unit = " " + spec["unit"] if spec.get("unit") and number is not None else ""
            problems.append(f"{field}: {show(target, spec)} is not one of {choices_name} ({listed}{unit})")
    return problems


def plan(
    root: str, files: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """``(changes, seen, problems)``: the writes needed, every matched file, the refusals."""
    if os.path.realpath(root) == "/":
        root = "/sys"
    changes, seen, problems = [], [], []
    for spec in files:
        matches = sorted(glob.glob(os.path.join(root, spec["path"])))
        if not matches:
            if spec.get("required", True):
                problems.append(
                    "{}: no {} under {}".format(spec.get("field") or spec["path"], spec["path"], root)
                )
            continue
        for path in matches:
            directory = os.path.dirname(path)
            if spec.get("value_from"):
                target = None
                for name in spec["value_from"]:
                    target = read(os.path.join(directory, name))
                    if target is not None:
                        target = target.strip()
                        break
                if target is None:
                    problems.append(
                        "{}: none of {} exists in {}".format(
                            spec.get("field") or spec["path"], ", ".join(spec["value_from"]), directory
                        )
                    )
                    continue
            elif spec.get("value") is not None:
                target = str(spec["value"]).strip()
            else:
                problems.append("{}: neither value nor value_from given".format(spec["path"]))
                continue
            names = [str(spec[k]) for k in ("min_from", "max_from", "choices_from") if spec.get(k)]
            siblings = {name: read(os.path.join(directory, name)) for name in names}
            for problem in check(target, spec, siblings):
                if problem not in problems:
                    problems.append(problem)
            current = read(path)
            if current is None:
                problems.append(f"{path} cannot be read")
                continue
            seen.append({"path": path, "before": current.strip(), "target": target})
            if not same(current, target):
                changes.append({"path": path, "prior": current, "target": target})
    return changes, seen, problems


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "files": {"type": "list", "elements": "dict", "required": True, "options": FILE_SPEC},
            "_dit_plan": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    changes, seen, problems = plan(p["root"], p["files"])
    if problems:
        module.fail_json(msg="; ".join(problems), files=seen)
    diff = {
        "before": "".join("{}: {}\n".format(c["path"], c["prior"].strip()) for c in changes),
        "after": "".join("{}: {}\n".format(c["path"], c["target"]) for c in changes),
    }
    journal = [{"op": "file", "undo": {"path": c["path"], "prior": c["prior"]}} for c in changes]
    if p["_dit_plan"] or module.check_mode or not changes:
        module.exit_json(changed=bool(changes), journal=journal, files=seen, diff=diff)
    for change in changes:
        try:
            with open(change["path"], "w", encoding="utf-8") as handle:
                handle.write(change["target"] + "\n")
        except OSError as exc:
            module.fail_json(
                msg="writing {} to {} failed: {}".format(change["target"], change["path"], exc),
                files=seen,
                written=[c["path"] for c in changes[: changes.index(change)]],
            )
    module.exit_json(changed=True, files=seen, diff=diff)


if __name__ == "__main__":
    main()
