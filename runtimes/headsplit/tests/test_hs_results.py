"""The results parser: a hand-written results file -> aggregate/hs_*.csv and typed summary values.

No torch: the parser runs in the controller's dit venv. The files under data/ follow HEADSPLIT.md.
"""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from dit.analysis.run import LoadedRun  # noqa: E402
from dit.runtime_api.interface import write_summary  # noqa: E402
from headsplit.dit_runtime import HeadSplitResultsError, HeadSplitRuntime  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
START = 1_700_000_000_000_000_000
END = 1_700_000_000_078_000_000


def make_run(tmp_path: Path, results: str | dict[str, Any], controller: str = "edge") -> LoadedRun:
    run = tmp_path / "run"
    (run / "raw" / controller).mkdir(parents=True)
    (run / "scenario.yaml").write_text("name: hs\ndevices: [device1, device2]\n", encoding="utf-8")
    target = run / "raw" / controller / f"{controller}_headsplit.json"
    if isinstance(results, str):
        shutil.copy(DATA / results, target)
    else:
        target.write_text(json.dumps(results), encoding="utf-8")
    return LoadedRun(run)


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def values(results: Any) -> dict[str, tuple[Any, str, str]]:
    return {v.name: (v.value, v.unit, v.type) for v in results.summary}


def test_tables_and_summary_of_a_complete_run(tmp_path: Path) -> None:
    run = make_run(tmp_path, "results_ok.json")
    results = HeadSplitRuntime().parse_results(run)
    names = [p.name for p in results.tables]
    assert names == [
        "hs_tokens.csv",
        "hs_layers.csv",
        "hs_links.csv",
        "hs_memory.csv",
        "hs_replacements.csv",
        "hs_retries.csv",
        "hs_rtt.csv",
        "hs_placement.csv",
        "hs_generated.json",
    ]
    # a results file of before the costs were recorded: the units per worker, no rates nor source
    assert rows(run.aggregate_dir / "hs_placement.csv") == [
        {"worker": "worker1", "host": "device1", "heads": "1", "projections": "1", "ffns": "0",
         "head_flops_per_s": "", "proj_flops_per_s": "", "ffn_flops_per_s": "", "costs": ""},
        {"worker": "worker2", "host": "device2", "heads": "1", "projections": "0", "ffns": "1",
         "head_flops_per_s": "", "proj_flops_per_s": "", "ffn_flops_per_s": "", "costs": ""},
    ]  # fmt: skip
    # a seeded preset's byte-level ids are kept, not decoded
    assert json.loads((run.aggregate_dir / "hs_generated.json").read_text()) == {
        "model": "gpt2-tiny", "ids": [5, 17, 300, 42], "text": None}  # fmt: skip
    assert "generated_text" not in values(results)
    tokens = rows(run.aggregate_dir / "hs_tokens.csv")
    assert [t["token"] for t in tokens] == ["0", "1", "2", "3"]
    assert list(tokens[0]) == [
        "token", "token_id", "total_ns", "attention_ns", "projection_ns", "ffn_ns", "gather_ns",
        "broadcast_ns", "reexec_ns", "speculated", "accepted", "rejected", "bytes",
    ]  # fmt: skip
    assert (tokens[1]["total_ns"], tokens[1]["reexec_ns"]) == ("10000000", "400000")
    assert [(t["speculated"], t["accepted"], t["rejected"]) for t in tokens] == [
        ("0", "0", "0"),
        ("3", "2", "1"),
        ("3", "3", "0"),
        ("3", "2", "1"),
    ]
    assert [t["bytes"] for t in tokens] == ["2816", "3328", "3840", "4352"]
    layers = rows(run.aggregate_dir / "hs_layers.csv")
    assert [(r["token"], r["layer"], r["speculated"], r["accepted"]) for r in layers[:3]] == [
        ("1", "1", "1", "1"),
        ("1", "2", "1", "1"),
        ("1", "3", "1", "0"),
    ]
    assert len(layers) == 9
    links = rows(run.aggregate_dir / "hs_links.csv")
    assert len(links) == 16 and {"token": "3", "link": "worker1>worker2", "bytes": "2048"} in links
    memory = rows(run.aggregate_dir / "hs_memory.csv")
    assert memory[-1] == {"token": "3", "worker": "worker2", "bytes": "1003005"}
    assert rows(run.aggregate_dir / "hs_replacements.csv") == [
        {
            "token": "2",
            "worker": "worker2",
            "planning_ns": "800000",
            "migration_ns": "3000000",
            "moved_units": "4",
            "bytes": "150000",
        }
    ]
    (retry,) = rows(run.aggregate_dir / "hs_retries.csv")
    assert (retry["worker"], retry["call"], retry["attempt"]) == ("worker1", "heads", "1")
    rtt = rows(run.aggregate_dir / "hs_rtt.csv")
    assert len(rtt) == 20 and rtt[10] == {
        "worker": "worker2",
        "host": "device2",
        "sample": "0",
        "rtt_ns": "200000",
    }

    got = values(results)
    assert got["tokens_generated"] == (4, "", "int")
    # the shared LLM columns (docs/runtimes.md): 4 tokens over the 78 ms wall, prefill included; the prompt's
    # 8 tokens over token 0's 40 ms; the 3 tokens after it over their 10 + 12 + 14 ms
    assert got["tokens_per_s"] == (pytest.approx(4 / 0.078), "1/s", "float")
    assert got["prompt_tokens_per_s"] == (pytest.approx(8 / 0.040), "1/s", "float")
    assert got["generation_tokens_per_s"] == (pytest.approx(3 / 0.036), "1/s", "float")
    # decode tokens only (token 0 is the prefill): 10, 12, 14 ms
    assert got["token_latency_mean"] == (12_000_000, "ns", "int")
    assert got["token_latency_p50"] == (12_000_000, "ns", "int")
    assert got["token_latency_p99"] == (14_000_000, "ns", "int")
    assert got["prefill_latency"] == (40_000_000, "ns", "int")
    assert got["attention_share"][0] == pytest.approx(100 * 35 / 76)
    assert got["projection_share"][0] == pytest.approx(100 * 7 / 76)
    assert got["ffn_share"][:2] == (pytest.approx(100 * 24 / 76), "%")
    assert got["speculation_acceptance"][:2] == (pytest.approx(100 * 7 / 9), "%")
    assert (got["reexecutions"][0], got["replacements"][0], got["retries"][0]) == (2, 1, 1)
    assert got["migration_bytes"] == (150000, "B", "int")
    assert got["bytes_total"] == (14336, "B", "int")
    assert got["bytes_per_token"] == (3584.0, "B", "float")
    assert got["placement_planning"] == (1234567, "ns", "int")
    assert "oom_token" not in got and "energy_per_token" not in got  # no power trace in this run
    summary = json.loads(write_summary(run.aggregate_dir, "headsplit", results).read_text(encoding="utf-8"))
    assert summary["tables"][0] == "hs_tokens.csv"


