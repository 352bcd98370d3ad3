"""Values that pass the type check but that no node can honour are refused by `dit validate`.

Each case is YAML as a user types it; the error must name the field's path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dit.cli import app
from dit.scenario import validate

BASE = "name: t\ndevices: [device1, device2]\n"

# (YAML added to BASE, the error line expected on stderr)
REFUSED = [
    # the values of the issue
    ("network: {device1: {delay_ms: 1e308}}", "network.device1.delay_ms: 1e+308 is greater than 600000"),
    ("timing: {start_lead_s: 1e12}", "timing.start_lead_s: 1000000000000 is greater than 600"),
    ("monitors: {interval_s: 1e-300}", "monitors.interval_s: 1e-300 is less than 0.1"),
    ("timing: {settle_s: 1e9}", "timing.settle_s: 1000000000 is greater than 3600"),
    ("timing: {settle: {timeout_s: 1e9}}", "timing.settle.timeout_s: 1000000000 is greater than 3600"),
    ("timing: {settle: {window_s: 0.001}}", "timing.settle.window_s: 0.001 is less than 0.05"),
    ("repetitions: 1e30", "repetitions: 1e+30 is greater than 10000"),
    (
        "hardware: {device1: {memory_limit_mb: 1000000000000000}}",
        "hardware.device1.memory_limit_mb: 1000000000000000 is greater than 1048576",
    ),
    (
        "network: {device1: {interface: 'eth0;reboot'}}",
        "network.device1.interface: 'eth0;reboot' is not a valid",
    ),
    ("network: {device1: {interface: ../../etc}}", "network.device1.interface: '../../etc' is not a valid"),
    # the other interface rules (IFNAMSIZ: at most 15 bytes, no '/', no whitespace, not . or ..)
    ("network: {device1: {interface: abcdefghijklmnop}}", "network.device1.interface: 'abcdefghijklmnop'"),
    ("network: {device1: {interface: 'wlan 0'}}", "network.device1.interface: 'wlan 0' is not a valid"),
    ("network: {device1: {interface: eth0/1}}", "network.device1.interface: 'eth0/1' is not a valid"),
    ("network: {device1: {interface: '.'}}", "network.device1.interface: '.' is not a valid"),
    ("network: {device1: {interface: '..'}}", "network.device1.interface: '..' is not a valid"),
    ("network: {device1: {interface: -eth0}}", "network.device1.interface: '-eth0' is not a valid"),
    ("network: {device1: {interface: ''}}", "network.device1.interface: '' is not a valid"),
    ("network: {device1: {interface: 'veth0@if5'}}", "network.device1.interface: 'veth0@if5' is not a valid"),
    # every other bound
    ("description: " + "x" * 10001, "description: must have at most 10000 characters"),
    ("warmup: 1001", "warmup: 1001 is greater than 1000"),
    ("inference: {partition_points: [10001]}", "inference.partition_points[0]: 10001 is greater than 10000"),
    (
        "inference: {partition_points: [[0, 10001]]}",
        "inference.partition_points[0][1]: 10001 is greater than 10000",
    ),
    ("inference: {repetitions: 10001}", "inference.repetitions: 10001 is greater than 10000"),
    (
        "optimisation: {algorithm: 'greedy; rm'}",
        "optimisation.algorithm: 'greedy; rm' is not a valid optimiser name",
    ),
    ("model: {name: ../fake}", "model.name: '../fake' is not a valid model name"),
    ("model: ../fake", "model: '../fake' is not a valid model name"),
    (
        'model: {name: fake, input: {kind: npy, path: "in\\u0001.npy"}}',
        "model.input.path: 'in\\x01.npy' is not a usable path",
    ),
    ("model: {name: fake, input: {kind: npy, path: " + "a" * 4096 + "}}", "model.input.path: "),
    ("sweep: {path: " + "a" * 1001 + ", values: [1]}", "sweep.path: must have at most 1000 characters"),
    ("monitors: {interval_s: 3601}", "monitors.interval_s: 3601 is greater than 3600"),
    ("load: {device1: {mode: processes, processes: 257}}", "load.device1.processes: 257 is greater than 256"),
    (
        "load: {device1: {mode: continuous, interval_s: 0.01}}",
        "load.device1.interval_s: 0.01 is less than 0.1",
    ),
    (
        "load: {device1: {mode: continuous, interval_s: 1e9}}",
        "load.device1.interval_s: 1000000000 is greater",
    ),
    ("network: {device1: {jitter_ms: 600001}}", "network.device1.jitter_ms: 600001 is greater than 600000"),
    ("network: {device1: {rate_mbit: 1e-300}}", "network.device1.rate_mbit: 1e-300 is less than 0.001"),
    ("network: {device1: {rate_mbit: 1e6}}", "network.device1.rate_mbit: 1000000 is greater than 10000"),
    (
        "network: {device1: {variation: {kind: uniform, low_ms: 0, high_ms: 1e300, interval_s: 1}}}",
        "network.device1.variation.high_ms: 1e+300 is greater than 600000",
    ),
    (
        "network: {device1: {variation: {kind: uniform, low_ms: 1e300, high_ms: 1e300, interval_s: 1}}}",
        "network.device1.variation.low_ms: 1e+300 is greater than 600000",
    ),
    (
        "network: {device1: {variation: {kind: uniform, low_ms: 1, high_ms: 2, interval_s: 1e-9}}}",
        "network.device1.variation.interval_s: 1e-09 is less than 0.1",
    ),
    (
        "network: {device1: {variation: {kind: square, low_ms: 1, high_ms: 2, period_s: 0.01}}}",
        "network.device1.variation.period_s: 0.01 is less than 0.2",
    ),
    (
        "network: {device1: {destinations: {edge: {delay_ms: 1e308}}}}",
        "network.device1.destinations.edge.delay_ms: 1e+308 is greater than 600000",
    ),
    (
        "network: {device1: {destinations: {edge: {jitter_ms: 1e308}}}}",
        "network.device1.destinations.edge.jitter_ms: 1e+308 is greater than 600000",
    ),
    (
        "network: {device1: {destinations: {edge: {rate_mbit: 0.0001}}}}",
        "network.device1.destinations.edge.rate_mbit: 0.0001 is less than 0.001",
    ),
    (
        "hardware: {device1: {cpu_freq_mhz: 1000000}}",
        "hardware.device1.cpu_freq_mhz: 1000000 is greater than",
    ),
    (
        "hardware: {device1: {governor: 'performance;x'}}",
        "hardware.device1.governor: 'performance;x' is not a",
    ),
    ("hardware: {device1: {governor: ../../x}}", "hardware.device1.governor: '../../x' is not a cpufreq"),
    ("hardware: {device1: {threads: 100000}}", "hardware.device1.threads: 100000 is greater than 256"),
    (
        "hardware: {device1: {cpu_budget_pct: 1e308}}",
        "hardware.device1.cpu_budget_pct: 1e+308 is greater than",
    ),
    (
        "background_traffic: {device1: {bitrate_mbit: 1e-300}}",
        "background_traffic.device1.bitrate_mbit: 1e-300 is less than 0.001",
    ),
    (
        "background_traffic: {device1: {bitrate_mbit: 1e300}}",
        "background_traffic.device1.bitrate_mbit: 1e+300 is greater than 10000",
    ),
    # a sweep value is checked like a written one
    (
        "sweep: {path: network.device1.delay_ms, values: [10, 1e308]}",
        "sweep.values[1]: network.device1.delay_ms=1e+308: 1e+308 is greater than 600000",
    ),
]


@pytest.mark.parametrize(("extra", "expected"), REFUSED, ids=[e[:48] for e, _ in REFUSED])
def test_dit_validate_refuses_a_value_no_node_can_honour(tmp_path: Path, extra: str, expected: str) -> None:
    path = tmp_path / "s.yaml"
    model = "" if extra.startswith("model:") else "model: fake\n"
    path.write_text(BASE + model + extra + "\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert f"{path}: {expected}" in result.output, result.output
    assert "Traceback" not in result.output


def test_the_bounds_themselves_are_accepted() -> None:
    doc = {
        "name": "t",
        "model": {"name": "fake", "input": {"kind": "npy", "path": "/data/in put/ü.npy"}},
        "devices": ["device1", "device2"],
        "repetitions": 10000,
        "warmup": 1000,
        "inference": {"partition_points": [0, 4], "repetitions": 10000},
        "optimisation": {"algorithm": "exhaustive"},
        "timing": {"start_lead_s": 600, "settle_s": 3600},
        "monitors": {"interval_s": 0.1},
        "load": {
            "device1": {"mode": "continuous", "interval_s": 0.1},
            "device2": {"mode": "processes", "processes": 256},
        },
        "network": {
            "device1": {
                "interface": "wlan0.100",
                "delay_ms": 600000,
                "jitter_ms": 600000,
                "rate_mbit": 0.001,
                "destinations": {"edge": {"delay_ms": 600000, "rate_mbit": 10000}},
            },
            "device2": {
                "interface": "enx0123456789ab",  # 15 characters: the longest a Linux name can be
                "variation": {"kind": "square", "low_ms": 0, "high_ms": 600000, "period_s": 0.2},
            },
        },
        "hardware": {
            "device1": {
                "cpu_freq_mhz": 10000,
                "governor": "schedutil",
                "memory_limit_mb": 1048576,
                "threads": 256,
                "cpu_budget_pct": 25600,
            }
        },
        "background_traffic": {"device1": {"bitrate_mbit": 10000}, "device2": {"bitrate_mbit": 0.001}},
    }
    assert validate(doc) == []


def test_the_bounds_that_are_facts_of_the_code_agree_with_it() -> None:
    from dit.conditions.netem.tc import UNSHAPED_MBIT
    from dit.device.load import PERIOD_NS
    from dit.scenario import load_schema

    defs = load_schema()["$defs"]
    # a cap above the rate of an unshaped htb class would not cap anything
    assert defs["network"]["properties"]["rate_mbit"]["maximum"] == UNSHAPED_MBIT
    assert defs["netemProfile"]["properties"]["rate_mbit"]["maximum"] == UNSHAPED_MBIT
    # the load generator changes its targets only between two duty-cycle periods
    assert defs["load"]["properties"]["interval_s"]["minimum"] == PERIOD_NS / 1e9
