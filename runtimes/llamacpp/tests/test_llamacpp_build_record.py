"""The build record in the run (issue 17, item 1): each node's ``build.json`` read by preflight's
``dit_facts``, recorded under ``runtime.nodes.<host>.llamacpp_build``, and a run refused on a node
without a build of the pinned source. A fake record in a tmp cache; the real cache is not touched.

library/dit_facts.py is run in a child: it imports Ansible's module_utils, which patches ``sys.intern``
(torch._dynamo, imported by other tests of this directory, refuses the patched one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"
REPO = Path(__file__).resolve().parents[3]
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from dit.runtime_api.interface import node_facts_of, preflight_of  # noqa: E402
from dit.runtimes import RuntimePreflight  # noqa: E402
from dit.runtimes.envs import RuntimeEnv, runtime_record  # noqa: E402
from dit_llamacpp import build, dit_runtime  # noqa: E402

HOSTS = ("edgeserver", "device1", "device2")
DEVICES = ("device1", "device2")


def _fake_build(cache: Path, sha256: str = build.SDIST_SHA256) -> Path:
    directory = cache / sha256[:12]
    (directory / "bin").mkdir(parents=True)
    record = {"sha256": sha256, "cxx": "c++ (Debian 14.2.0) 14.2.0", "cmake_options": build.CMAKE_OPTIONS,
              "env_flags": {"CFLAGS": "", "CXXFLAGS": "", "LDFLAGS": ""}, "wall_s": 123.4, "cpu_s": 240.1}  # fmt: skip
    (directory / build.BUILD_RECORD).write_text(json.dumps(record), encoding="utf-8")
    return directory / "bin"


def _preflight(block: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """What the driver does with every node's dit_facts (all nodes here read this machine's files)."""
    runtime = dit_runtime.LlamaCppRpcRuntime()
    paths = node_facts_of(runtime, block)
    # dit_facts imports its shared code as Ansible ships it (ansible.module_utils.dit_ping): the
    # checkout's module_utils/ joins that package's path first, as tests/ansible_modules.py does
    read = ("import json, sys, ansible.module_utils as u; u.__path__.append(sys.argv[2]); import dit_facts; "
            "paths = json.loads(sys.argv[1]); "
            "print(json.dumps({n: dit_facts._runtime_fact(p) for n, p in paths.items()}))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", read, json.dumps(paths), str(REPO / "module_utils")],
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "library")}, timeout=60, check=True)  # fmt: skip
    facts = {host: {"runtime_facts": json.loads(done.stdout)} for host in HOSTS}
    record = runtime_record(runtime.name, runtime.version, block, RuntimeEnv(None, None, None), facts,
                            dict.fromkeys(HOSTS, "/usr/bin/python3"))  # fmt: skip
    view = RuntimePreflight(block, {"runtime": block}, "edgeserver", DEVICES,
                            {h: f["runtime_facts"] for h, f in facts.items()})  # fmt: skip
    return record.metadata, preflight_of(runtime, view)


def test_the_build_record_lands_per_node_in_the_runtime_metadata(tmp_path: Path) -> None:
    bin_dir = _fake_build(tmp_path / "cache")
    metadata, refusal = _preflight({"name": "llamacpp-rpc", "bin_dir": str(bin_dir)})
    assert refusal is None
    expected = str(tmp_path / "cache" / build.SDIST_SHA256[:12] / "build.json")
    for host in HOSTS:
        fact = metadata["nodes"][host]["llamacpp_build"]
        assert fact["path"] == expected
        assert fact["content"]["cxx"] == "c++ (Debian 14.2.0) 14.2.0" and fact["content"]["wall_s"] == 123.4


def test_a_node_without_a_build_of_the_pinned_source_is_refused_by_name(tmp_path: Path) -> None:
    bin_dir = tmp_path / "cache" / build.SDIST_SHA256[:12] / "bin"
    metadata, refusal = _preflight({"name": "llamacpp-rpc", "bin_dir": str(bin_dir)})
    expected = str(tmp_path / "cache" / build.SDIST_SHA256[:12] / "build.json")
    assert metadata["nodes"]["device1"]["llamacpp_build"]["error"] == "No such file or directory"
    assert refusal is not None
    assert f"device1: no build record at {expected} (No such file or directory)" in refusal
    assert "edgeserver: no build record" in refusal and "device2: no build record" in refusal
    assert "dit runtimes act llamacpp-rpc build" in refusal and build.SDIST_SHA256[:12] in refusal


def test_a_record_of_another_source_is_refused(tmp_path: Path) -> None:
    other = "0123456789ab" + "0" * 52
    _fake_build(tmp_path / "cache", other)
    bin_dir = tmp_path / "cache" / other[:12] / "bin"
    metadata, refusal = _preflight({"name": "llamacpp-rpc", "bin_dir": str(bin_dir), "workers": ["device2"]})
    assert metadata["nodes"]["device2"]["llamacpp_build"]["content"]["sha256"] == other
    assert refusal is not None and "records the build of source 0123456789ab, not the pinned one" in refusal
    assert "device1" not in refusal  # not a worker: it runs no binary


def test_the_default_record_is_the_build_caches(tmp_path: Path) -> None:
    runtime = dit_runtime.LlamaCppRpcRuntime()
    assert runtime.node_facts({}) == {
        "llamacpp_build": f"{build.DEFAULT_CACHE}/{build.SDIST_SHA256[:12]}/build.json"
    }
    assert runtime.node_facts({"bin_dir": "/x/y/bin/"}) == {"llamacpp_build": "/x/y/build.json"}