def test_a_trained_model_s_ids_are_decoded_by_its_tokenizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """smollm2-135m (issue 32, item 3): the results carry the ids and their text, decoded here by the
    model's own tokenizer (stubbed: the real one is the slow test's)."""
    from headsplit.plugin import launch

    class Tok:
        def decode(self, ids: list[int]) -> str:
            return " Paris" if ids == [5, 17, 300, 42] else "?"

    monkeypatch.setattr(launch, "model_tokenizer", lambda model: Tok())
    run = make_run(tmp_path, "results_ok.json")
    (run.path / "scenario.yaml").write_text(
        "name: hs\ndevices: [device1, device2]\nruntime: {name: headsplit, model: smollm2-135m}\n"
    )
    results = HeadSplitRuntime().parse_results(run)
    assert values(results)["generated_text"] == (" Paris", "", "str")
    got = json.loads((run.aggregate_dir / "hs_generated.json").read_text())
    assert got == {"model": "smollm2-135m", "ids": [5, 17, 300, 42], "text": " Paris"}


QUALITY = {
    "perplexity": 17.25, "nll_mean": 2.8478, "tokens": 119, "paragraph_tokens": 120, "paragraph_sha256": "ab" * 32,
    "tokenizer": "model", "speculation": True, "tau": 0.3, "speculated": 3451, "accepted": 2700,
    "elapsed_ns": 5_000_000_000,
}  # fmt: skip


