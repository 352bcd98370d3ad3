"""Every script under benchmarks/ runs with ``--smoke`` (tiny sizes, the same code path): a benchmark
that breaks fails the suite (issue 29 item 3). Tests never assert wall-clock times; these only check
that each benchmark completes and prints its figures.

The benchmarks that need TensorFlow or PyTorch, and those whose smoke is a whole run, are marked slow
(``./dev slow``, where the extras are installed; CI runs that phase) and skip with the reason where an
extra is absent; those that need root (namespaces, cgroups) or a llama.cpp build skip with the reason
likewise. A new benchmark is picked up by the glob below; one that
does not take ``--smoke`` fails here.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = sorted(p.name for p in (REPO / "benchmarks").glob("bench_*.py"))
LLAMACPP_SRC = REPO / "runtimes" / "llamacpp" / "src"


@dataclass(frozen=True)
class Needs:
    modules: tuple[str, ...] = ()  # importable in this environment (an extra)
    root: bool = False  # network namespaces, cgroups
    cgroup_v1_cpu: bool = False
    llamacpp: bool = False  # the llama.cpp binaries built and the converter's source unpacked
    programs: tuple[str, ...] = ()  # on PATH


NEEDS: dict[str, Needs] = {
    "bench_ch4_mape.py": Needs(root=True),  # ch4's load conditions (cgroups)
    "bench_cpu_share_grain.py": Needs(root=True, cgroup_v1_cpu=True),
    "bench_headsplit_dataflow.py": Needs(modules=("torch",)),
    "bench_headsplit_rpc.py": Needs(modules=("torch",)),
    "bench_headsplit_setup_memory.py": Needs(modules=("torch",)),
    "bench_link_emulation.py": Needs(root=True, programs=("iptables", "iperf3", "ping")),
    "bench_keras_timestamp_cost.py": Needs(modules=("tensorflow",)),
    "bench_profiler_overhead.py": Needs(modules=("tensorflow",)),
    "bench_rack_scaling.py": Needs(root=True),
    "bench_speculation_acceptance.py": Needs(modules=("torch",)),
    "bench_runtimes_compare.py": Needs(modules=("torch", "transformers"), root=True, llamacpp=True),
    "bench_tbf_rate.py": Needs(root=True),
}
#: Run in the slow phase: the benchmarks that import a framework (the extras are installed there) and
#: those whose smoke is still a whole ``dit run`` or a rack (half a minute and more each): the default
#: phase, which a contributor runs before each commit, keeps the ones that take seconds.
SLOW = {name for name, needs in NEEDS.items() if needs.modules} | {
    "bench_ch4_mape.py",
    "bench_rack_scaling.py",
    "bench_stages.py",
    "bench_sweep.py",
}


def _why_not(needs: Needs) -> str | None:
    missing = [m for m in needs.modules if importlib.util.find_spec(m) is None]
    if missing:
        return f"needs {', '.join(missing)} (./dev slow installs the extras: pip install -e '.[keras,llm]')"
    if needs.root and os.geteuid() != 0:
        return "needs root (network namespaces, cgroups)"
    missing_programs = [p for p in needs.programs if shutil.which(p) is None]
    if missing_programs:
        return f"needs {', '.join(missing_programs)} on PATH"
    if needs.cgroup_v1_cpu and not Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists():
        return "needs a cgroup v1 cpu hierarchy with CFS bandwidth at /sys/fs/cgroup/cpu"
    if needs.llamacpp:
        sys.path.insert(0, str(LLAMACPP_SRC))
        try:
            from dit_llamacpp import build, models
        finally:
            sys.path.remove(str(LLAMACPP_SRC))
        if build.lookup() is None:
            return "needs the llama.cpp binaries (dit runtimes act llamacpp-rpc build)"
        try:
            models.vendored()
        except models.GGUFError as exc:
            return f"needs the converter's source: {exc}"
    return None


def _params() -> list[object]:
    return [
        pytest.param(name, marks=[pytest.mark.slow] if name in SLOW else [], id=name.removesuffix(".py"))
        for name in BENCHMARKS
    ]


def test_every_benchmark_has_its_needs_named_or_needs_nothing() -> None:
    assert len(BENCHMARKS) >= 15
    assert set(NEEDS) <= set(BENCHMARKS), set(NEEDS) - set(BENCHMARKS)


@pytest.mark.parametrize("name", _params())
def test_the_benchmark_runs_with_smoke(name: str, tmp_path: Path) -> None:
    reason = _why_not(NEEDS.get(name, Needs()))
    if reason is not None:
        pytest.skip(f"{name}: {reason}")
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / name), "--smoke"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (
        f"{name} --smoke exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    assert done.stdout.strip(), f"{name} --smoke printed nothing:\n{done.stderr[-3000:]}"
