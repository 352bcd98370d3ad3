"""A worker builds only its own units, one at a time (issue 47): seeded per unit with the whole model's
values, or read per unit from a checkpoint (only the bytes of its rows); its peak while building stays
within its units' bytes plus the stated margin (a child process under a memory cgroup, slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from headsplit import engine, memory, model  # noqa: E402
from headsplit.config import ModelConfig, preset  # noqa: E402
from headsplit.placement import worker_bytes  # noqa: E402
from headsplit.units import Unit, all_units  # noqa: E402

# widths that are not whole blocks of torch's normal sampler (40, 72 values a row): drawn whole, then cut
ODD = ModelConfig("odd", "llama", 2, 4, 2, 40, 72, 50, 32, seed=7)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _same(a: tuple[dict[str, Any], dict[Any, Any]], b: tuple[dict[str, Any], dict[Any, Any]]) -> None:
    units_a, slots_a = a
    units_b, slots_b = b
    assert units_a.keys() == units_b.keys() and slots_a.keys() == slots_b.keys()
    for key, w in units_a.items():
        assert w.keys() == units_b[key].keys(), key
        for name, t in w.items():
            assert torch.equal(t, units_b[key][name]), f"{key}.{name}"
            assert t.is_contiguous()
    for key, (w, _, _) in slots_a.items():
        for name, t in w.items():
            assert torch.equal(t, slots_b[key][0][name]), f"{key}.{name}"


def _shares(cfg: ModelConfig) -> Iterator[list[Unit]]:
    units = all_units(cfg)
    yield units
    # a head-level share: every third head (rows skipped between them), an FFN, a projection
    yield [*(u for u in units if u.kind == "head" and u.head % 3 == 1), Unit(1, "ffn"), Unit(0, "proj")]


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny", "tinyllama-half", "odd"])
def test_units_seeded_one_at_a_time_are_the_whole_models_cuts_bit_for_bit(name: str) -> None:
    cfg = ODD if name == "odd" else preset(name)
    whole = model.seeded_weights(cfg)
    for units in _shares(cfg):
        _same(engine.load_share(cfg, None, units), engine.build_share(cfg, whole, units))
    # rows asked for out of order: the source starts that tensor's generator again
    src = model.SeededSource(cfg)
    hd = cfg.head_dim
    for h in (3, 1, 2, 0, 3):
        assert torch.equal(
            src.rows("L1.q.weight", h * hd, (h + 1) * hd), whole["L1.q.weight"][h * hd : (h + 1) * hd]
        )


def _write_bf16(path: Path, tensors: dict[str, Any]) -> None:
    """A safetensors file of bfloat16 tensors (as Hugging Face ships TinyLlama)."""
    header: dict[str, Any] = {}
    blobs: list[bytes] = []
    offset = 0
    for name, t in tensors.items():
        data = t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(len(head).to_bytes(8, "little") + head + b"".join(blobs))


@pytest.mark.parametrize(
    ("name", "layout"),
    [("gpt2-tiny", "hf"), ("llama-tiny", "hf"), ("llama-tiny", "hf-bf16"), ("llama-tiny", "own")],
)
def test_units_read_one_at_a_time_from_a_checkpoint_equal_the_whole_read(
    tmp_path: Path, name: str, layout: str
) -> None:
    cfg = preset(name)
    w = model.seeded_weights(cfg)
    path = tmp_path / "m.safetensors"
    if layout == "hf-bf16":
        _write_bf16(path, model.to_hf(cfg, w))
    else:
        model.write_safetensors(path, model.to_hf(cfg, w) if layout == "hf" else w)
    ck = {"path": str(path), "sha256": model.sha256_file(path)}
    whole = model.load_checkpoint(cfg, path, ck["sha256"])
    if layout != "hf-bf16":
        assert all(torch.equal(whole[n], w[n]) for n in w)
    for units in _shares(cfg):
        _same(engine.load_share(cfg, ck, units), engine.build_share(cfg, whole, units))


def test_a_head_reads_only_its_rows_from_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One query head of llama-tiny: its Wq rows and its norm, nothing of the rest of the file."""
    cfg = preset("llama-tiny")
    path = tmp_path / "m.safetensors"
    model.write_safetensors(path, model.to_hf(cfg, model.seeded_weights(cfg)))
    read: list[int] = []
    real = model._read

    def counting(fh: Any, n: int, file: Path, name: str) -> bytearray:
        read.append(n)
        return real(fh, n, file, name)

    monkeypatch.setattr(model, "_read", counting)
    src = model.CheckpointSource(cfg, path)
    model.unit_weights_from(cfg, src, Unit(1, "head", 5))
    assert sum(read) == 4 * (cfg.head_dim * cfg.hidden + cfg.hidden) < path.stat().st_size // 50


