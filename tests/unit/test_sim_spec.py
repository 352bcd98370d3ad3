"""dit.sim.spec and ``dit simulate``: the shipped what-if files load, a small file simulates through the
command, and a bad field is named with what would be valid, with no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytest.importorskip("simpy", reason="the sim extra (SimPy) is not installed")

from typer.testing import CliRunner

from dit.cli import app
from dit.sim.engine import SimError
from dit.sim.spec import load
from tests.conftest import REPO

SMALL = """
model: gpt2-tiny
tokens: 5
prompt_tokens: 3
placement: greedy
replacement: true
devices:
  - {name: pi, count: 3, flops_per_s: 1.0e+9, memory_mb: 100, rtt_ms: 5, bandwidth_mbps: 100}
links:
  - {a: pi1, b: pi2, rtt_ms: 0.5, bandwidth_mbps: 1000}
"""


@pytest.mark.parametrize("path", sorted((REPO / "scenarios").glob("sim/*.yaml")), ids=lambda p: p.name)
def test_the_shipped_simulation_files_load(path: Path) -> None:
    config = load(path)
    assert config.tokens >= 1 and len(config.devices) >= 2 and config.placement


def test_a_small_file_simulates_through_the_command(tmp_path: Path) -> None:
    spec = tmp_path / "sim.yaml"
    spec.write_text(SMALL, encoding="utf-8")
    config = load(spec)
    assert [d.name for d in config.devices] == ["pi1", "pi2", "pi3"]
    assert (
        config.devices[0].rtt_s == pytest.approx(0.005) and config.devices[0].bandwidth_bytes_per_s == 12.5e6
    )
    done = CliRunner().invoke(app, ["simulate", str(spec), "--placement", "roundrobin"])
    assert done.exit_code == 0, done.output
    assert done.output.startswith("tokens 5, simulated ") and "events/s" in done.output


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("placement: greedy", "placement: 'best' is not one of layerwise, roundrobin, greedy, galaxy"),
        ("flops_per_s: 1.0e+9", "devices[0].flops_per_s: '1.0e9' is not a number >= 0"),
        ("rtt_ms: 5", "devices[0].rttms: unknown key; valid: bandwidth_mbps, call_overhead_ms, count"),
        ("a: pi1", "links[0].a: 'pi9' is not a device name or 'controller'"),
    ],
)
def test_a_bad_field_is_named_without_a_traceback(tmp_path: Path, change: str, message: str) -> None:
    bad = {
        "placement: greedy": "placement: best",
        "flops_per_s: 1.0e+9": "flops_per_s: 1.0e9",
        "rtt_ms: 5": "rttms: 5",
        "a: pi1": "a: pi9",
    }[change]
    spec = tmp_path / "sim.yaml"
    spec.write_text(SMALL.replace(change, bad, 1), encoding="utf-8")
    with pytest.raises(SimError, match=r"sim\.yaml: "):
        load(spec)
    done = CliRunner().invoke(app, ["simulate", str(spec)])
    assert done.exit_code == 2 and "Traceback" not in done.output
    assert message in " ".join(done.output.split()), done.output


def test_control_and_worker_rtt_are_read_and_checked(tmp_path: Path) -> None:
    spec = tmp_path / "sim.yaml"
    spec.write_text(SMALL + "control: rpc\nworker_rtt: sum\n", encoding="utf-8")
    config = load(spec)
    assert (config.control, config.worker_rtt) == ("rpc", "sum")
    plain = tmp_path / "plain.yaml"
    plain.write_text(SMALL, encoding="utf-8")
    assert (load(plain).control, load(plain).worker_rtt) == ("dataflow", "mean")
    spec.write_text(SMALL + "control: push\n", encoding="utf-8")
    with pytest.raises(SimError, match=r"sim\.yaml: control: 'push' is not one of dataflow, rpc"):
        load(spec)


def test_a_devices_head_rate_costs_its_heads_and_places_greedy() -> None:
    from dit.sim.spec import config_from

    doc = yaml.safe_load(SMALL)
    doc["devices"][0]["head_flops_per_s"] = 2.5e8
    config = config_from(doc)
    assert {d.unit_flops_per_s for d in config.devices} == {(2.5e8, 1e9, 1e9)}
    # HeadSplit's greedy places with the heads' rate (its cost model weighs them against the links)
    plain = config_from(yaml.safe_load(SMALL)).placement
    assert any(plain[u] != w for u, w in config.placement.items())
    doc["devices"][0]["head_flops_per_s"] = 0
    with pytest.raises(SimError, match=r"devices\[0\].head_flops_per_s: must be > 0"):
        config_from(doc)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["simulate", "x.yaml", "--fit-article"], "--fit-article fits the article's own rack"),
        (["simulate", "x.yaml", "--write", "out.yaml"], "--one-rate and --write go with --fit-article"),
    ],
)
def test_the_fit_options_are_refused_where_they_do_not_apply(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, args, terminal_width=200)
    assert result.exit_code == 2 and message in result.output
