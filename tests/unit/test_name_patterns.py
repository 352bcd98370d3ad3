"""Every name pattern refuses a trailing newline (issue 46, item 6).

``name: "qsnl\\n"`` and a device ``"device1\\n"`` once passed ``dit validate``: jsonschema checks a
schema's ``pattern`` with Python's ``re.search``, where ``$`` also matches before a final newline, and
the run then failed on the node with ``Errno 22``. The schema's patterns must refuse it under Python's
semantics and under ECMA-262's (the web form compiles the same patterns with ``new RegExp``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from typer.testing import CliRunner

from dit.cli import app
from dit.run import launch
from dit.runtime_api import registry
from dit.scenario import core, pathexpr, schema_path, validate
from dit.scenario.schema import load_schema
from dit.web.services import nodes, runs

# A valid example of every pattern dit checks; a new pattern needs one here (the first test says so).
EXAMPLES = {
    r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$(?!\n)": "quickstart",
    r"^[A-Za-z][A-Za-z0-9_-]{0,62}$(?!\n)": "device1",
    r"^[^\u0000-\u001f\u007f]{1,4095}$(?!\n)": "/data/in put/ü.npy",
    r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$(?!\n)": "eth0",
    r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,252}$(?!\n)": "10.0.0.0/24",
    r"^[a-z][a-z0-9_]{0,14}$(?!\n)": "performance",
    r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,252}$(?!\n)": "edge.local",
    r"^[0-9a-f]{64}$(?!\n)": "0" * 64,
    r"^/[^\u0000-\u001f\u007f]*$(?!\n)": "/usr/bin/python3",
}

# The patterns the Python code checks by itself (names of runs, nodes, process tags, sweep paths).
PYTHON_PATTERNS: dict[str, tuple[re.Pattern[str], str]] = {
    "web.services.runs.SEGMENT": (runs.SEGMENT, "quickstart"),
    "web.services.nodes.NAME": (nodes.NAME, "device1"),
    "web.services.nodes.ADDRESS": (nodes.ADDRESS, "10.0.0.2"),
    "scenario.core._DEVICE_NAME": (core._DEVICE_NAME, "device1"),
    "scenario.pathexpr._PLAIN": (pathexpr._PLAIN, "delay_ms"),
    "run.launch._NAME": (launch._NAME, "hs-worker1"),
}


def _patterns(node: Any) -> Iterator[str]:
    """Every ``pattern`` and ``patternProperties`` key below ``node``."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                yield value
            if key == "patternProperties" and isinstance(value, dict):
                yield from value
            yield from _patterns(value)
    elif isinstance(node, list):
        for value in node:
            yield from _patterns(value)


def schema_patterns() -> set[str]:
    """The checked-in schema's, the assembled one's (every installed runtime's block) and the runtimes'
    action inputs'."""
    found = set(_patterns(json.loads(schema_path().read_text(encoding="utf-8"))))
    found |= set(_patterns(load_schema()))
    for runtime in registry.installed().values():
        found |= set(_patterns(dict(runtime.block_schema())))
        for action in runtime.actions():
            found |= set(_patterns(dict(action.inputs)))
    return found


def test_every_pattern_has_an_example() -> None:
    missing = sorted(schema_patterns() - set(EXAMPLES))
    assert not missing, f"add a valid example of each to EXAMPLES: {missing}"
    assert {"headsplit", "llamacpp-rpc"} <= set(registry.installed()), "the runtimes' blocks were walked"


@pytest.mark.parametrize("pattern", sorted(EXAMPLES))
def test_a_schema_pattern_refuses_a_trailing_newline_as_jsonschema_checks_it(pattern: str) -> None:
    check = Draft202012Validator({"type": "string", "pattern": pattern})
    example = EXAMPLES[pattern]
    assert check.is_valid(example)
    assert not check.is_valid(example + "\n")
    assert not check.is_valid(example + "\n" + example)


def test_the_schema_patterns_refuse_a_trailing_newline_as_ecma_262_reads_them() -> None:
    """The web form (static/form.js) compiles the same patterns in the browser: they must stay valid
    ECMA-262 and mean the same there."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    script = (
        "const cases = JSON.parse(process.argv[1]);"
        "console.log(JSON.stringify(cases.map(([p, e]) => [new RegExp(p, 'u').test(e),"
        " new RegExp(p, 'u').test(e + '\\n'), new RegExp(p).test(e + '\\n')])));"
    )
    cases = sorted(EXAMPLES.items())
    done = subprocess.run(
        [node, "-e", script, json.dumps(cases)], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(done.stdout) == [[True, False, False]] * len(cases), cases


@pytest.mark.parametrize("name", sorted(PYTHON_PATTERNS))
def test_a_python_name_pattern_refuses_a_trailing_newline(name: str) -> None:
    pattern, example = PYTHON_PATTERNS[name]
    assert pattern.match(example)
    assert not pattern.match(example + "\n")


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"name": "qsnl\n"}, "name: 'qsnl\\n' is not a valid scenario name"),
        ({"devices": ["device1\n", "device2"]}, "devices[0]: 'device1\\n' is not a valid device name"),
        (
            {"network": {"device1\n": {"delay_ms": 5}}},
            "network[\"device1\\n\"]: 'device1\\n' is not a valid device name",
        ),
        (
            {"runtime": {"name": "headsplit", "controller": "device1\n"}},
            "runtime.controller: 'device1\\n' is not a valid device name",
        ),
    ],
)
def test_validate_refuses_a_trailing_newline_in_a_name(doc: dict[str, Any], expected: str) -> None:
    raw = {"name": "qsnl", "model": "fake", "devices": ["device1", "device2"], **doc}
    found = [str(e) for e in validate(raw)]
    assert any(e.startswith(expected) for e in found), found


def test_dit_validate_refuses_a_scenario_name_with_a_trailing_newline(tmp_path: Path) -> None:
    path = tmp_path / "qsnl.yaml"
    path.write_text('name: "qsnl\\n"\nmodel: fake\ndevices: [device1, device2]\n', encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert "name: 'qsnl\\n' is not a valid scenario name" in result.output, result.output
    assert "Traceback" not in result.output
