"""llama.cpp's RPC backend (runtimes/llamacpp) installed with pip like any third-party runtime, driven through dit.

Slow, and skipped unless the binaries were built into the cache (``dit runtimes act llamacpp-rpc build``
or ``python -m dit_llamacpp.build``) and a tiny GGUF is at hand: ``dit_llamacpp.models`` converts
``llama-tiny`` F32 (the GGUF work; skipped with the reason when the converter's source is not unpacked:
``python -m dit_llamacpp.source``), or ``$DIT_LLAMACPP_TEST_GGUF`` names a file converted from the
same seeded weights (``$DIT_LLAMACPP_TEST_BIN`` a directory of binaries with a ``build.json`` beside it,
as the build cache has: preflight refuses a run without one).
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dit.run.procs import run_processes
from dit.run.rundir import RunDir
from tests.conftest import DIT, REPO, free_port, install_fixture_package
from tests.conftest import dit_with_site as dit
from tests.conftest import env_with_site as env_with

LLAMACPP = REPO / "runtimes" / "llamacpp"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_fixture_package("llamacpp", tmp_path_factory.mktemp("llamacpp"), source_dir=LLAMACPP)


def _bin_dir() -> Path:
    if os.environ.get("DIT_LLAMACPP_TEST_BIN"):  # a directory of binaries other than the cache's
        return Path(os.environ["DIT_LLAMACPP_TEST_BIN"])
    sys.path.insert(0, str(LLAMACPP / "src"))
    from dit_llamacpp import build

    built = build.lookup()
    if built is None:
        pytest.skip("llama.cpp binaries not built (python -m dit_llamacpp.build --archive <sdist>)")
    return built.directory / "bin"


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(LLAMACPP / "src"), str(REPO / "src")])}


def _hf_greedy(prompt_ids: list[int], llama_ids: list[int]) -> dict[str, Any]:
    """Hugging Face's greedy ids for llama.cpp's prompt ids (the same seeded llama-tiny weights the GGUF was
    converted from), compared with llama.cpp's by dit_llamacpp.equivalence, in a child (torch: see above)."""
    done = subprocess.run(
        [sys.executable, "-m", "dit_llamacpp.equivalence", "llama-tiny",
         "--prompt-ids", ",".join(map(str, prompt_ids)), "--llama-ids", ",".join(map(str, llama_ids))],
        env=_child_env(), capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode in (0, 1) and done.stdout.strip(), done.stdout + done.stderr
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def _converter_tree() -> Path:
    """The vendored converter's tree, or skip naming the command that unpacks it: with the binaries
    built but the sdist's source not unpacked the conversion cannot run, which is no failure of ours."""
    sys.path.insert(0, str(LLAMACPP / "src"))
    from dit_llamacpp import models

    try:
        return models.vendored()
    except models.GGUFError as exc:
        pytest.skip(
            f"the GGUF converter's source is not unpacked ({exc}): python -m dit_llamacpp.source --mirror "
            "<mirror> (or --archive <the llama-cpp-python sdist>), or set $DIT_LLAMACPP_TEST_GGUF"
        )


def _gguf(tmp_path: Path) -> Path:
    named = os.environ.get("DIT_LLAMACPP_TEST_GGUF")
    if named:
        return Path(named)
    _converter_tree()
    # Converted in a child: the conversion imports torch, which must not be imported in this process
    # after Ansible's module_utils replaced sys.intern (torch._dynamo refuses it, and every later test
    # of the session that imports torch would fail).
    out = tmp_path / "gguf"
    done = subprocess.run(
        [sys.executable, "-m", "dit_llamacpp.models", "convert", "llama-tiny", "F32", "--out", str(out)],
        env=_child_env(), capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return out / "llama-tiny-F32.gguf"


def _scenario(tmp_path: Path, name: str, tokens: int, bin_dir: Path, gguf: Path, **block: Any) -> Path:
    doc = {
        "name": name,
        "model": {"name": "fake", "params": {"profile": "tiny"}},
        "devices": ["device1", "device2"],
        "repetitions": 1,
        "inference": {"enabled": False},
        "timing": {"start_lead_s": 1.0},
        "runtime": {"name": "llamacpp-rpc", "workers": ["device1", "device2"], "tokens": tokens,
                    "gguf": str(gguf), "bin_dir": str(bin_dir), "port": free_port(), "ctx_size": 256,
                    "tensor_split": [1, 1], **block},
    }  # fmt: skip
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


@pytest.mark.slow
def test_a_two_worker_local_run_generates_hf_s_8_greedy_ids(site: Path, tmp_path: Path) -> None:
    bin_dir = _bin_dir()
    scenario = _scenario(tmp_path, "lc_local", 8, bin_dir, _gguf(tmp_path), token_ids=True)
    done = dit(site, "run", str(scenario), "--runs-dir", str(tmp_path / "runs"), timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = (tmp_path / "runs" / "lc_local").iterdir()
    status = json.loads((run_dir / "status.json").read_text(encoding="utf-8"))
    assert status["state"] == "completed", status
    summary = json.loads((run_dir / "aggregate" / "summary.json").read_text(encoding="utf-8"))
    values = {v["name"]: v for v in summary["values"]}
    assert values["tokens_generated"]["value"] == 8
    assert values["tokens_per_s"]["value"] > 0 and values["tokens_per_s"]["unit"] == "1/s"
    assert values["bytes_total"]["value"] > 0 and values["worker_memory_peak"]["value"] > 0
    with (run_dir / "aggregate" / "llamacpp_workers.csv").open(encoding="utf-8") as handle:
        workers = list(csv.DictReader(handle))
    assert [w["host"] for w in workers] == ["device1", "device2"]
    assert all(int(w["rpc_bytes"]) > 0 and int(w["rss_peak_bytes"]) > 0 for w in workers)  # both hold layers
    # the rpc-servers' TCP bytes (sock_diag): each worker's layers uploaded, then traffic per token
    assert all(int(w["rpc_bytes_load"]) > 0 and w["rpc_bytes_missing"] == "" for w in workers)
    assert values["bytes_per_token"]["value"] > 0
    # the ids llama.cpp generated over the two rpc-servers are Hugging Face's greedy ids (issue 17, tests)
    controller = json.loads((run_dir / "raw" / "edge" / "edge_llamacpp.json").read_text(encoding="utf-8"))
    assert "token_ids_error" not in controller, controller["token_ids_error"]
    assert len(controller["generated_ids"]) == 8 and controller["prompt_ids"]
    hf = _hf_greedy(controller["prompt_ids"], controller["generated_ids"])
    assert hf["equal"], hf["describe"]  # else: the first divergence and HF's logit difference there
    assert (run_dir / "aggregate" / "llamacpp_tokens.csv").is_file()
    # the build the binaries came from is recorded per node (issue 17, item 1)
    metadata = json.loads((run_dir / "metadata.json").read_text(encoding="utf-8"))
    for host in ("edge", "device1", "device2"):
        recorded = metadata["runtime"]["nodes"][host]["llamacpp_build"]
        assert recorded["path"] == str(bin_dir.parent / "build.json")
        assert recorded["content"] == json.loads((bin_dir.parent / "build.json").read_text(encoding="utf-8"))
    logs = {p.name for p in run_dir.glob("raw/*/logs/*_llama-*.out")}
    assert logs == {"edge_llama-controller.out", "device1_llama-worker1.out", "device2_llama-worker2.out"}
    assert run_processes(RunDir(run_dir).run_id) == []


@pytest.mark.slow
def test_smollm2_s_wheel_file_runs_and_its_comparison_with_transformers_is_in_the_results(
    site: Path, tmp_path: Path
) -> None:
    """``model: smollm2-135m``, ``quant: Q4_1``: the wheel's own GGUF from the models directory, checked by the
    controller against its pin; ``equivalence: true`` puts the first difference and the agreement with
    transformers' float32 greedy ids in the run's summary (issue 32 item 4)."""
    import importlib.util

    if any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "gguf")):
        pytest.skip("the comparison needs dit[llm] (torch, transformers, gguf)")
    bin_dir = _bin_dir()
    sys.path.insert(0, str(LLAMACPP / "src"))
    from dit_llamacpp import models

    try:
        f = models.ensure_gguf("smollm2-135m", "Q4_1", tmp_path / "gguf")  # a copy: no torch here
    except models.GGUFError as exc:
        pytest.skip(str(exc))
    doc = {
        "name": "lc_smollm2", "model": {"name": "fake", "params": {"profile": "tiny"}},
        "devices": ["device1", "device2"], "repetitions": 1, "inference": {"enabled": False},
        "timing": {"start_lead_s": 1.0},
        "runtime": {"name": "llamacpp-rpc", "model": "smollm2-135m", "quant": "Q4_1", "tokens": 8,
                    "prompt": "The capital of France is", "models_dir": str(f.path.parent), "bin_dir": str(bin_dir),
                    "port": free_port(), "tensor_split": [1, 1], "token_ids": True, "equivalence": True},
    }  # fmt: skip
    scenario = tmp_path / "lc_smollm2.yaml"
    scenario.write_text(json.dumps(doc), encoding="utf-8")
    done = dit(site, "run", str(scenario), "--runs-dir", str(tmp_path / "runs"), timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = (tmp_path / "runs" / "lc_smollm2").iterdir()
    controller = json.loads((run_dir / "raw" / "edge" / "edge_llamacpp.json").read_text(encoding="utf-8"))
    assert controller["model_sha256"] == f.sha256  # the pin, checked before llama.cpp read the file
    assert controller["prompt_ids"] == [504, 3575, 282, 4649, 314]
    compared = json.loads((run_dir / "aggregate" / "llamacpp_equivalence.json").read_text(encoding="utf-8"))
    assert "error" not in compared, compared["error"]
    assert compared["llama_ids"] == controller["generated_ids"] and compared["suppressed"] == [0, 2]
    values = {
        v["name"]: v["value"]
        for v in json.loads((run_dir / "aggregate" / "summary.json").read_text())["values"]
    }
    assert values["reference_first_difference"] == compared["first_divergence"]
    assert values["reference_agreement"] == compared["agreement"]
    assert compared["hf_ids"][:2] == controller["generated_ids"][:2] == [7042, 30]  # " Paris." in both


@pytest.mark.slow
def test_a_run_without_the_pinned_build_is_refused_at_preflight_and_records_why(
    site: Path, tmp_path: Path
) -> None:
    # A cache of this test's own: the real one (/var/cache/dit/llamacpp) is neither read nor touched.
    sys.path.insert(0, str(LLAMACPP / "src"))
    from dit_llamacpp import build

    record = tmp_path / "cache" / build.SDIST_SHA256[:12] / "build.json"
    record.parent.mkdir(parents=True)
    other = {"sha256": "0123456789ab" + "0" * 52, "cxx": "c++ (fake) 1.0", "wall_s": 1.0}
    record.write_text(json.dumps(other), encoding="utf-8")  # a record, but of another source
    scenario = _scenario(tmp_path, "lc_unbuilt", 8, record.parent / "bin", tmp_path / "none.gguf")
    done = dit(site, "run", str(scenario), "--runs-dir", str(tmp_path / "runs"), timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    message = " ".join(done.stderr.split())
    assert "preflight: runtime llamacpp-rpc: no llama.cpp build for the pinned source" in message, message
    for host in ("edge", "device1", "device2"):
        assert f"{host}: {record} records the build of source 0123456789ab, not the pinned one" in message
    assert "dit runtimes act llamacpp-rpc build" in message
    (run_dir,) = (tmp_path / "runs" / "lc_unbuilt").iterdir()
    metadata = json.loads((run_dir / "metadata.json").read_text(encoding="utf-8"))
    for host in ("edge", "device1", "device2"):
        assert metadata["runtime"]["nodes"][host]["llamacpp_build"] == {"path": str(record), "content": other}
    assert json.loads((run_dir / "status.json").read_text(encoding="utf-8"))["state"] == "failed"
    assert run_processes(RunDir(run_dir).run_id) == []


def _rpc_servers(run_id: str) -> list[int]:
    return [p.pid for p in run_processes(run_id) if p.name() == "ggml-rpc-server"]


@pytest.mark.slow
def test_sigkill_of_the_driver_then_cleanup_leaves_no_rpc_server(
    site: Path, tmp_path: Path, _lease_dir: Path
) -> None:
    bin_dir = _bin_dir()
    scenario = _scenario(tmp_path, "lc_kill", 8, bin_dir, _gguf(tmp_path))
    runs = tmp_path / "runs"
    proc = subprocess.Popen(
        [*DIT, "run", str(scenario), "--runs-dir", str(runs)],
        cwd=REPO,
        env=env_with(site),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 600
    run: RunDir | None = None
    while time.monotonic() < deadline:
        found = list(runs.glob("*/*/status.json"))
        if found:
            run = RunDir(found[0].parent)
            if len(_rpc_servers(run.run_id)) == 2:
                break
        assert proc.poll() is None, "the run ended before both rpc-servers were up"
        time.sleep(0.1)
    else:
        proc.kill()
        raise AssertionError("the rpc-servers never started")
    assert run is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(0.5)
    assert len(_rpc_servers(run.run_id)) == 2  # nothing reaped them: the driver is gone
    cleaned = dit(site, "cleanup", str(run.path))
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert _rpc_servers(run.run_id) == []
    assert run_processes(run.run_id) == []
