"""optimise_run on hand-assembled run directories, the registry, and the result file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from dit.analysis.run import AggregateError
from dit.optimise import OptimiseError, Problem, SearchResult, TooManyVectorsError, registry
from dit.optimise.api import optimise_run, parse_vector, resolve_settings

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MS = 1_000_000


@pytest.fixture
def small(tmp_path: Path) -> Path:
    target = tmp_path / "run_small"
    shutil.copytree(FIXTURES / "run_small", target)
    return target


def test_defaults_come_from_the_scenario_and_aggregate_runs_first(small: Path) -> None:
    # scenario: optimisation {algorithm: greedy, objective: total_delay, policy: SJF}; no aggregate/ yet
    result = optimise_run(small, None, None, None, None)
    assert (small / "aggregate" / "layers.csv").is_file()
    assert (result.algorithm, result.objective, result.policy) == ("greedy", "total_delay", "SJF")
    assert result.vector == (2, 1)
    # device1 p=2: L 3.2, T 4 + 1.5, R 1.5 ms; device2 p=1: L 2.2, T 4 + 2.5, R 1.5 + 2.5 ms
    assert result.local_ns == (3_200_000, 2_200_000)
    assert result.transmission_ns == (5_500_000, 6_500_000)
    assert result.remote_ns == (1_500_000, 4_000_000)
    assert result.delay_ns == (10_200_000, 12_700_000)
    assert result.objective_value == pytest.approx(22.9 * MS)
    assert result.output_path == small / "optimise" / "greedy-total_delay-SJF.json"
    saved = json.loads(result.output_path.read_text())
    assert saved == json.loads(result.to_json())
    assert saved["vector"] == [2, 1]
    assert saved["per_device"][1] == {
        "device": "device2",
        "partition_point": 1,
        "L_ns": 2_200_000,
        "T_ns": 6_500_000,
        "R_ns": 4_000_000,
        "D_ns": 12_700_000,
        "max_partition_point": 1,
    }
    assert saved["vectors_evaluated"] == 3
    assert isinstance(saved["search_wall_ns"], int)
    assert saved["algorithm"] == "greedy"
    assert saved["policy"] == "SJF"
    assert saved["objective"] == "total_delay"


def test_explicit_settings_override_the_scenario(small: Path) -> None:
    result = optimise_run(small, "exhaustive", "variance", "RR", None)
    assert result.vector == (1, 0)  # ties with (1, 1) at 0.04 ms^2: lexicographically first
    assert result.objective_value == pytest.approx(0.04 * MS * MS)
    assert result.vectors_evaluated == 6
    assert result.output_path.name == "exhaustive-variance-RR.json"


def test_policy_is_case_insensitive(small: Path) -> None:
    assert optimise_run(small, "trend", None, "rr", None).policy == "RR"


def test_vector_is_evaluated_not_searched(small: Path) -> None:
    result = optimise_run(small, "exhaustive", None, "SJF", [0, 1])
    assert result.algorithm == "vector"
    assert result.vector == (0, 1)
    assert result.delay_ns == (19_000_000, 11_200_000)
    assert result.vectors_evaluated == 1
    assert result.feasible
    assert result.output_path.name == "vector-total_delay-SJF.json"


def test_vector_outside_the_feasible_range_is_evaluated_and_flagged(small: Path) -> None:
    result = optimise_run(small, None, None, "SJF", [3, 0])
    assert not result.feasible
    assert result.delay_ns == (6_200_000, 11_500_000)
    assert json.loads(result.to_json())["feasible"] is False


def test_bad_vectors(small: Path) -> None:
    with pytest.raises(OptimiseError, match="3 entries"):
        optimise_run(small, None, None, None, [0, 1, 2])
    with pytest.raises(OptimiseError, match=r"device2: partition point 9 is outside 0\.\.3"):
        optimise_run(small, None, None, None, [0, 9])


def test_exhaustive_limit_reaches_the_caller(small: Path) -> None:
    with pytest.raises(TooManyVectorsError, match=r"6 vectors .* limit of 5"):
        optimise_run(small, "exhaustive", None, None, None, max_vectors=5)


def test_unknown_names(small: Path) -> None:
    with pytest.raises(
        OptimiseError, match="unknown optimiser 'annealing'; available: exact, exhaustive, greedy, trend"
    ):
        optimise_run(small, "annealing", None, None, None)
    with pytest.raises(OptimiseError, match="unknown objective 'latency'"):
        optimise_run(small, None, "latency", None, None)
    with pytest.raises(OptimiseError, match=r"objective energy: .*need a power model for every device"):
        optimise_run(small, None, "energy", None, None)
    with pytest.raises(OptimiseError, match="unknown policy 'FIFO'"):
        optimise_run(small, None, None, "FIFO", None)


def test_works_from_the_three_files_and_the_scenario_alone(small: Path, tmp_path: Path) -> None:
    optimise_run(small, None, None, None, None)  # produces aggregate/
    bare = tmp_path / "bare"
    (bare / "aggregate").mkdir(parents=True)
    shutil.copy(small / "scenario.yaml", bare / "scenario.yaml")
    for name in ("layers.csv", "links.csv", "feasibility.csv"):
        shutil.copy(small / "aggregate" / name, bare / "aggregate" / name)
    result = optimise_run(bare, "exhaustive", "total_delay", "RR", None)
    assert result.vector == (2, 1)
    assert result.objective_value == pytest.approx(22.9 * MS)


def test_no_aggregate_and_no_raw_fails_clearly(tmp_path: Path) -> None:
    (tmp_path / "scenario.yaml").write_text("devices: [a]\n")
    with pytest.raises(AggregateError, match="run the aggregate stage first"):
        optimise_run(tmp_path, None, None, None, None)


def test_render_table(small: Path) -> None:
    result = optimise_run(small, None, None, None, None)
    console = Console(record=True, width=120)
    console.print(result.render_table())
    text = console.export_text()
    assert "device2" in text
    assert "12.700" in text  # D of device2 in ms
    assert "22.900 ms" in text


def test_resolve_settings_fallbacks() -> None:
    assert resolve_settings({"edge_server": {"policy": "SJF"}}, None, None, None) == (
        "greedy",
        "total_delay",
        "SJF",
    )
    assert resolve_settings({}, None, None, None) == ("greedy", "total_delay", "RR")


def test_parse_vector() -> None:
    assert parse_vector("2,4, 8,11") == [2, 4, 8, 11]
    with pytest.raises(OptimiseError, match="comma-separated"):
        parse_vector("2;4")


def test_registry_lists_the_builtins() -> None:
    assert {"exhaustive", "greedy", "trend"} <= set(registry.available())
    assert registry.available()["greedy"] == "dit.optimise.greedy:greedy"
    assert registry.load("trend").__name__ == "trend"


def test_a_misbehaving_plugin_is_reported(small: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def outside(problem: Problem) -> SearchResult:
        return SearchResult((3, 3), 0.0, 1)

    monkeypatch.setattr(registry, "load", lambda name: outside)
    with pytest.raises(OptimiseError, match=r"returned \[3, 3\], outside the feasible ranges"):
        optimise_run(small, "outside", None, None, None)


def test_exact_through_dit_optimise_matches_exhaustive_on_a_run(small: Path) -> None:
    pytest.importorskip("highspy", reason="the sim extra (HiGHS) is not installed")
    exact = optimise_run(small, "exact", "total_delay", "SJF", None)
    best = optimise_run(small, "exhaustive", "total_delay", "SJF", None)
    assert exact.objective_value == pytest.approx(best.objective_value)
    assert exact.output_path.name == "exact-total_delay-SJF.json" and exact.output_path.is_file()
