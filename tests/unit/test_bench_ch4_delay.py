"""``benchmarks/bench_ch4_mape.py --delay DEVICE=MS``: ch4's validation with a device's link delayed (issue 31,
item 7: the delay model's MAPE with the delay applied). The scenario copy it runs, and its bad input."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from dit.scenario import load

REPO = Path(__file__).resolve().parents[2]


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_ch4_mape", REPO / "benchmarks" / "bench_ch4_mape.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_ch4_mape", module)
    spec.loader.exec_module(module)
    return module


def test_the_copy_delays_only_the_named_device_and_still_validates(tmp_path: Path) -> None:
    b = bench()
    path = b.with_stand_in(b.SCENARIO, tmp_path, delays=b.parse_delays(["device1=10"]))
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert doc["network"]["device1"]["delay_ms"] == 10.0
    assert all("delay_ms" not in (doc["network"].get(d) or {}) for d in doc["devices"] if d != "device1")
    assert doc["model"]["name"] == "fake"
    load(path)  # the schema and the semantic checks accept it


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["device1"], "expected DEVICE=MS"),
        (["device1=-3"], "expected DEVICE=MS"),
        (["=5"], "expected DEVICE=MS"),
        (["device1=soon"], "'device1=soon'"),
    ],
)
def test_a_bad_delay_names_itself(items: list[str], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        bench().parse_delays(items)


def test_a_device_the_scenario_lacks_is_named(tmp_path: Path) -> None:
    b = bench()
    with pytest.raises(SystemExit, match=r"device9 is not a device of ch4_validation\.yaml"):
        b.with_stand_in(b.SCENARIO, tmp_path, delays={"device9": 5.0})


def test_each_runs_self_check_is_printed_with_its_backend_and_an_unmeasured_link_said(tmp_path: Path) -> None:
    from dit.conditions.netem.check import CHECK_COLUMNS

    agg = tmp_path / "run" / "aggregate"
    agg.mkdir(parents=True)
    rows = [
        {"device": "device1", "target": "edge", "backend": "userspace", "intended_delay_ms": "10.0",
         "difference_ms": "0.037", "pass": "True"},
        {"device": "device1", "target": "device2", "backend": "userspace", "intended_delay_ms": "10.0",
         "difference_ms": "", "pass": ""},
        {"device": "device2", "target": "edge", "backend": "", "shaping": "none", "intended_delay_ms": "0.0"},
    ]  # fmt: skip
    lines = [",".join(CHECK_COLUMNS)] + [",".join(str(r.get(c, "")) for c in CHECK_COLUMNS) for r in rows]
    (agg / "netem_check.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    note = bench().network_note(tmp_path / "run")
    assert note == (
        "device1->edge +10 ms by userspace, measured - baseline - intended +0.037 ms (pass: True); "
        "device1->device2 +10 ms by userspace, measured - baseline - intended not measured (pass: not checked)"
    )
