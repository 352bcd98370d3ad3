"""The tabulated / vectorised forms of the model agree with the reference evaluation."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dit.analysis.delay import (
    DelayModel,
    Objective,
    Policy,
    batch_delays,
    batch_objective,
    build_tables,
    evaluate,
    objective_value,
    synthetic_model,
)
from dit.optimise import Problem
from dit.optimise.exhaustive import block_delays, blocks, decode, split_point, vector_count

CASES = [(policy, objective) for policy in ("RR", "SJF") for objective in ("total_delay", "variance")]


def every_vector(bounds: tuple[int, ...]) -> np.ndarray:
    return np.array(list(itertools.product(*(range(b + 1) for b in bounds))), dtype=np.int64)


@pytest.mark.parametrize("policy", ["RR", "SJF"])
@pytest.mark.parametrize("seed", range(6))
def test_batch_delays_match_reference(policy: Policy, seed: int) -> None:
    rng = np.random.default_rng(seed)
    devices, stages = int(rng.integers(2, 5)), int(rng.integers(3, 7))
    model = synthetic_model(rng, devices, stages)
    vectors = every_vector(model.bounds)
    batch = batch_delays(build_tables(model, policy), vectors)
    for row, vector in zip(batch, vectors.tolist(), strict=True):
        assert row == pytest.approx(evaluate(model, vector, policy).delay_ns, rel=1e-12)


def zero_stage_model() -> DelayModel:
    """Stages of zero latency at the edge make different partition points tie on workload."""
    return DelayModel(
        devices=("a", "b", "c"),
        edge_stage_ns=(0.0, 2.0, 0.0, 3.0),
        cum_latency_ns=((0, 1, 2, 3, 4),) * 3,
        cut_bytes=((10, 10, 10, 10, 10),) * 3,
        rate_bps=(8e9,) * 3,
        rtt_ns=(0.0,) * 3,
    )


@pytest.mark.parametrize("policy", ["RR", "SJF"])
def test_batch_handles_workload_ties_between_partition_points(policy: Policy) -> None:
    model = zero_stage_model()
    vectors = every_vector(model.bounds)
    batch = batch_delays(build_tables(model, policy), vectors)
    for row, vector in zip(batch, vectors.tolist(), strict=True):
        assert tuple(row) == evaluate(model, vector, policy).delay_ns


@pytest.mark.parametrize(("policy", "objective"), CASES)
@pytest.mark.parametrize("seed", range(4))
def test_exhaustive_blocks_cover_the_grid_in_lexicographic_order(
    policy: Policy, objective: Objective, seed: int
) -> None:
    rng = np.random.default_rng(100 + seed)
    devices, stages = int(rng.integers(2, 6)), int(rng.integers(3, 9))
    bounds = tuple(int(b) for b in rng.integers(1, stages + 1, size=devices))
    model = synthetic_model(rng, devices, stages, bounds)
    problem = Problem(model, policy, objective)
    values = np.concatenate([v.ravel() for _, v in blocks(problem, build_tables(model, policy))])
    vectors = decode(np.arange(vector_count(bounds)), bounds)
    assert values.shape == (vector_count(bounds),)
    expected = batch_objective(batch_delays(build_tables(model, policy), vectors), objective)
    assert values == pytest.approx(expected, rel=1e-12)
    for k in rng.integers(0, len(vectors), size=20):
        ref = objective_value(evaluate(model, vectors[k].tolist(), policy).delay_ns, objective)
        assert values[k] == pytest.approx(ref, rel=1e-9)


def test_block_split_and_shapes() -> None:
    assert split_point((9, 9, 9, 9, 19, 24), block=1 << 16) == 2  # 10 * 10 * 20 * 25 = 50,000
    assert split_point((3, 3), block=1) == 1  # at least one device in the block
    model = synthetic_model(np.random.default_rng(0), 3, 4, (2, 3, 4))
    tables = build_tables(model, "RR")
    delays = block_delays(tables, (2, 3, 4), (1,))
    assert [d.shape for d in delays] == [(4, 5)] * 3
    # the block's entry [2, 4] is the vector (1, 2, 4)
    assert [float(d[2, 4]) for d in delays] == pytest.approx(evaluate(model, (1, 2, 4), "RR").delay_ns)


def test_decode_is_lexicographic() -> None:
    assert decode(np.arange(6), (1, 2)).tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
