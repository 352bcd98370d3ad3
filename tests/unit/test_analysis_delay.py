"""The delay model against hand-computed cases (all values in ms-sized integers of ns, exact in floats)."""

from __future__ import annotations

import pytest

from dit.analysis.delay import (
    DelayModel,
    DelayModelError,
    evaluate,
    objective_value,
    remote_rr,
    remote_sjf,
    transmission_ns,
)

MS = 1_000_000


def small_model() -> DelayModel:
    """The model of tests/fixtures/run_small: 2 devices, 3 stages, edge stages 0.5 / 1.0 / 1.5 ms."""
    return DelayModel(
        devices=("device1", "device2"),
        edge_stage_ns=(0.5 * MS, 1.0 * MS, 1.5 * MS),
        cum_latency_ns=((0, 1.1 * MS, 3.2 * MS, 6.2 * MS), (0, 2.2 * MS, 6.4 * MS, 12.4 * MS)),
        cut_bytes=((12000, 8000, 4000, 400), (12000, 8000, 4000, 400)),
        rate_bps=(8e6, 16e6),
        rtt_ns=(3 * MS, 5 * MS),
        max_partition_point=(2, 1),
    )


# ------------------------------------------------------------------ the remote term on stage lists


def test_rr_mixed_lengths_and_an_empty_request() -> None:
    # round 1: d0 1 -> t=1, d1 4 -> t=5 (d1 done), d3 5 -> t=10; round 2: d0 2 -> 12, d3 6 -> 18 (d3 done);
    # round 3: d0 3 -> 21 (d0 done); d2 offloads nothing.
    assert remote_rr([(1, 2, 3), (4,), (), (5, 6)]) == [21, 5, 0, 18]


def test_rr_equal_lengths_follow_device_order_within_a_round() -> None:
    # round 1: 1 -> 1, 2 -> 3; round 2: 1 -> 4 (d0), 2 -> 6 (d1)
    assert remote_rr([(1, 1), (2, 2)]) == [4, 6]
    # identical requests: the later device always finishes one stage later
    assert remote_rr([(2,), (2,)]) == [2, 4]


def test_rr_longer_request_earlier_in_device_order() -> None:
    # d0 (3 stages of 1), d1 (1 stage of 10): round 1: 1 -> 1, 10 -> 11 (d1); rounds 2, 3: d0 -> 12, 13
    assert remote_rr([(1, 1, 1), (10,)]) == [13, 11]


def test_sjf_orders_by_workload() -> None:
    # W = 6, 4, -, 11: d1 first (4), then d0 (10), then d3 (21); d2 is not served
    assert remote_sjf([(1, 2, 3), (4,), (), (5, 6)]) == [10, 4, 0, 21]


def test_sjf_ties_follow_device_order() -> None:
    assert remote_sjf([(3,), (1, 2), (3,)]) == [3, 6, 9]
    assert remote_sjf([(2, 2), (1,), (4,)]) == [5, 1, 9]


def test_nothing_offloaded() -> None:
    assert remote_rr([(), ()]) == [0, 0]
    assert remote_sjf([(), ()]) == [0, 0]


# ------------------------------------------------------------------ the whole model


def test_transmission_term() -> None:
    model = small_model()
    # 12000 B * 8 / 8 Mbit/s = 12 ms, + RTT/2 = 1.5 ms
    assert transmission_ns(model, 0, 0) == 13.5 * MS
    # 8000 B * 8 / 16 Mbit/s = 4 ms, + 2.5 ms
    assert transmission_ns(model, 1, 1) == 6.5 * MS
    # p = N sends nothing: no RTT either
    assert transmission_ns(model, 0, 3) == 0


def test_sjf_vector_with_p0() -> None:
    # (0, 1): W1 = 3.0 ms, W2 = 2.5 ms -> device2 first: R2 = 2.5, R1 = 5.5
    b = evaluate(small_model(), (0, 1), "SJF")
    assert b.local_ns == (0, 2.2 * MS)
    assert b.transmission_ns == (13.5 * MS, 6.5 * MS)
    assert b.remote_ns == (5.5 * MS, 2.5 * MS)
    assert b.delay_ns == (19.0 * MS, 11.2 * MS)
    assert b.objective("total_delay") == 30.2 * MS