def test_the_held_out_perplexity_is_a_table_and_a_summary_value(tmp_path: Path) -> None:
    """``perplexity: true`` (issue 32, item 6): the controller's section becomes hs_quality.json and
    the summary value ``perplexity``; a run without the section has neither."""
    doc = json.loads((DATA / "results_ok.json").read_text(encoding="utf-8"))
    run = make_run(tmp_path, {**doc, "perplexity": QUALITY})
    (run.path / "scenario.yaml").write_text(
        "name: hs\ndevices: [device1, device2]\nruntime: {name: headsplit, model: llama-tiny}\n"
    )
    results = HeadSplitRuntime().parse_results(run)
    assert values(results)["perplexity"] == (17.25, "", "float")
    assert [p.name for p in results.tables][-1] == "hs_quality.json"
    got = json.loads((run.aggregate_dir / "hs_quality.json").read_text())
    assert got == {"model": "llama-tiny", **{k: v for k, v in QUALITY.items() if k != "elapsed_ns"}}
    plain = HeadSplitRuntime().parse_results(make_run(tmp_path / "plain", "results_ok.json"))
    assert "perplexity" not in values(plain)
    assert not (tmp_path / "plain" / "run" / "aggregate" / "hs_quality.json").exists()


def test_one_token_has_no_decode_columns_rather_than_the_prefill_s(tmp_path: Path) -> None:
    doc = json.loads((DATA / "results_ok.json").read_text(encoding="utf-8"))
    doc["tokens"], doc["tokens_generated"] = doc["tokens"][:1], 1
    del doc["prompt_tokens"]  # a results file from before it was recorded: no prompt rate
    got = values(HeadSplitRuntime().parse_results(make_run(tmp_path, doc)))
    assert got["tokens_per_s"][0] == pytest.approx(1 / 0.078) and got["prefill_latency"][0] == 40_000_000
    for name in ("token_latency_mean", "token_latency_p50", "generation_tokens_per_s", "prompt_tokens_per_s"):
        assert name not in got


def test_an_out_of_memory_run_is_a_result(tmp_path: Path) -> None:
    run = make_run(tmp_path, "results_oom.json")
    got = values(HeadSplitRuntime().parse_results(run))
    assert got["oom_token"] == (2, "", "int")
    assert got["oom_worker"] == ("worker2", "", "str")
    assert got["tokens_generated"] == (2, "", "int")
    assert (got["replacements"][0], got["retries"][0]) == (0, 0)
    assert len(rows(run.aggregate_dir / "hs_tokens.csv")) == 2


def power_trace(
    run: LoadedRun, host: str, watts: float, origin_wall: int, origin_mono: int, shift_ns: int = 0
) -> None:
    folder = run.path / "raw" / host
    folder.mkdir(parents=True, exist_ok=True)
    # samples every 10 ms from 20 ms before the generation to 20 ms after, on the node's monotonic clock
    first = START - origin_wall + origin_mono - 20_000_000 + shift_ns
    lines = ["t_mono_ns,current_a,voltage_v,power_w"]
    lines += [f"{first + k * 10_000_000},1,5,{watts}" for k in range(13)]
    (folder / f"{host}_power.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / f"{host}_power.json").write_text(
        json.dumps({"origin_wall_ns": origin_wall, "origin_mono_ns": origin_mono, "sensor": "fake"}),
        encoding="utf-8",
    )


def test_energy_per_token_and_edp_from_the_power_traces(tmp_path: Path) -> None:
    run = make_run(tmp_path, "results_ok.json")
    power_trace(run, "edge", 2.0, START - 5_000_000_000, 1_000)  # clocks of the nodes differ
    power_trace(run, "device1", 4.0, START - 1_000_000_000, 7_000_000)
    got = values(HeadSplitRuntime().parse_results(run))
    energy = 0.078 * (2.0 + 4.0)  # device2 has no trace
    assert got["energy"] == (pytest.approx(energy), "J", "float")
    assert got["energy_per_token"] == (pytest.approx(energy / 4), "J", "float")
    assert got["edp"] == (pytest.approx(energy * 0.078), "J*s", "float")


def test_a_generation_outside_a_power_trace_gets_no_energy(tmp_path: Path) -> None:
    run = make_run(tmp_path, "results_ok.json")
    power_trace(run, "device1", 4.0, START, 0, shift_ns=10_000_000_000)  # the trace starts 10 s later
    assert "energy" not in values(HeadSplitRuntime().parse_results(run))


