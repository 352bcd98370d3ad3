"""Placement costs from a profile run (issue 35, item 3): the rates read from a profile run directory,
the costs document shipped to the controller, and the placement that follows them.

No torch, except the controller's config test (skipped without it).
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))
TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from profile_run import write_profile_run  # noqa: E402

from dit.analysis.tokens import HEADS_AGGREGATE  # noqa: E402
from headsplit import profile_costs  # noqa: E402
from headsplit.config import preset  # noqa: E402
from headsplit.placement import WorkerSpec, estimate_token_s, kv_flops, place, unit_flops  # noqa: E402
from headsplit.profile_costs import (  # noqa: E402
    ProfileError,
    costs_document,
    costs_from_document,
    device_problem,
    read_profile,
)
from headsplit.units import Unit  # noqa: E402

GB = 1_000_000_000


def heads_per_worker(placement: dict[Unit, str]) -> Counter[str]:
    return Counter(w for u, w in placement.items() if u.kind == "head")


def test_the_columns_read_are_the_ones_the_run_aggregation_writes() -> None:
    assert profile_costs.COLUMNS == HEADS_AGGREGATE


def test_rates_are_each_kinds_flops_over_its_time_in_the_decode_rows(tmp_path: Path) -> None:
    run = write_profile_run(tmp_path / "run", {"device1": 4.0, "device2": 1.0})
    profile = read_profile(run)
    assert profile.path == str(run.resolve())
    assert profile.run_id == "profiles-20261205-000000-abcdef12-0011"
    assert profile.model == {
        "name": "hf_decoder",
        "params": {"family": "llama", "num_layers": 2, "prompt_len": 4},
    }
    assert list(profile.devices) == ["device1", "device2"]
    with (run / "aggregate" / "heads.csv").open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    for device in ("device1", "device2"):
        for unit, kind in (("head", "head"), ("projection", "proj"), ("ffn", "ffn")):
            mine = [r for r in rows if r["host"] == device and r["unit"] == unit and int(r["token"]) > 0]
            cost = profile.devices[device][kind]
            assert cost.rows == len(mine) > 0  # the prefill (token 0) is left out
            assert cost.flops_per_s == pytest.approx(
                sum(2 * int(r["ops"]) for r in mine) / sum(int(r["latency_ns"]) * 1e-9 for r in mine)
            )
            assert cost.median_latency_ns == statistics.median(int(r["latency_ns"]) for r in mine)
            assert cost.median_unit_flops == statistics.median(2 * int(r["ops"]) for r in mine)
    # the device profiled 4x slower runs every kind at a quarter of the rate
    for kind in ("head", "proj", "ffn"):
        ratio = profile.devices["device2"][kind].flops_per_s / profile.devices["device1"][kind].flops_per_s
        assert ratio == pytest.approx(4.0, rel=0.01)
    # one multiply-accumulate = 2 FLOPs: the profile's projection is headsplit's llama-tiny projection
    assert profile.devices["device1"]["proj"].median_unit_flops == unit_flops(
        preset("llama-tiny"), Unit(0, "proj"), 0
    )


def test_a_quotas_stalls_in_a_few_rows_slow_the_rate_not_the_median(tmp_path: Path) -> None:
    """Under a CPU quota a few units hold a whole stall: the rate counts them (the median would not)."""
    run = write_profile_run(tmp_path / "run", {"device1": 1.0, "device2": 1.0}, stall_ns={"device1": 500_000})
    profile = read_profile(run)
    heads = {d: profile.devices[d]["head"] for d in ("device1", "device2")}
    # a fifth of the rows stalled: the median moves by a few percent, the rate by 70 times
    assert heads["device1"].median_latency_ns == pytest.approx(heads["device2"].median_latency_ns, rel=0.05)
    assert heads["device1"].mean_latency_ns > heads["device2"].mean_latency_ns
    assert heads["device1"].flops_per_s < heads["device2"].flops_per_s / 2


def test_a_device_profiled_slower_gets_fewer_heads(tmp_path: Path) -> None:
    """device1 profiled 4x slower than device2: its worker gets fewer heads under greedy, fewer layers
    under layerwise; with the micro-benchmark's equal rates worker1 gets at least as many (ties go to
    the first name), so the profile is what turns it round."""
    profile = read_profile(write_profile_run(tmp_path / "run", {"device1": 4.0, "device2": 1.0}))
    cfg = preset("tinyllama-half")
    hosts = {"worker1": "device1", "worker2": "device2"}

    def specs(costed: bool) -> list[WorkerSpec]:
        return [
            WorkerSpec(w, 4 * GB, 1e9, 1_000_000, profile.rates(d) if costed else None)
            for w, d in hosts.items()
        ]

    even = heads_per_worker(place(cfg, specs(False), "greedy", context_tokens=64))
    assert even["worker1"] >= even["worker2"], even
    costed = place(cfg, specs(True), "greedy", context_tokens=64)
    heads = heads_per_worker(costed)
    assert heads["worker1"] < heads["worker2"], heads
    layered = Counter(
        w for u, w in place(cfg, specs(True), "layerwise", context_tokens=64).items() if u.kind == "ffn"
    )
    assert layered["worker1"] < layered["worker2"], layered
    # the cost model predicts less time for the placement made with these costs than for the even one
    even_placement = place(cfg, specs(False), "greedy", context_tokens=64)
    assert estimate_token_s(cfg, specs(True), costed, context_tokens=64) < estimate_token_s(
        cfg, specs(True), even_placement, context_tokens=64
    )


def test_the_cost_model_runs_each_kind_at_its_own_rate() -> None:
    """One worker, no communication: a token is every unit's FLOPs over its kind's rate (KV copies at
    the head rate), by hand."""
    cfg = preset("llama-tiny")
    rates = (1e8, 2e9, 4e9)
    spec = WorkerSpec("worker1", 4 * GB, 1.0, 0, rates)
    placement = dict.fromkeys(place(cfg, [spec], "greedy", context_tokens=10), "worker1")
    head = unit_flops(cfg, Unit(0, "head", 0), 10)
    by_hand = cfg.n_layers * (
        (cfg.n_heads * head + cfg.n_kv_heads * kv_flops(cfg)) / rates[0]
        + unit_flops(cfg, Unit(0, "proj"), 10) / rates[1]
        + unit_flops(cfg, Unit(0, "ffn"), 10) / rates[2]
    )
    hidden_s = 4 * cfg.hidden / 12.5e6  # X from the controller to layer 0, the last X back to it
    assert estimate_token_s(cfg, [spec], placement, context_tokens=10) == pytest.approx(
        by_hand + 2 * hidden_s
    )
    with pytest.raises(
        ValueError, match=r"workers\[0\]\.unit_flops_per_s\.proj \(worker1\) must be a finite"
    ):
        place(cfg, [WorkerSpec("worker1", GB, 1.0, 0, (1.0, 0.0, 1.0))], "greedy", context_tokens=1)


def test_the_costs_document_round_trips_and_names_a_bad_field(tmp_path: Path) -> None:
    profile = read_profile(write_profile_run(tmp_path / "run", {"device1": 2.0, "device2": 1.0}))
    doc = costs_document(profile, ["device2", "device1"])
    assert list(doc["devices"]) == ["device2", "device1"]  # worker order
    assert doc["source"] == {"path": profile.path, "run_id": profile.run_id, "model": profile.model,
                             "file": "aggregate/heads.csv"}  # fmt: skip
    back = costs_from_document(json.loads(json.dumps(doc)))
    assert back.rates("device1") == profile.rates("device1") and back.run_id == profile.run_id
    doc["devices"]["device1"]["ffn"]["flops_per_s"] = -1
    with pytest.raises(
        ProfileError, match=r"placement_profile\.devices\.device1\.ffn\.flops_per_s: expected"
    ):
        costs_from_document(doc)
    with pytest.raises(ProfileError, match="not a placement costs document"):
        costs_from_document({"devices": {}})


def test_devices_must_be_the_runs_workers(tmp_path: Path) -> None:
    profile = read_profile(write_profile_run(tmp_path / "run", {"device1": 2.0, "device2": 1.0}))
    assert device_problem(profile, ["device1", "device2"]) is None
    assert device_problem(profile, ["device1"]) == (
        f"{profile.path} profiles device2, not a worker of this run (workers: device1); profile the run's workers"
    )
    assert device_problem(profile, ["device1", "device2", "device3"]) == (
        f"{profile.path} has no profile of device3 (profiled: device1, device2)"
    )
    with pytest.raises(ProfileError, match="has no profile of device3"):
        costs_document(profile, ["device1", "device2", "device3"])


def test_a_directory_that_is_no_profile_run_is_named(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=rf"{tmp_path / 'none'}: not a directory"):
        read_profile(tmp_path / "none")
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        ProfileError, match=rf"{tmp_path / 'empty' / 'aggregate' / 'heads.csv'}: missing; a profile"
    ):
        read_profile(tmp_path / "empty")
    run = write_profile_run(tmp_path / "run", {"device1": 1.0})
    heads = run / "aggregate" / "heads.csv"
    lines = heads.read_text(encoding="utf-8").splitlines()
    rows = [line for line in lines[1:] if ",ffn," not in line]
    heads.write_text("\n".join([lines[0], *rows]) + "\n", encoding="utf-8")
    with pytest.raises(ProfileError, match=rf"{heads}: device1 has no decode rows \(token > 0\) of unit ffn"):
        read_profile(run)
    heads.write_text(f"{lines[0]}\ndevice1,0,1,0,head,0,x,100,5\n", encoding="utf-8")
    with pytest.raises(ProfileError, match=rf"{heads}:2: latency_ns 'x' is not an integer"):
        read_profile(run)
    heads.write_text("host,token\ndevice1,1\n", encoding="utf-8")
    with pytest.raises(
        ProfileError, match=r"missing column\(s\) rep, layer, unit, head, latency_ns, ops, kv_len"
    ):
        read_profile(run)


def test_the_controller_reads_the_costs_file_beside_its_config(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from headsplit.controller import ConfigError, load_run_config

    profile = read_profile(write_profile_run(tmp_path / "run", {"device1": 2.0, "device2": 1.0}))
    node = tmp_path / "node"
    node.mkdir()
    (node / "placement-costs.json").write_text(json.dumps(costs_document(profile, ["device1", "device2"])))
    config = {
        "model": {"preset": "llama-tiny"},
        "controller": {"address": "127.0.0.1", "port": 29500},
        "workers": [{"rank": 1, "host": "device1", "address": "127.0.0.1"},
                    {"rank": 2, "host": "device2", "address": "127.0.0.1"}],
        "tokens": 2,
        "placement_profile": "placement-costs.json",
    }  # fmt: skip
    (node / "headsplit.json").write_text(json.dumps(config))
    rc = load_run_config(node / "headsplit.json")
    assert rc.placement_costs is not None and rc.placement_costs.rates("device2") == profile.rates("device2")
    config["workers"][1]["host"] = "device3"  # type: ignore[index]
    (node / "headsplit.json").write_text(json.dumps(config))
    with pytest.raises(
        ConfigError, match=r"placement_profile: .* has no costs of workers\[1\]\.host 'device3'"
    ):
        load_run_config(node / "headsplit.json")
    (node / "placement-costs.json").unlink()
    with pytest.raises(ConfigError, match=r"placement_profile: .*placement-costs\.json: .*No such file"):
        load_run_config(node / "headsplit.json")