def test_rr_vector_with_p0() -> None:
    # (0, 1): S1 = (0.5, 1, 1.5), S2 = (1, 1.5); round 1: 0.5 -> 0.5, 1 -> 1.5; round 2: 1 -> 2.5,
    # 1.5 -> 4.0 (device2 done); round 3: 1.5 -> 5.5 (device1 done)
    b = evaluate(small_model(), (0, 1), "RR")
    assert b.remote_ns == (5.5 * MS, 4.0 * MS)
    assert b.delay_ns == (19.0 * MS, 12.7 * MS)


def test_sjf_tie_on_equal_partition_points() -> None:
    # (0, 0): W = 3, 3 -> device order: R1 = 3, R2 = 6
    b = evaluate(small_model(), (0, 0), "SJF")
    assert b.remote_ns == (3 * MS, 6 * MS)
    assert b.delay_ns == (16.5 * MS, 14.5 * MS)


def test_rr_tie_on_equal_partition_points() -> None:
    # (0, 0): rounds of 0.5, 1, 1.5 for both: 0.5, 1.0 | 2.0, 3.0 | 4.5 (device1), 6.0 (device2)
    b = evaluate(small_model(), (0, 0), "RR")
    assert b.remote_ns == (4.5 * MS, 6.0 * MS)


@pytest.mark.parametrize("policy", ["RR", "SJF"])
def test_p_equals_n_runs_everything_locally(policy: str) -> None:
    # device1 at p = N: L = 6.2, T = 0, R = 0; device2 alone at the server: R = W(0) = 3.0
    b = evaluate(small_model(), (3, 0), policy)  # type: ignore[arg-type]
    assert b.local_ns == (6.2 * MS, 0)
    assert b.transmission_ns == (0, 8.5 * MS)
    assert b.remote_ns == (0, 3.0 * MS)
    assert b.delay_ns == (6.2 * MS, 11.5 * MS)


def test_all_local() -> None:
    b = evaluate(small_model(), (3, 3), "RR")
    assert b.delay_ns == (6.2 * MS, 12.4 * MS)
    assert b.remote_ns == (0, 0)


def test_objectives() -> None:
    assert objective_value([19.0 * MS, 11.2 * MS], "total_delay") == 30.2 * MS
    # population variance of two values: ((a - b) / 2)^2
    assert objective_value([14.0, 10.0], "variance") == 4.0
    assert objective_value([1.0, 2.0, 3.0, 4.0], "variance") == 1.25
    with pytest.raises(DelayModelError, match="unknown objective"):
        objective_value([1.0], "fastest")  # type: ignore[arg-type]


def test_unknown_policy_and_bad_vectors() -> None:
    model = small_model()
    with pytest.raises(DelayModelError, match="unknown policy 'FIFO'"):
        evaluate(model, (0, 0), "FIFO")  # type: ignore[arg-type]
    with pytest.raises(DelayModelError, match="2 devices"):
        evaluate(model, (0, 0, 0), "RR")
    with pytest.raises(DelayModelError, match=r"device2: partition point 4 is outside 0\.\.3"):
        evaluate(model, (0, 4), "RR")


def test_model_validation_messages() -> None:
    with pytest.raises(DelayModelError, match="cum_latency_ns\\[0\\] must be 0"):
        DelayModel(("d",), (1.0,), ((5.0, 6.0),), ((1.0, 1.0),), (1e6,), (0.0,))
    with pytest.raises(DelayModelError, match="rate_bps must be > 0"):
        DelayModel(("d",), (1.0,), ((0.0, 6.0),), ((1.0, 1.0),), (0.0,), (0.0,))
    with pytest.raises(DelayModelError, match="N\\+1 = 2 entries"):
        DelayModel(("d",), (1.0,), ((0.0,),), ((1.0, 1.0),), (1e6,), (0.0,))
    with pytest.raises(DelayModelError, match=r"max_partition_point 5 is outside 0\.\.1"):
        DelayModel(("d",), (1.0,), ((0.0, 1.0),), ((1.0, 1.0),), (1e6,), (0.0,), (5,))


def test_feasibility_of_vectors() -> None:
    model = small_model()
    assert model.bounds == (2, 1)
    assert model.is_feasible((2, 1))
    assert not model.is_feasible((3, 1))
