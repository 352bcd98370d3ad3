"""dit report on a ch6_compare-shaped sweep: tokens/s against the added RTT, one line per runtime variant.

The runs are hand-made directories (status, scenario, metadata, summary) with known tokens/s, so the
plot's series, the table and the "recorded, not applied" note are checked against the figures put in.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from dit.report import rtt
from dit.report.build import RTT_AXIS, TOKENS_AXIS, build_report, rtt_figure, rtt_section

DEVICES = ["device1", "device2"]
HS_GREEDY = {
    "name": "headsplit",
    "strategy": "greedy",
    "speculation": True,
    "model": "llama-tiny",
    "tokens": 8,
}
HS_LAYER = {
    "name": "headsplit",
    "strategy": "layerwise",
    "speculation": False,
    "model": "llama-tiny",
    "tokens": 8,
}
LC_F32 = {"name": "llamacpp-rpc", "model": "llama-tiny", "quant": "F32", "tokens": 8}
LC_Q8 = {"name": "llamacpp-rpc", "model": "llama-tiny", "quant": "Q8_0", "tokens": 8}
# tokens/s per variant at added RTT 0, 5 and 15 ms (what each run's summary says)
RATES = {
    "headsplit (strategy=greedy, speculation)": (HS_GREEDY, (9.0, 6.0, 3.0)),
    "headsplit (strategy=layerwise, no speculation)": (HS_LAYER, (12.0, 10.0, 7.5)),
    "llamacpp-rpc (quant=F32)": (LC_F32, (40.0, 30.0, 20.0)),
    "llamacpp-rpc (quant=Q8_0)": (LC_Q8, (55.0, 41.0, 25.0)),
}
RTTS = (0.0, 5.0, 15.0)


def fake_run(
    target: Path,
    block: dict[str, Any],
    delays: dict[str, float],
    tokens_per_s: float | None,
    *,
    netem_dry_run: bool = True,
    state: str = "completed",
) -> Path:
    """A finished run of a sweep over the runtime block and the workers' netem delays."""
    target.mkdir(parents=True)
    network = {d: {"delay_ms": v} for d, v in delays.items()}
    document = {"name": "ch6_compare", "devices": DEVICES, "runtime": block, "network": network}
    point = [["runtime", block], ["network", network]]
    (target / "scenario.yaml").write_text(json.dumps(document), encoding="utf-8")
    (target / "status.json").write_text(
        json.dumps({"state": state, "label": "ch6_compare[...]"}), encoding="utf-8"
    )
    conditions: dict[str, Any] = {d: {} for d in DEVICES}
    for device in delays:
        conditions[device]["netem"] = {"netem_dry_run": netem_dry_run, "netem_interface": "inf0"}
    meta = {
        "mode": "inventory",
        "scenario": {
            "name": "ch6_compare",
            "label": "ch6_compare[...]",
            "sweep_point": point,
            "document": document,
        },
        "runtime": {"name": block["name"], "block": block},
        "conditions": conditions,
    }
    # the driver writes metadata.json with sorted keys: the labels must not depend on the order
    (target / "metadata.json").write_text(json.dumps(meta, sort_keys=True), encoding="utf-8")
    if tokens_per_s is not None:
        (target / "aggregate").mkdir()
        values = [
            {"name": "tokens_per_s", "value": tokens_per_s, "unit": "1/s", "type": "float"},
            {"name": "token_latency_mean", "value": round(1e9 / tokens_per_s), "unit": "ns", "type": "int"},
        ]
        (target / "aggregate" / "summary.json").write_text(
            json.dumps({"runtime": block["name"], "tables": [], "values": values}), encoding="utf-8"
        )
    return target


def ch6_sweep(runs: Path, *, netem_dry_run: bool = True) -> Path:
    """4 runtime variants x added RTT 0, 5, 15 ms (half of it on each worker), plus one failed run."""
    n = 0
    for block, rates in RATES.values():
        for rtt_ms, rate in zip(RTTS, rates, strict=True):
            delays = {d: rtt_ms / 2 for d in DEVICES} if rtt_ms else {}
            fake_run(runs / f"run{n:02d}", block, delays, rate, netem_dry_run=netem_dry_run)
            n += 1
    # a second run of llama.cpp F32 at 5 ms that failed: counted, not plotted
    delays = {d: 2.5 for d in DEVICES}
    fake_run(runs / f"run{n:02d}", LC_F32, delays, None, netem_dry_run=netem_dry_run, state="failed")
    return runs


def test_series_per_runtime_variant_x_rtt_y_tokens_per_s(tmp_path: Path) -> None:
    runs = ch6_sweep(tmp_path / "ch6_compare")
    points = rtt.points(rtt.load_runs(sorted(runs.iterdir())))
    curves = rtt.series(points)
    assert list(curves) == list(RATES)
    for variant, (_block, rates) in RATES.items():
        assert curves[variant] == list(zip(RTTS, rates, strict=True)), variant
    failed = next(p for p in points if p.variant == "llamacpp-rpc (quant=F32)" and p.rtt_ms == 5.0)
    assert (failed.runs, failed.measured, failed.tokens_per_s) == (2, 1, 30.0)
    assert {p.netem for p in points if p.rtt_ms} == {rtt.RECORDED}
    assert {p.netem for p in points if not p.rtt_ms} == {rtt.NO_DELAY}
    # the figure plots exactly those series, with units on both axes
    ax = rtt_figure(curves).axes[0]
    plotted = {
        line.get_label(): list(
            zip(
                np.asarray(line.get_xdata(), float).tolist(),
                np.asarray(line.get_ydata(), float).tolist(),
                strict=True,
            )
        )
        for line in ax.lines
    }
    assert plotted == {v: list(zip(RTTS, r, strict=True)) for v, (_b, r) in RATES.items()}
    assert (ax.get_xlabel(), ax.get_ylabel()) == (RTT_AXIS, TOKENS_AXIS)
    assert "(ms)" in RTT_AXIS and "tokens/s" in TOKENS_AXIS