def broken(change: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DATA / "results_ok.json").read_text(encoding="utf-8"))
    if change == "missing":
        del doc["tokens"][2]["ffn_ns"]
    elif change == "float":
        doc["tokens"][1]["gather_ns"] = 1.5
    elif change == "links":
        doc["tokens"][0]["bytes"] = [1, 2]
    elif change == "oom":
        doc["oom"] = {"token": 3}
    elif change == "rate":
        del doc["tokens_per_s"]
    elif change == "memory":
        doc["memory"][1]["bytes"] = "many"
    elif change == "perplexity":
        doc["perplexity"] = {**QUALITY, "perplexity": "low"}
    elif change == "perplexity-tokens":
        doc["perplexity"] = {k: v for k, v in QUALITY.items() if k != "tokens"}
    return doc


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("missing", "tokens[2].ffn_ns: is missing"),
        ("float", "tokens[1].gather_ns: 1.5 is not an integer"),
        ("links", "tokens[0].bytes: [1, 2] is not a mapping"),
        ("oom", "oom.worker: is missing"),
        ("rate", "tokens_per_s: is missing"),
        ("memory", "memory[1].bytes: 'many' is not an integer"),
        ("perplexity", "perplexity.perplexity: 'low' is not a number"),
        ("perplexity-tokens", "perplexity.tokens: is missing"),
    ],
)
def test_a_malformed_results_file_is_refused_naming_the_field(
    change: str, message: str, tmp_path: Path
) -> None:
    run = make_run(tmp_path, broken(change))
    with pytest.raises(HeadSplitResultsError) as info:
        HeadSplitRuntime().parse_results(run)
    assert str(info.value).endswith(message)
    assert "edge_headsplit.json" in str(info.value)


def test_no_results_file_says_where_it_looked(tmp_path: Path) -> None:
    run = make_run(tmp_path, "results_ok.json", controller="device3")
    (run.path / "raw" / "device3" / "device3_headsplit.json").unlink()
    with pytest.raises(HeadSplitResultsError, match=r"no raw/<host>/<host>_headsplit.json"):
        HeadSplitRuntime().parse_results(run)
    (run.path / "raw" / "device3" / "device3_headsplit.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(HeadSplitResultsError, match="not JSON"):
        HeadSplitRuntime().parse_results(run)


def test_the_placement_its_costs_and_its_predicted_time_are_recorded(tmp_path: Path) -> None:
    """A run placed with a profile run's costs: hs_placement.csv gives each worker its units and the
    rates it was costed at, the summary where they came from and the predicted time per token."""
    doc = json.loads((DATA / "results_ok.json").read_text(encoding="utf-8"))
    doc["workers"][0]["placement_flops_per_s"] = {"head": 1e8, "proj": 2e8, "ffn": 3e8}
    doc["workers"][1]["placement_flops_per_s"] = {"head": 4e8, "proj": 5e8, "ffn": 6e8}
    doc["placement"].update(
        units={"L0.head0": "worker2", "L0.head1": "worker2", "L0.proj": "worker2", "L0.ffn": "worker2"},
        predicted_token_s=0.0125,
        context_tokens=12,
        costs={"source": "profile", "path": "/runs/profiles/r1", "run_id": "profiles-r1", "model": None,
               "file": "aggregate/heads.csv", "rule": "...", "kinds": {}},
    )  # fmt: skip
    run = make_run(tmp_path, doc)
    results = HeadSplitRuntime().parse_results(run)
    assert rows(run.aggregate_dir / "hs_placement.csv") == [
        {"worker": "worker1", "host": "device1", "heads": "0", "projections": "0", "ffns": "0",
         "head_flops_per_s": "100000000.0", "proj_flops_per_s": "200000000.0", "ffn_flops_per_s": "300000000.0",
         "costs": "profile profiles-r1"},
        {"worker": "worker2", "host": "device2", "heads": "2", "projections": "1", "ffns": "1",
         "head_flops_per_s": "400000000.0", "proj_flops_per_s": "500000000.0", "ffn_flops_per_s": "600000000.0",
         "costs": "profile profiles-r1"},
    ]  # fmt: skip
    got = values(results)
    assert got["placement_predicted_token"] == (12_500_000, "ns", "int")
    assert got["placement_costs"] == ("profile profiles-r1", "", "str")
    doc["placement"]["costs"] = {"source": "guesswork"}
    with pytest.raises(
        HeadSplitResultsError, match=r"placement\.costs\.source: is not one of micro-benchmark, profile"
    ):
        HeadSplitRuntime().parse_results(make_run(tmp_path / "bad", doc))


def test_the_control_is_a_summary_value(tmp_path: Path) -> None:
    """Issue 47: how the run drove its tokens reaches the summary; an older results file (rpc, before
    the field) has none rather than a guess."""
    doc = json.loads((DATA / "results_ok.json").read_text(encoding="utf-8"))
    assert "control" not in values(HeadSplitRuntime().parse_results(make_run(tmp_path / "old", doc)))
    for control in ("dataflow", "rpc"):
        got = values(
            HeadSplitRuntime().parse_results(make_run(tmp_path / control, {**doc, "control": control}))
        )
        assert got["control"] == (control, "", "str")
