"""HeadSplit memory tracking: per-token samples, the 85 % trigger, and the placement's prediction.

Pure Python (no torch): runs in CI's default phase.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from headsplit import memory as mem
from headsplit import worker
from headsplit.config import preset
from headsplit.memory import MemoryTracker, crossing_token, predict, squeeze
from headsplit.placement import WorkerSpec, place, worker_bytes
from headsplit.units import Unit, all_units


def test_tracker_flags_a_worker_above_85_percent_of_its_limit() -> None:
    tracker = MemoryTracker({"worker1": 1000, "worker2": 2000})
    assert tracker.over_threshold() == []
    tracker.record(0, "worker1", 850)  # exactly 85 %: not above
    tracker.record(0, "worker2", 100)
    assert tracker.over_threshold() == []
    assert not tracker.needs_replacement("worker1")
    tracker.record(1, "worker1", 851)
    assert tracker.needs_replacement("worker1")
    assert tracker.over_threshold() == ["worker1"]
    tracker.record(2, "worker2", 1900)
    assert tracker.over_threshold() == ["worker1", "worker2"]
    # after a re-placement the next sample decides
    tracker.record(3, "worker1", 400)
    assert tracker.over_threshold() == ["worker2"]
    assert tracker.latest("worker1") == 400 and tracker.peak("worker1") == 851
    assert tracker.latest("worker3") is None


def test_threshold_is_configurable() -> None:
    tracker = MemoryTracker({"worker1": 1000}, threshold=0.5)
    tracker.record(0, "worker1", 501)
    assert tracker.over_threshold() == ["worker1"]
    with pytest.raises(ValueError, match=r"threshold must be in \(0, 1\]"):
        MemoryTracker({"worker1": 1000}, threshold=1.5)


def test_tracker_keeps_the_series_for_the_results_file() -> None:
    tracker = MemoryTracker({"worker1": 10**9, "worker2": 10**9})
    for token in range(3):
        tracker.record(token, "worker1", 100 + token)
        tracker.record(token, "worker2", 200 + token)
    assert tracker.to_json()[:3] == [
        {"token": 0, "worker": "worker1", "bytes": 100},
        {"token": 0, "worker": "worker2", "bytes": 200},
        {"token": 1, "worker": "worker1", "bytes": 101},
    ]
    assert len(tracker.samples) == 6


def test_tracker_rejects_bad_input_naming_it() -> None:
    with pytest.raises(ValueError, match=r"limits\['worker1'\] must be > 0 bytes"):
        MemoryTracker({"worker1": 0})
    with pytest.raises(ValueError, match="at least one worker"):
        MemoryTracker({})
    tracker = MemoryTracker({"worker1": 1000})
    with pytest.raises(ValueError, match="'worker9' has no limit"):
        tracker.record(0, "worker9", 1)
    with pytest.raises(ValueError, match="bytes for worker1 at token 4 must be >= 0"):
        tracker.record(4, "worker1", -1)
    with pytest.raises(ValueError, match="'worker9' has no limit"):
        tracker.needs_replacement("worker9")


def test_predict_is_the_placement_memory_model() -> None:
    cfg = preset("llama-tiny")
    ws = [WorkerSpec(f"worker{i}", 10**8, 1e9, 1_000_000) for i in (1, 2, 3)]
    placement = place(cfg, ws, "roundrobin", context_tokens=64)
    for w in ws:
        assert predict(cfg, placement, w.name, 64) == worker_bytes(cfg, placement, w.name, 64) > 0
    # dealing a KV group's query heads over several workers replicates its KV copy on each of them
    alone = predict(cfg, {u: "x" for u in all_units(cfg)}, "x", 64)
    assert sum(predict(cfg, placement, w.name, 64) for w in ws) > alone


def test_crossing_token_is_the_first_context_above_the_threshold() -> None:
    cfg = preset("llama-tiny")
    placement = {u: "worker1" for u in all_units(cfg)}
    limit = int(predict(cfg, placement, "worker1", 1000) / 0.85)  # crosses 85 % right after 1000 tokens
    token = crossing_token(cfg, placement, "worker1", limit)
    assert token is not None
    assert predict(cfg, placement, "worker1", token) > 0.85 * limit
    assert predict(cfg, placement, "worker1", token - 1) <= 0.85 * limit
    assert 995 <= token <= 1005
    assert crossing_token(cfg, placement, "worker1", 10) == 0  # already over with no context
    only_ffn = {Unit(0, "ffn"): "worker2"}
    assert crossing_token(cfg, only_ffn, "worker2", 10**9) is None  # no heads: no cache growth


def test_squeeze_puts_the_fastest_growing_worker_past_the_threshold_and_the_limit_at_the_tokens_asked() -> (
    None
):
    cfg = preset("tinyllama-half")
    ws = [WorkerSpec(f"worker{i}", 10**9, 1e9, 1_000_000) for i in (1, 2, 3, 4)]
    placement = place(cfg, ws, "greedy", context_tokens=64)
    prompt = 46
    got = squeeze(cfg, placement, prompt, replace_at=4, full_at=10)
    growth = {w.name: predict(cfg, placement, w.name, 1) - predict(cfg, placement, w.name, 0) for w in ws}
    assert growth[got.worker] == max(growth.values()) > 0
    # the engine samples after generated token i, the caches then holding prompt + i positions
    at = {i: predict(cfg, placement, got.worker, prompt + i) for i in range(12)}
    tracker = MemoryTracker({got.worker: got.limit_bytes}, got.threshold)
    crossed = []
    for i in range(12):
        tracker.record(i, got.worker, at[i])
        crossed.append(tracker.needs_replacement(got.worker))
    assert crossed.index(True) == 4 and all(crossed[4:])
    assert [at[i] > got.limit_bytes for i in range(12)].index(True) == 10
    assert 0 < got.threshold < 1
    assert got.to_json() == {"worker": got.worker, "limit_bytes": got.limit_bytes, "threshold": got.threshold,
                             "replace_at": 4, "full_at": 10}  # fmt: skip


def test_squeeze_takes_the_first_worker_by_name_among_equals_and_refuses_what_cannot_grow() -> None:
    cfg = preset("llama-tiny")
    units = all_units(cfg)
    heads = [u for u in units if u.kind == "head"]
    # worker10 and worker2 hold the same heads' worth of groups: worker2 comes first by name
    half = len(heads) // 2
    placement = {u: "worker1" for u in units if u.kind != "head"}
    placement.update({u: "worker2" for u in heads[:half]})
    placement.update({u: "worker10" for u in heads[half:]})
    assert squeeze(cfg, placement, 8, 1, 2).worker == "worker2"
    with pytest.raises(ValueError, match="no worker holds an attention head"):
        squeeze(cfg, {u: "worker1" for u in units if u.kind != "head"}, 8, 1, 2)
    with pytest.raises(ValueError, match="needs 0 < replace_at < full_at, got 3 and 3"):
        squeeze(cfg, placement, 8, 3, 3)


# ------------------------------------------------------------- a worker's peak, and how it ended


def _tinyllama_layerwise() -> dict[Unit, str]:
    specs = [WorkerSpec(f"worker{r}", 1 << 40, 1e9, 0) for r in (1, 2, 3, 4)]
    return dict(place(preset("tinyllama"), specs, "layerwise", context_tokens=0))


def test_each_workers_peak_is_its_units_the_larger_of_margin_and_caches_and_its_process() -> None:
    cfg = preset("tinyllama")
    plan = _tinyllama_layerwise()
    needs = mem.needs(cfg, plan, 17)
    n1 = needs["worker1"]
    assert n1.units_bytes == worker_bytes(cfg, plan, "worker1", 0)
    assert n1.margin_bytes == 4 * 2048 * 5632 + (16 << 20)  # one FFN matrix + the allocator's slack
    assert n1.peak_bytes == mem.RUNTIME_BASE_BYTES + n1.units_bytes + n1.margin_bytes  # caches: 17 tokens
    assert n1.describe() == "1443 MB at its peak (units 1060 MB + set-up margin 63 MB + process 320 MB)"
    long = mem.needs(cfg, plan, 8192)["worker1"]  # caches past the margin
    assert long.describe().startswith("1481 MB at its peak (units 1060 MB + KV caches 101 MB")
    limits = {"worker1": 1024 << 20, "worker2": 2048 << 20, "worker3": 0}
    assert mem.over_limit(needs, limits) == [
        "worker1 needs 1443 MB at its peak (units 1060 MB + set-up margin 63 MB + process 320 MB), "
        "its memory limit is 1074 MB"
    ]


def _cgroup(tmp_path: Path, files: dict[str, str]) -> Path:
    d = tmp_path / "dit-r1-device1"
    d.mkdir(parents=True)
    for name, text in files.items():
        (d / name).write_text(text)
    return d


def test_cgroup_counters_are_read_from_v1_and_v2(tmp_path: Path) -> None:
    v1 = _cgroup(tmp_path / "v1", {
        "memory.limit_in_bytes": "1610612736\n", "memory.max_usage_in_bytes": "1610600448\n",
        "memory.failcnt": "12\n", "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
    })  # fmt: skip
    assert mem.read_cgroup(v1) == mem.CgroupMemory(str(v1), 1610612736, 1610600448, 1, 12)
    v2 = _cgroup(tmp_path / "v2", {
        "memory.max": "max\n", "memory.peak": "5000\n",
        "memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\noom_group_kill 0\n",
    })  # fmt: skip
    assert mem.read_cgroup(v2) == mem.CgroupMemory(str(v2), None, 5000, 2, None)
    unlimited = _cgroup(tmp_path / "v1u", {"memory.limit_in_bytes": "9223372036854771712\n"})
    assert mem.read_cgroup(unlimited).limit_bytes is None


def test_a_process_finds_its_memory_cgroup_and_the_limit_that_binds_it(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    inner = root / "memory" / "rack" / "device1"
    inner.mkdir(parents=True)
    (root / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (root / "memory" / "rack" / "memory.limit_in_bytes").write_text("1000\n")
    (inner / "memory.limit_in_bytes").write_text("2000\n")
    v1 = tmp_path / "cgroup-v1"
    v1.write_text("12:cpu,cpuacct:/rack/device1\n4:memory:/rack/device1\n0::/\n")
    assert mem.own_memory_cgroup(v1, root) == inner
    assert mem.effective_limit_bytes(inner) == 1000  # the parent's limit binds
    (root / "cgroup.controllers").write_text("cpu memory\n")
    v2 = tmp_path / "cgroup-v2"
    v2.write_text("0::/rack/device1\n")
    (root / "rack" / "device1").mkdir(parents=True)
    assert mem.own_memory_cgroup(v2, root) == root / "rack" / "device1"
    assert mem.own_memory_cgroup(tmp_path / "none", root) is None


def test_the_loss_of_a_worker_names_the_kill_the_limit_and_its_need() -> None:
    need = mem.Need("worker1", 1_060_200_000, 0, 62_900_000)
    cg = mem.CgroupMemory("/sys/fs/cgroup/memory/dit-r1-device1", 1610612736, 1610600448, 1, 12)
    oom = mem.ExitNote("worker1", -9, cg)
    assert mem.ExitNote.from_json(oom.to_json()) == oom
    assert mem.loss_message("worker1", "setup", oom, need, 1610612736) == (
        "worker1 was killed by the kernel's memory limit (signal 9; memory cgroup "
        "/sys/fs/cgroup/memory/dit-r1-device1, limit 1611 MB, oom_kill 1, failcnt 12, peak 1611 MB) during "
        "setup; it needs 1443 MB at its peak (units 1060 MB + set-up margin 63 MB + process 320 MB): raise "
        "its node's memory limit or spread the model over more workers"
    )
    # a SIGKILL the memory cgroup did not send, another signal, an exit status, no note at all
    other = mem.ExitNote("worker1", -9, mem.CgroupMemory("/x", None, None, 0))
    assert mem.loss_message("worker1", "heads", other, None, 0).startswith(
        "worker1 was killed by signal 9 during heads; memory cgroup /x, oom_kill 0, its memory limit is unknown"
    )
    assert "exited with status 1 during ffn" in mem.loss_message(
        "worker2", "ffn", mem.ExitNote("worker2", 1, None), None, 0
    )
    assert mem.loss_message("worker3", "setup", None, need, 1 << 30) == (
        "worker3 stopped answering during setup and no record of its exit is readable here (its node's logs/ "
        "and results/worker3.exit.json say how it ended); it needs 1443 MB at its peak (units 1060 MB + "
        "set-up margin 63 MB + process 320 MB), its memory limit is 1074 MB"
    )


def test_the_supervisor_notes_a_worker_killed_by_a_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "headsplit.json").write_text(json.dumps({"result": "out/headsplit.json"}))
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert worker.supervise([sys.executable, "-c", kill], "headsplit.json", 2) == 128 + 9
    note = mem.ExitNote.from_json(json.loads((tmp_path / "out" / "worker2.exit.json").read_text()))
    assert note.worker == "worker2" and note.signal == 9
    assert "headsplit worker: worker2 was killed by" in capsys.readouterr().err
    # a worker that ends well leaves no note
    assert worker.supervise([sys.executable, "-c", "pass"], "headsplit.json", 3) == 0
    assert not (tmp_path / "out" / "worker3.exit.json").exists()
