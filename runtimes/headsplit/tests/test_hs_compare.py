"""``python -m headsplit.compare``: speedup over the layerwise variant with the same other sweep values."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"


def fake_run(
    root: Path,
    name: str,
    block: dict[str, Any],
    point: list[Any],
    rate: float,
    oom: int | None = None,
    conditions: dict[str, Any] | None = None,
) -> None:
    run = root / "ch6" / name
    (run / "aggregate").mkdir(parents=True)
    meta = {
        "scenario": {"label": f"ch6[{name}]", "sweep_point": point},
        "runtime": {"name": "headsplit", "version": "0.1.0", "block": {"name": "headsplit", **block}},
        "conditions": conditions or {},
    }
    (run / "metadata.json").write_text(json.dumps(meta), encoding="utf-8")
    values = [{"name": "tokens_per_s", "value": rate, "unit": "1/s", "type": "float"}]
    if oom is not None:
        values.append({"name": "oom_token", "value": oom, "unit": "", "type": "int"})
    (run / "aggregate" / "summary.json").write_text(json.dumps({"values": values}), encoding="utf-8")


def sweep(root: Path) -> None:
    net0: dict[str, Any] = {}
    net5 = {"device1": {"delay_ms": 2.5}}
    for rtt, net, rates in (("0", net0, (4.0, 5.0, 6.0)), ("5", net5, (2.0, 2.5, None))):
        for strategy, speculation, rate in zip(
            ("layerwise", "roundrobin", "greedy"), (False, False, True), rates, strict=True
        ):
            block = {"strategy": strategy, "speculation": speculation, "model": "gpt2-tiny"}
            point = [["runtime", {"name": "headsplit", **block}], ["network", net]]
            if rate is None:
                fake_run(root, f"{strategy}-{rtt}", block, point, 0.5, oom=7)
            else:
                fake_run(root, f"{strategy}-{rtt}", block, point, rate)


def run_compare(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "headsplit.compare", *args],
        env={"PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        check=False,
    )


def test_speedups_are_over_the_layerwise_run_of_the_same_rtt(tmp_path: Path) -> None:
    sweep(tmp_path)
    done = run_compare("--json", str(tmp_path))
    assert done.returncode == 0, done.stderr
    got = {Path(r["run"]).name: (r["speedup"], r["oom_token"]) for r in json.loads(done.stdout)}
    assert got == {
        "layerwise-0": (1.0, None),
        "roundrobin-0": (1.25, None),
        "greedy-0": (1.5, None),
        "layerwise-5": (1.0, None),
        "roundrobin-5": (1.25, None),
        "greedy-5": (None, 7),  # out of memory: no speedup
    }
    table = run_compare(str(tmp_path / "ch6" / "greedy-0"), str(tmp_path / "ch6" / "layerwise-0")).stdout
    assert table.splitlines()[0].split() == [
        "variant", "strategy", "speculation", "control", "network", "tokens/s", "speedup", "agreement",
        "perplexity",
    ]  # fmt: skip
    assert [line.split() for line in table.splitlines()[1:]] == [
        [
            "ch6[greedy-0]",
            "greedy",
            "yes",
            "rpc",  # a run of before the control field
            "none",
            "6.00",
            "1.50x",
            "-",
            "-",
        ],  # no hs_generated.json: no agreement; no hs_quality.json: no perplexity
        ["ch6[layerwise-0]", "layerwise", "no", "rpc", "none", "4.00", "1.00x", "-", "-"],
    ]


def test_the_table_names_what_applied_the_added_rtt(tmp_path: Path) -> None:
    """The link emulator, netem, or only recorded (an RTT column that measured no added delay)."""
    block = {"strategy": "layerwise", "speculation": False}
    emulated = {"device1": {"netem": {"netem_backend": "userspace", "netem_dry_run": True}}}
    recorded = {"device1": {"netem": {"netem_backend": "netem", "netem_dry_run": True}}}
    both = {**emulated, "device2": {"netem": {"netem_backend": "auto", "netem_dry_run": False}}}
    for name, conditions in (("emulated", emulated), ("recorded", recorded), ("both", both)):
        fake_run(tmp_path, name, block, [["network", name]], 1.0, conditions=conditions)
    done = run_compare("--json", str(tmp_path))
    assert done.returncode == 0, done.stderr
    got = {Path(r["run"]).name: r["network"] for r in json.loads(done.stdout)}
    assert got == {"emulated": "userspace", "recorded": "recorded", "both": "netem+userspace"}


def test_a_sweep_without_layerwise_has_no_speedup_and_bad_input_is_named(tmp_path: Path) -> None:
    fake_run(tmp_path, "tau0", {"strategy": "greedy", "tau": 0}, [["runtime.tau", 0]], 3.0)
    done = run_compare("--json", str(tmp_path))
    assert json.loads(done.stdout)[0]["speedup"] is None
    (tmp_path / "ch6" / "tau0" / "metadata.json").write_text("{", encoding="utf-8")
    broken = run_compare(str(tmp_path))
    assert broken.returncode == 2 and "metadata.json: not JSON" in broken.stderr


def test_agreement_with_the_exact_run_of_the_same_model_and_prompt(tmp_path: Path) -> None:
    """Fidelity for tau > 0 (issue 32, item 6): ids against the tau = 0 run's, per position."""
    for tau, ids in ((0, [1, 2, 3, 4]), (0.05, [1, 2, 9, 4]), (0.3, [1, 7])):
        block = {"strategy": "greedy", "speculation": True, "tau": tau, "model": "smollm2-135m", "tokens": 4}
        fake_run(tmp_path, f"tau{tau}", block, [["runtime.tau", tau]], 3.0)
        gen = tmp_path / "ch6" / f"tau{tau}" / "aggregate" / "hs_generated.json"
        gen.write_text(json.dumps({"model": "smollm2-135m", "ids": ids, "text": None}), encoding="utf-8")
    done = run_compare("--json", str(tmp_path))
    assert done.returncode == 0, done.stderr
    got = {Path(r["run"]).name: (r["agreement"], r["first_difference"]) for r in json.loads(done.stdout)}
    assert got == {"tau0": (1.0, None), "tau0.05": (0.75, 2), "tau0.3": (0.25, 1)}
    assert run_compare(str(tmp_path)).stdout.splitlines()[2].split()[-2] == "75.0%"