def test_a_checkpoint_tensor_of_the_wrong_shape_is_named_when_read_per_unit(tmp_path: Path) -> None:
    cfg = preset("gpt2-tiny")
    hf = model.to_hf(cfg, model.seeded_weights(cfg))
    hf["h.1.attn.c_attn.weight"] = torch.zeros(cfg.hidden, 2 * cfg.hidden)
    path = tmp_path / "m.safetensors"
    model.write_safetensors(path, hf)
    with pytest.raises(model.CheckpointError, match=r"h\.1\.attn\.c_attn\.weight has shape \(64, 128\)"):
        engine.load_share(cfg, {"path": str(path), "sha256": model.sha256_file(path)}, [Unit(1, "head", 0)])


# ------------------------------------------------------------------------ the peak, under a limit

TINYLLAMA_LAYERS = (7, 8)  # two of TinyLlama's 22 layers: a layer-wise worker holds 5-6 of them

CHILD = textwrap.dedent(
    """
    import json, os, sys
    cgroup = sys.argv[2]
    if cgroup:  # join the limited cgroup before anything is allocated
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
    import torch
    torch.set_num_threads(1)
    from headsplit import engine, memory
    from headsplit.config import preset
    from headsplit.units import Unit
    units = [Unit.parse(k) for k in json.loads(sys.argv[1])]
    base = memory.status_bytes("VmRSS")
    st = engine.WorkerState("worker1", preset("tinyllama"))
    st.load(*engine.load_share(preset("tinyllama"), None, units))
    held, _ = st.nbytes()
    # VmHWM, this image's own peak: ru_maxrss keeps the forking parent's RSS across the exec (a pytest
    # worker that loaded TensorFlow read as 1.1 GB here)
    peak = memory.status_bytes("VmHWM")
    print(json.dumps({"base": base, "peak": peak, "held": held}))
    """
)


def _memory_cgroup(limit_bytes: int) -> Path | None:
    """A fresh memory cgroup limited to ``limit_bytes`` (no swap), or None where this process cannot
    make one (not root, or no writable memory controller)."""
    if os.geteuid() != 0:
        return None
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").is_file():
        if "memory" not in (root / "cgroup.subtree_control").read_text().split():
            return None
        files = {"memory.max": limit_bytes, "memory.swap.max": 0}
    elif (root / "memory" / "memory.limit_in_bytes").exists():
        root = root / "memory"
        files = {"memory.limit_in_bytes": limit_bytes, "memory.memsw.limit_in_bytes": limit_bytes}
    else:
        return None
    path = root / f"headsplit-test-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    for name, value in files.items():
        if (path / name).exists():
            (path / name).write_text(str(value))
    return path


