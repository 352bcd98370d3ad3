"""Seeds on every node (issue 6, part 5): the device agent seeds random, NumPy, TensorFlow and PyTorch
from $DIT_SEED; frameworks are seeded on their first import, never imported just to be seeded."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dit.device.seeding import seed_from_env

REPO = Path(__file__).resolve().parents[2]


def _run(code: str, seed: str | None) -> dict[str, object]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "src")}
    if seed is not None:
        env["DIT_SEED"] = seed
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    result: dict[str, object] = json.loads(proc.stdout.splitlines()[-1])
    return result


DRAWS = """
import json, random, sys
from dit.device.seeding import seed_from_env
info = seed_from_env()
imported_early = sorted(m for m in ("numpy", "tensorflow", "torch") if m in sys.modules)
out = {"info": info, "imported_early": imported_early, "random": random.random()}
import numpy
out["numpy"] = float(numpy.random.rand())
"""


def test_random_and_numpy_are_seeded_and_nothing_is_imported_early() -> None:
    a = _run(DRAWS + "print(json.dumps(out))", "2024")
    b = _run(DRAWS + "print(json.dumps(out))", "2024")
    other = _run(DRAWS + "print(json.dumps(out))", "7")
    assert a == b
    assert a["random"] != other["random"] and a["numpy"] != other["numpy"]
    assert a["imported_early"] == []  # seeding imports no framework by itself
    info = a["info"]
    assert isinstance(info, dict) and info["seed"] == 2024 and info["now"] == ["random"]
    assert "numpy" in info["on_import"]
    # the same values as seeding by hand
    import random

    import numpy

    random.seed(2024)
    numpy.random.seed(2024)
    assert a["random"] == random.random() and a["numpy"] == float(numpy.random.rand())


def test_unset_seed_seeds_nothing() -> None:
    assert seed_from_env({}) is None
    assert seed_from_env({"DIT_SEED": " "}) is None
    with pytest.raises(ValueError, match="DIT_SEED='x' is not an integer"):
        seed_from_env({"DIT_SEED": "x"})
    a = _run(DRAWS + "print(json.dumps(out))", None)
    assert a["info"] is None


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")
def test_torch_is_seeded_on_first_import() -> None:
    code = DRAWS + (
        "import torch\n"
        "first = torch.rand(3).tolist()\n"
        "torch.manual_seed(11)\n"
        "out['match'] = first == torch.rand(3).tolist()\n"
        "print(json.dumps(out))"
    )
    assert _run(code, "11")["match"] is True


def test_already_imported_module_is_seeded_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # drop the import hook afterwards
    numpy.random.seed(1)
    noise = numpy.random.rand()
    info = seed_from_env({"DIT_SEED": "1"})
    assert info is not None and "numpy" in info["now"]
    assert numpy.random.rand() == noise  # re-seeded with 1 by seed_from_env
