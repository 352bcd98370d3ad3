"""dit.sim.fit: the fit recovers the parameters of figures the simulator itself made, and the shipped
``scenarios/sim/rack4_pi4.yaml`` is the fit of the article's figures (its parameters give the
residuals it states)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import yaml

pytest.importorskip("simpy", reason="the sim extra (SimPy) is not installed")

from dit.sim.fit import (
    ARTICLE_SECONDS,
    ARTICLE_SHARES,
    Board,
    Rack,
    SweepRow,
    Targets,
    board_of,
    crossover_ms,
    fit,
    levenberg_marquardt,
    simulate_rack,
)
from tests.conftest import REPO

RACK_FILE = REPO / "scenarios" / "sim" / "rack4_pi4.yaml"
# few tokens: the same simulation as 256, at a cost a unit test can pay
SMALL = Rack(tokens=6, prompt_tokens=4)


def test_levenberg_marquardt_solves_a_bounded_least_squares_problem() -> None:
    # y = a * t + b on three points, b bounded below by 1 where the free optimum is 0.5
    t = np.array([0.0, 1.0, 2.0])
    y = 2.0 * t + 0.5
    x, r = levenberg_marquardt(
        lambda v: v[0] * t + v[1] - y, np.array([1.0, 3.0]), np.array([0.0, 1.0]), np.array([1e-6, 1e-6])
    )
    assert x[1] == pytest.approx(1.0, abs=1e-6)  # at the bound
    assert x[0] == pytest.approx(1.7, abs=1e-3)  # the least-squares slope given b = 1
    assert float(r @ r) == pytest.approx(0.3, abs=1e-6)


def figures(board: Board) -> Targets:
    """The three placements' seconds and layer-wise's shares that ``board`` gives on the small rack."""
    made = simulate_rack(board, SMALL)
    return Targets(
        {p: o.seconds for p, o in made.items()},
        {"layerwise": (made["layerwise"].attention_share, made["layerwise"].ffn_share)},
    )


def test_the_fit_recovers_the_parameters_of_figures_the_simulator_made() -> None:
    # the article's kind of board: FFN fast, heads slow (dispatch), a message 1.5 ms one way
    truth = Board(12e9, 1.5e-3, 2e-4, 1.5e9)
    got = fit(SMALL, figures(truth), starts=[Board(6e9, 4e-3, 1e-4, 3e9)], coarse_tokens=None)
    assert got.worst < 1e-3  # every figure reproduced
    assert got.board.flops_per_s == pytest.approx(truth.flops_per_s, rel=0.02)
    assert got.board.head_flops_per_s == pytest.approx(truth.head_flops_per_s, rel=0.02)
    assert got.board.one_way_s == pytest.approx(truth.one_way_s, rel=0.02)
    assert got.board.call_s == pytest.approx(truth.call_s, rel=0.05)


def test_with_one_rate_the_three_times_do_not_tell_the_rate_from_the_call_cost() -> None:
    # Round-robin and greedy put 3 calls a layer and the same compute on the critical path, so their
    # times are two nearly equal equations: the fit reproduces the three figures, but on a ridge
    # where a faster board with dearer calls fits as well (why the shipped fit also matches the
    # layer-wise shares, with the heads' rate free).
    truth = Board(8e9, 2e-3, 3e-4)
    made = figures(truth)
    got = fit(
        SMALL,
        Targets(made.seconds),
        attention_rate=False,
        starts=[Board(16e9, 1e-3, 1e-4)],
        coarse_tokens=None,
    )
    assert got.worst < 5e-3
    assert abs(got.board.flops_per_s / truth.flops_per_s - 1) > 0.05
    assert abs(got.board.call_s / truth.call_s - 1) > 0.5


def test_the_crossover_is_where_layer_wise_catches_up() -> None:
    rows = [
        SweepRow(0, {"layerwise": 60.0, "greedy": 40.0}),
        SweepRow(10, {"layerwise": 70.0, "greedy": 60.0}),
        SweepRow(20, {"layerwise": 80.0, "greedy": 100.0}),
    ]
    # speedup 1.167 at +10 ms, 0.8 at +20 ms: 1 at 10 + 10 * 0.167 / 0.367
    assert crossover_ms(rows, "greedy") == pytest.approx(10 + 10 * (1 / 6) / (1 / 6 + 0.2), rel=1e-9)
    assert crossover_ms(rows[:2], "greedy") is None


def stated_residuals() -> dict[str, float]:
    """The residuals the shipped file's comments state (``#   name +1.2 %``), as fractions."""
    text = RACK_FILE.read_text(encoding="utf-8")
    found = re.findall(r"^#   ([A-Za-z][A-Za-z ]+?) ([+-]\d+\.\d) %$", text, flags=re.MULTILINE)
    return {name: float(value) / 100 for name, value in found}


def test_the_shipped_rack_gives_the_residuals_it_states() -> None:
    doc = yaml.safe_load(RACK_FILE.read_text(encoding="utf-8"))
    board = board_of(doc)
    stated = stated_residuals()
    assert set(stated) >= {f"{p} seconds" for p in ARTICLE_SECONDS}
    targets = Targets(dict(ARTICLE_SECONDS), {"layerwise": ARTICLE_SHARES["layerwise"]})
    got = simulate_rack(board, Rack(), targets.placements())
    sim, want = targets.values(got)
    for name, s, w in zip(targets.names(), sim, want, strict=True):
        assert s / w - 1 == pytest.approx(stated[name], abs=0.0011), name  # stated to 0.1 %


@pytest.mark.slow
def test_the_shipped_rack_is_where_the_fit_stops() -> None:
    # the fit started at the shipped parameters does not move them (beyond what the file's four
    # significant digits round): the file is the fit's optimum, not a hand-tuned point. One iteration
    # is enough to see it (8 simulations of 256 tokens against 14 for two): from a board 3 % off in
    # either rate, or 10 % in the call time, the first step already moves it back by more than 1 %.
    board = board_of(yaml.safe_load(RACK_FILE.read_text(encoding="utf-8")))
    got = fit(Rack(), starts=[board], coarse_tokens=None, max_iterations=1)
    for name in ("flops_per_s", "one_way_s", "call_s", "head_flops_per_s"):
        assert getattr(got.board, name) == pytest.approx(getattr(board, name), rel=0.01, abs=1e-6), name
