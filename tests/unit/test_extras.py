"""A benchmark that needs an optional extra says which, and the command, in one line (issue 49, item 8)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dit.extras import EXTRA_MODULES, missing_extra_message

REPO = Path(__file__).resolve().parents[2]
BLOCKED = ("tensorflow", "torch", "transformers", "keras")
# The modules set to None in sys.modules: importlib.util.find_spec answers None and `import` fails, as in a
# venv without the extras, whether or not the slow phase installed them into this one.
RUN_WITHOUT_EXTRAS = (
    "import runpy, sys\n"
    f"for name in {BLOCKED!r}: sys.modules[name] = None\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


@pytest.mark.parametrize(
    ("bench", "extra"),
    [
        ("bench_keras_timestamp_cost.py", "keras"),
        ("bench_profiler_overhead.py", "keras,llm"),
        ("bench_headsplit_rpc.py", "llm"),
        ("bench_runtimes_compare.py", "llm"),
        ("bench_headsplit_dataflow.py", "llm"),
        ("bench_headsplit_setup_memory.py", "llm"),
    ],
)
def test_benchmark_without_its_extra_says_so_in_one_line(bench: str, extra: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT_EXTRAS, str(REPO / "benchmarks" / bench), "--smoke"],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"{bench} needs the optional extra {extra!r}" in lines[0]
    assert f"pip install -e '.[{extra}]'" in lines[0]


def test_nothing_to_say_when_the_extra_is_there(monkeypatch: pytest.MonkeyPatch) -> None:
    # pyyaml is in every venv of the project: an extra made of it is never missing; one made of a module
    # nobody has is named with its install command
    monkeypatch.setitem(EXTRA_MODULES, "present", ("yaml",))
    monkeypatch.setitem(EXTRA_MODULES, "absent", ("yaml", "dit_no_such_module"))
    assert missing_extra_message("x", ("present",)) is None
    said = missing_extra_message("x", ("present", "absent"))
    assert said is not None and "'absent' (dit_no_such_module not installed)" in said