def test_sweep_report_has_the_section_the_table_and_says_recorded_not_applied(tmp_path: Path) -> None:
    runs = ch6_sweep(tmp_path / "ch6_compare")
    html = build_report(runs)
    section = html[html.index('<section id="rtt">') :]
    section = section[: section.index("</section>")]
    assert "Tokens/s against RTT" in section
    assert "recorded, not applied" in section
    assert "The added RTT of 9 of 13 runs was recorded, not applied" in section
    assert section.count("<img") == 1 and "data:image/png;base64," in section
    rows = re.findall(r"<tr>(.*?)</tr>", section, re.S)
    cells = [re.findall(r"<td>(.*?)</td>", r) for r in rows]
    cells = [c for c in cells if c]
    assert len(cells) == 12
    assert [
        "llamacpp-rpc (quant=Q8_0)",
        "15 ms (recorded, not applied)",
        "25.0 tokens/s",
        "40.0 ms",
        "1 of 1",
    ] in cells
    assert [
        "headsplit (strategy=layerwise, no speculation)",
        "0 ms",
        "12.0 tokens/s",
        "83.3 ms",
        "1 of 1",
    ] in cells
    assert [
        "llamacpp-rpc (quant=F32)",
        "5 ms (recorded, not applied)",
        "30.0 tokens/s",
        "33.3 ms",
        "1 of 2",
    ] in cells


def test_applied_rtt_is_not_called_recorded(tmp_path: Path) -> None:
    section = rtt_section(sorted(ch6_sweep(tmp_path / "ch6_compare", netem_dry_run=False).iterdir()))
    assert "recorded" not in section.note and "not applied" not in section.figures[0]["caption"]
    (table,) = section.tables
    assert ["llamacpp-rpc (quant=Q8_0)", "15 ms (applied)", "25.0 tokens/s", "40.0 ms", "1 of 1"] in table[
        "rows"
    ]


def test_unequal_delays_average_over_worker_pairs_and_other_axes_label_the_variant(tmp_path: Path) -> None:
    three = ["device1", "device2", "device3"]
    assert rtt.added_rtt_ms({"device1": {"delay_ms": 1}, "device2": {"delay_ms": 3}}, three) == (8 / 3, False)
    assert rtt.added_rtt_ms({"device1": {"delay_ms": 4}}, ["device1"]) == (4.0, True)
    varying = {
        "device1": {"variation": {"kind": "sine", "low_ms": 2, "high_ms": 6}},
        "device2": {"delay_ms": 4},
    }
    assert rtt.added_rtt_ms(varying, ["device1", "device2"]) == (8.0, True)
    assert rtt.workers_of({"name": "llamacpp-rpc", "controller": "device1"}, three) == ["device2", "device3"]
    run = fake_run(tmp_path / "r", LC_F32, {}, 10.0)
    meta = json.loads((run / "metadata.json").read_text())
    meta["scenario"]["sweep_point"].append(["hardware.device1.cpu_share_pct", 50])
    (run / "metadata.json").write_text(json.dumps(meta))
    (loaded,) = rtt.load_runs([run])
    assert loaded.variant == "llamacpp-rpc (hardware.device1.cpu_share_pct=50)"


def test_a_sweep_without_tokens_says_so(tmp_path: Path) -> None:
    runs = tmp_path / "plain"
    fake_run(runs / "a", {"name": "layers"}, {}, None)
    html = build_report(runs)
    assert "No run of this sweep reports tokens/s" in html


def test_rates_orders_of_magnitude_apart_go_on_a_log_axis() -> None:
    ax = rtt_figure({"headsplit": [(0.0, 9.0)], "llamacpp-rpc": [(0.0, 950.0)]}).axes[0]
    assert ax.get_yscale() == "log" and ax.get_ylabel() == TOKENS_AXIS + ", log scale"
    assert ax.get_xlim()[0] < 0.0 < ax.get_xlim()[1]  # one RTT: still an axis around it
    assert rtt_figure({"a": [(0.0, 9.0), (5.0, 20.0)]}).axes[0].get_yscale() == "linear"


def test_an_rtt_the_userspace_link_emulator_applied_says_so(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run", LC_F32, {d: 5.0 for d in DEVICES}, 20.0, netem_dry_run=False)
    meta = json.loads((run / "metadata.json").read_text())
    for device in DEVICES:
        meta["conditions"][device]["netem"]["netem_backend"] = "userspace"
    (run / "metadata.json").write_text(json.dumps(meta, sort_keys=True))
    assert rtt.load_run(run).netem == rtt.APPLIED_USERSPACE
