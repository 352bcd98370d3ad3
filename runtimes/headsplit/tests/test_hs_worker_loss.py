"""The controller names why a worker was lost (issue 49 item 9), and refuses a placement whose worker
would need more than its node allows before anything is built."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from headsplit import memory
from headsplit.config import preset
from headsplit.controller import SetupRefused, parse_config, setup_needs, why_lost
from headsplit.placement import WorkerSpec, place

EOF_ERROR = "worker1.remote_setup: failed 4 times, last error: EOF"


def _config(note: Path | None, note2: Path | None = None) -> Any:
    return parse_config({
        "model": {"preset": "tinyllama"}, "checkpoint": None,
        "controller": {"host": "edgeserver", "address": "127.0.0.1", "port": 29600},
        "workers": [{"rank": r, "address": "127.0.0.1", "memory_limit_bytes": 0,
                     "exit_note": (None if n is None else str(n))} for r, n in ((1, note), (2, note2))],
        "strategy": "layerwise", "speculation": False, "tau": 0.0, "speculation_profile": None, "tokens": 4,
        "prompt": "x",
    })  # fmt: skip


def _needs() -> dict[str, Any]:
    specs = [WorkerSpec(f"worker{r}", 1 << 40, 1e9, 0) for r in (1, 2, 3, 4)]
    return memory.needs(
        preset("tinyllama"), dict(place(preset("tinyllama"), specs, "layerwise", context_tokens=0)), 5
    )


def test_a_worker_the_memory_cgroup_killed_is_named_with_its_limit_and_need(tmp_path: Path) -> None:
    note = tmp_path / "worker1.exit.json"
    cg = memory.CgroupMemory("/sys/fs/cgroup/memory/dit-r1-device1", 1536 << 20, 1536 << 20, 1, 40)
    note.write_text(json.dumps(memory.ExitNote("worker1", -9, cg).to_json()))
    got = why_lost(_config(note), EOF_ERROR, _needs(), {"worker1": 1536 << 20})
    assert got.startswith(
        "worker1 was killed by the kernel's memory limit (signal 9; memory cgroup "
        "/sys/fs/cgroup/memory/dit-r1-device1, limit 1611 MB, oom_kill 1, failcnt 40, peak 1611 MB) during "
        "setup; it needs 1443 MB at its peak"
    )
    assert got.endswith(f"({EOF_ERROR})")


def test_a_call_that_failed_under_another_lost_worker_names_that_one(tmp_path: Path) -> None:
    """worker1's call pulled from worker2, which the kernel killed: worker2 is the one named."""
    cg = memory.CgroupMemory("/sys/fs/cgroup/memory/dit-r1-device2", 1536 << 20, 1536 << 20, 1, 3)
    (tmp_path / "worker2.exit.json").write_text(json.dumps(memory.ExitNote("worker2", -9, cg).to_json()))
    rc = _config(tmp_path / "worker1.exit.json", tmp_path / "worker2.exit.json")
    failed = "worker1.heads: failed 4 times, last error: RPCErr:1: pull from worker2: EOF"
    got = why_lost(rc, failed, _needs(), {"worker2": 1536 << 20})
    assert got.startswith("worker2 was killed by the kernel's memory limit (signal 9; memory cgroup ")
    assert "during heads; it needs 1443 MB at its peak" in got


def test_a_lost_worker_without_a_readable_note_says_where_its_exit_is(tmp_path: Path) -> None:
    # the rack: the note stays on the worker's node; only a closed connection reads as a lost worker
    rc = _config(None)
    assert why_lost(rc, EOF_ERROR, _needs(), {"worker1": 1536 << 20}).startswith(
        "worker1 stopped answering during setup and no record of its exit is readable here"
    )
    timeout = "worker1.heads: failed 4 times, last error: RPC ran for more than set timeout (30000 ms)"
    assert why_lost(rc, timeout, _needs(), {}) == timeout


def test_a_placement_whose_worker_passes_its_nodes_memory_is_refused_before_set_up() -> None:
    cfg = preset("tinyllama")
    specs = [WorkerSpec(f"worker{r}", 1 << 40, 1e9, 0) for r in (1, 2, 3, 4)]
    plan = dict(place(cfg, specs, "layerwise", context_tokens=0))
    docs: list[dict[str, Any]] = [{"name": f"worker{r}"} for r in (1, 2, 3, 4)]
    roomy = dict.fromkeys((d["name"] for d in docs), 2048 << 20)
    assert set(setup_needs(cfg, plan, 5, roomy, docs)) == {"worker1", "worker2", "worker3", "worker4"}
    assert [d["need_bytes"] for d in docs][:2] == [1_443_074_048, 1_443_074_048]
    with pytest.raises(SetupRefused) as refused:
        setup_needs(cfg, plan, 5, {**roomy, "worker2": 1024 << 20}, docs)
    assert str(refused.value).startswith(
        "placement refused before set-up: worker2 needs 1443 MB at its peak (units 1060 MB + set-up margin "
        "63 MB + process 320 MB), its memory limit is 1074 MB (the kernel would kill it)"
    )
