"""Slow tests build the real TensorFlow / PyTorch models: weights in one directory per session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def weights_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``$DIT_WEIGHTS_DIR`` when set (CI may keep it between runs), else a session temporary dir."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    old = os.environ.get("DIT_WEIGHTS_DIR")
    path = Path(old) if old else tmp_path_factory.mktemp("weights")
    os.environ["DIT_WEIGHTS_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("DIT_WEIGHTS_DIR", None)
