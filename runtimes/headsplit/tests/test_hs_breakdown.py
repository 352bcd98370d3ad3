"""``python -m headsplit.breakdown``: the median decode token's parts and its growth with the delay."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_hs_compare import SRC, fake_run


def _tokens(run: Path, totals: list[int]) -> None:
    """hs_tokens.csv with every part equal to a quarter of the token (comm, attention, FFN, controller)."""
    lines = ["token,total_ns,attention_ns,projection_ns,ffn_ns,comm_ns,controller_ns"]
    for index, total in enumerate(totals):
        q = total // 4
        lines.append(f"{index},{total},{q},0,{q},{q},{q}")
    (run / "aggregate" / "hs_tokens.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")


def breakdown(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "headsplit.breakdown", *args],
        env={"PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        check=False,
    )


def test_breakdown_prints_the_median_decode_token_and_the_slope_per_ms_of_delay(tmp_path: Path) -> None:
    for delay, totals in (
        (0.0, [900_000_000, 100_000_000, 120_000_000, 80_000_000]),
        (5.0, [1, 125_000_000]),
    ):
        block = {"strategy": "layerwise", "speculation": False, "control": "dataflow"}
        net = {"device1": {"delay_ms": delay}} if delay else {}
        name = f"layerwise-{delay:g}"
        fake_run(tmp_path, name, block, [["runtime", {"name": "headsplit", **block}], ["network", net]], 1.0)
        _tokens(tmp_path / "ch6" / name, totals)
    done = breakdown(str(tmp_path / "ch6"))
    assert done.returncode == 0, done.stderr
    # token 0 (the prefill, 900 ms) is left out: the median of 100, 120 and 80 ms
    assert "layerwise | dataflow | 0 | 100.0 | 25.0 (25 %)" in done.stdout
    assert "layerwise | dataflow | 10 | 125.0 |" in done.stdout
    assert "layerwise (dataflow): 5.00 ms/ms, 100.0 ms at +0" in done.stdout


def test_breakdown_names_the_run_without_token_records(tmp_path: Path) -> None:
    fake_run(tmp_path, "bare", {"strategy": "greedy"}, [], 1.0)
    done = breakdown(str(tmp_path / "ch6"))
    assert done.returncode == 2
    assert f"{tmp_path / 'ch6' / 'bare' / 'aggregate' / 'hs_tokens.csv'}: cannot be read" in done.stderr
