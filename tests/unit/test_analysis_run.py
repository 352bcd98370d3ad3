"""dit.analysis.run: one LoadedRun reads scenario.yaml once for every analysis step."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import dit.analysis.run as run_module
from dit.analysis.aggregate import aggregate_run, read_model_inputs
from dit.analysis.model_validation import validate_run
from dit.analysis.monitors import aggregate_monitors
from dit.analysis.run import AggregateError, LoadedRun
from dit.conditions.netem.check import aggregate_network
from dit.optimise.api import optimise_run

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def small(tmp_path: Path) -> Path:
    target = tmp_path / "run_small"
    shutil.copytree(FIXTURES / "run_small", target)
    return target


def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    reads: list[Path] = []
    real = run_module.load_yaml

    def load_yaml(source: Any) -> dict[str, Any]:
        reads.append(Path(source))
        return real(source)

    monkeypatch.setattr(run_module, "load_yaml", load_yaml)
    return reads


def test_every_analysis_step_shares_one_read_of_the_scenario(
    small: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = count_reads(monkeypatch)
    run = LoadedRun(small)
    summary = aggregate_run(run)
    aggregate_network(run)
    aggregate_monitors(run)
    validation = validate_run(run)
    result = optimise_run(run, None, None, None, None)
    read_model_inputs(run)
    assert reads == [small / "scenario.yaml"]
    assert summary.devices == ("device1", "device2") == run.devices
    assert validation.points > 0
    assert result.vector == (2, 1)


def test_a_path_is_loaded_per_call(small: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = count_reads(monkeypatch)
    aggregate_run(small)
    read_model_inputs(small)
    assert len(reads) == 2


def test_round_vectors_expand_like_the_scenario_loader(tmp_path: Path) -> None:
    (tmp_path / "scenario.yaml").write_text(
        "devices: [a, b]\ninference: {partition_points: [0, [1, 2], 3]}\n"
    )
    assert LoadedRun(tmp_path).round_vectors() == [(0, 0), (1, 2), (3, 3)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "scenario.yaml does not exist"),
        ("devices: [a, a]\n", r"devices has duplicates: \['a', 'a'\]"),
        ("devices: []\n", "devices must be a non-empty list"),
        ("- a\n", "the top level must be a mapping"),
        ("devices: [a]\ndevices: [b]\n", "scenario.yaml: .*devices"),
    ],
)
def test_a_bad_scenario_is_refused_naming_the_file(tmp_path: Path, text: str | None, message: str) -> None:
    if text is not None:
        (tmp_path / "scenario.yaml").write_text(text)
    with pytest.raises(AggregateError, match=message):
        _ = LoadedRun(tmp_path).devices