@pytest.mark.slow
def test_a_worker_builds_tinyllamas_units_within_their_bytes_and_the_margin_under_that_limit() -> None:
    """Two TinyLlama layers (353 MB of units) built in a child process: its peak RSS above its start
    stays within the units' bytes plus ``setup_margin_bytes`` (before issue 47's fix: twice the units,
    the whole tensors and then their cuts), and it runs inside a memory cgroup whose limit is the need
    the plug-in states (:class:`headsplit.memory.Need`), where the old build was killed."""
    cfg = preset("tinyllama")
    units = [u for u in all_units(cfg) if u.layer in TINYLLAMA_LAYERS]
    plan = {u: "worker1" for u in units}
    units_bytes = worker_bytes(cfg, plan, "worker1", 0)
    margin = memory.setup_margin_bytes(cfg)
    need = memory.needs(cfg, plan, 0)["worker1"]
    cgroup = _memory_cgroup(need.peak_bytes)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps([u.key() for u in units]), str(cgroup or "")],
            capture_output=True,
            text=True,
            check=False,
        )
        counters = memory.read_cgroup(cgroup).describe() if cgroup else "no cgroup"
    finally:
        if cgroup is not None:
            cgroup.rmdir()
    assert proc.returncode == 0, f"the build failed ({proc.returncode}; {counters}): {proc.stderr[-2000:]}"
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["held"] <= units_bytes
    assert r["peak"] - r["base"] <= units_bytes + margin, (
        f"peak {r['peak'] / 1e6:.0f} MB from a start of {r['base'] / 1e6:.0f} MB: more than the units' "
        f"{units_bytes / 1e6:.0f} MB + the margin's {margin / 1e6:.0f} MB"
    )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_a_worker_whose_cgroup_cannot_hold_its_units_is_refused_before_set_up(tmp_path: Path) -> None:
    """worker1 in a 600 MiB memory cgroup holding two TinyLlama layers (353 MB of units; before issue 47
    its set-up was killed there and the run read ``worker1.remote_setup: failed 4 times, last error:
    EOF``): the controller reads the limit from worker1's cgroup and refuses before anything is built,
    naming worker, need and limit."""
    cgroup = _memory_cgroup(600 << 20)
    if cgroup is None:
        pytest.skip("needs root and a writable memory cgroup")
    cfg = preset("tinyllama")
    doc = {
        "model": {"preset": "tinyllama"}, "checkpoint": None,
        "controller": {"host": "edge", "address": "127.0.0.1", "port": _free_port()},
        "workers": [{"rank": r, "address": "127.0.0.1", "memory_limit_bytes": 0} for r in (1, 2)],
        "strategy": "layerwise", "speculation": False, "tau": 0.0, "speculation_profile": None,
        "tokens": 2, "prompt": "x", "rpc_timeout_s": 20, "rpc_retries": 0, "threads": 1,
        "result": "results/headsplit.json", "replacement": False,
        "placement": {u.key(): "worker1" if u.layer < 2 else "worker2" for u in all_units(cfg)},
    }  # fmt: skip
    (tmp_path / "headsplit.json").write_text(json.dumps(doc))
    argv = [sys.executable, "-m", "headsplit.worker", "--config", "headsplit.json", "--rank"]

    def join(path: Path = cgroup) -> None:
        (path / "cgroup.procs").write_text(str(os.getpid()))

    workers = [
        subprocess.Popen([*argv, str(r)], cwd=tmp_path, preexec_fn=join if r == 1 else None)  # noqa: PLW1509
        for r in (1, 2)
    ]
    try:
        ctl = [sys.executable, "-m", "headsplit.controller", "--config", "headsplit.json"]
        proc = subprocess.run(ctl, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    finally:
        for w in workers:  # a failed run leaves its workers waiting: their supervisors pass SIGTERM on
            w.terminate()
            w.wait(timeout=60)
        cgroup.rmdir()
    res = json.loads((tmp_path / "results" / "headsplit.json").read_text())
    assert proc.returncode == 1
    assert res["error"].startswith(
        "SetupRefused: placement refused before set-up: worker1 needs 736 MB at its peak (units 353 MB + "
        "set-up margin 63 MB + process 320 MB), its memory limit is 629 MB (the kernel would kill it)"
    ), res["error"]
    assert "worker1 needs 736 MB" in proc.stdout