def test_the_perplexity_column_reads_hs_quality_json(tmp_path: Path) -> None:
    """The other side of fidelity (issue 32, item 6): the held-out paragraph's perplexity per run, "-"
    for a run that did not measure it; a malformed file is named."""
    for tau, ppl in ((0, 9.5), (0.3, 12.25), (0.05, None)):
        block = {"strategy": "greedy", "speculation": True, "tau": tau, "model": "smollm2-135m", "tokens": 4}
        fake_run(tmp_path, f"tau{tau}", block, [["runtime.tau", tau]], 3.0)
        if ppl is not None:
            quality = tmp_path / "ch6" / f"tau{tau}" / "aggregate" / "hs_quality.json"
            quality.write_text(json.dumps({"model": "smollm2-135m", "perplexity": ppl, "tau": tau}))
    done = run_compare("--json", str(tmp_path))
    assert done.returncode == 0, done.stderr
    got = {Path(r["run"]).name: r["perplexity"] for r in json.loads(done.stdout)}
    assert got == {"tau0": 9.5, "tau0.3": 12.25, "tau0.05": None}
    table = run_compare(str(tmp_path)).stdout.splitlines()
    assert table[0].split()[-1] == "perplexity"
    assert {line.split()[0]: line.split()[-1] for line in table[1:]} == {
        "ch6[tau0]": "9.500", "ch6[tau0.05]": "-", "ch6[tau0.3]": "12.250"
    }  # fmt: skip
    (tmp_path / "ch6" / "tau0" / "aggregate" / "hs_quality.json").write_text('{"perplexity": "low"}')
    broken = run_compare(str(tmp_path))
    assert broken.returncode == 2 and "hs_quality.json: perplexity: 'low' is not a number" in broken.stderr


def test_both_controls_side_by_side_each_over_its_own_layerwise_run(tmp_path: Path) -> None:
    """Issue 47: a sweep over the control groups each control's strategies with that control's
    layer-wise run, and the table names the control (the summary's value)."""
    for control, rates in (("rpc", (2.0, 3.0)), ("dataflow", (4.0, 8.0))):
        for strategy, rate in zip(("layerwise", "greedy"), rates, strict=True):
            block = {"strategy": strategy, "speculation": False, "control": control}
            fake_run(
                tmp_path, f"{strategy}-{control}", block, [["runtime", {"name": "headsplit", **block}]], rate
            )
            summary = tmp_path / "ch6" / f"{strategy}-{control}" / "aggregate" / "summary.json"
            doc = json.loads(summary.read_text(encoding="utf-8"))
            doc["values"].append({"name": "control", "value": control, "unit": "", "type": "str"})
            summary.write_text(json.dumps(doc), encoding="utf-8")
    done = run_compare("--json", str(tmp_path))
    assert done.returncode == 0, done.stderr
    got = {Path(r["run"]).name: (r["control"], r["speedup"]) for r in json.loads(done.stdout)}
    assert got == {
        "layerwise-rpc": ("rpc", 1.0),
        "greedy-rpc": ("rpc", 1.5),
        "layerwise-dataflow": ("dataflow", 1.0),
        "greedy-dataflow": ("dataflow", 2.0),
    }
