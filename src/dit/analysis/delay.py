"""The thesis' delay model of partitioned inference, as pure functions.

Notation (docs/optimisers.md has the full derivation). ``n`` devices in device order (the order of the
scenario's ``devices`` list), a model of ``N`` stages, partition point ``p_i`` in 0..N for device ``i``:
stages 1..p_i run on the device, the output of stage ``p_i`` is sent to the edge server, which runs
stages p_i+1..N. The edge server's per-stage latencies are ``s_1..s_N``.

- local        ``L_i = cum_latency_ns[i][p_i]`` (0 when ``p_i = 0``)
- transmission ``T_i = 0`` if ``p_i = N`` else ``bytes_i(p_i) * 8 / rate_i + RTT_i / 2`` (in ns)
- remote       the request's remote stages ``S_i = (s_{p_i+1}, ..., s_N)``, workload ``W_i = sum(S_i)``,
  ``n_i = |S_i|``; every request is present at the server at time 0 (the thesis' model):

  * **SJF**: requests with ``n > 0`` are served one after another in ascending ``W`` (ties: device order);
    ``R_i = W_i + sum of W_j over the requests ranked ahead of i``.
  * **RR**: in round r = 1, 2, ... the server executes the r-th stage of every request with >= r remaining
    stages, in device order; ``R_i`` is the completion time of i's last stage:
    ``R_i = sum_{r < n_i} sum_{j: n_j >= r} S_j[r] + sum_{j <= i, n_j >= n_i} S_j[n_i]``.

  ``R_i = 0`` when ``n_i = 0`` (p_i = N: nothing is offloaded).
- device delay ``D_i = L_i + T_i + R_i``; objectives ``total_delay = sum D_i`` (ns) and ``variance`` =
  population variance of the ``D_i`` (ns^2, fairness).
- energy (when the model carries each device's power model ``P_idle``, ``P_comp``, ``P_tx`` in W,
  :mod:`dit.analysis.power_model`): ``E_i = P_comp,i * L_i + P_tx,i * T_i + P_idle,i * R_i`` (the device
  computes, transmits, then waits at idle for the result); objectives ``energy = sum E_i`` (J) and
  ``edp = energy * total_delay`` (J*s, the delay in seconds).

:func:`evaluate` is the reference implementation, written literally from the formulas above.
:class:`Tables` and :func:`batch_delays` are the same model rearranged for numpy: both policies reduce to
``D_i = LT_i[p_i] + W[p_i] + sum_{j<i} F[p_i, p_j] + sum_{j>i} G[p_i, p_j]`` with (N+1) x (N+1) tables
``F``, ``G`` that depend only on the edge's stage latencies and the policy, which is what makes an
exhaustive search over millions of vectors cheap. The unit tests check the two against each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

Policy = Literal["RR", "SJF"]
Objective = Literal["total_delay", "variance", "energy", "edp"]

POLICIES: Final[tuple[Policy, ...]] = ("RR", "SJF")
OBJECTIVES: Final[tuple[Objective, ...]] = ("total_delay", "variance", "energy", "edp")
DELAY_OBJECTIVES: Final[tuple[Objective, ...]] = ("total_delay", "variance")
ENERGY_OBJECTIVES: Final[tuple[Objective, ...]] = ("energy", "edp")
OBJECTIVE_UNITS: Final[dict[str, str]] = {
    "total_delay": "ns",
    "variance": "ns^2",
    "energy": "J",
    "edp": "J*s",
}
J_PER_W_NS: Final = 1e-9

NS_PER_S: Final = 1_000_000_000

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class DelayModelError(ValueError):
    """The inputs of the delay model are inconsistent (shapes, negative values, bad vector)."""


def check_policy(policy: str) -> Policy:
    """Return ``policy`` as a :data:`Policy` or raise naming the valid ones."""
    if policy not in POLICIES:
        raise DelayModelError(f"unknown policy {policy!r}; valid: {', '.join(POLICIES)}")
    return policy


def check_objective(objective: str) -> Objective:
    """Return ``objective`` as an :data:`Objective` or raise naming the valid ones."""
    if objective not in OBJECTIVES:
        raise DelayModelError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}")
    return objective


@dataclass(frozen=True)
class DevicePower:
    """A device's power model (W): idle, while computing, while transmitting."""

    idle_w: float
    compute_w: float
    transmit_w: float

    def __post_init__(self) -> None:
        for name in ("idle_w", "compute_w", "transmit_w"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and np.isfinite(value) and value >= 0):
                raise DelayModelError(f"power model: {name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class DelayModel:
    """Everything the model needs, in nanoseconds, bytes and bits per second.

    ``cum_latency_ns[i][p]`` and ``cut_bytes[i][p]`` are indexed by partition point p = 0..N;
    ``cum_latency_ns[i][0]`` must be 0 and ``cut_bytes[i][N]`` is never used (nothing is sent at p = N).
    ``max_partition_point[i]`` is device i's feasible maximum (defaults to N for every device).
    ``power[i]`` is device i's power model, needed only by the ``energy`` and ``edp`` objectives.
    """

    devices: tuple[str, ...]
    edge_stage_ns: tuple[float, ...]
    cum_latency_ns: tuple[tuple[float, ...], ...]
    cut_bytes: tuple[tuple[float, ...], ...]
    rate_bps: tuple[float, ...]
    rtt_ns: tuple[float, ...]
    max_partition_point: tuple[int, ...] | None = None
    power: tuple[DevicePower, ...] | None = None

    def __post_init__(self) -> None:
        n, big_n = len(self.devices), len(self.edge_stage_ns)
        if self.power is not None and len(self.power) != n:
            raise DelayModelError(f"power has {len(self.power)} entries for {n} devices")
        if n == 0:
            raise DelayModelError("the delay model needs at least one device")
        if big_n == 0:
            raise DelayModelError("the delay model needs at least one stage")
        if len(set(self.devices)) != n:
            raise DelayModelError(f"duplicate devices in {self.devices}")
        for name, seq in (
            ("cum_latency_ns", self.cum_latency_ns),
            ("cut_bytes", self.cut_bytes),
            ("rate_bps", self.rate_bps),
            ("rtt_ns", self.rtt_ns),
        ):
            if len(seq) != n:
                raise DelayModelError(f"{name} has {len(seq)} entries for {n} devices")
        if any(s < 0 for s in self.edge_stage_ns):
            raise DelayModelError(f"edge_stage_ns has a negative latency: {self.edge_stage_ns}")
        for i, dev in enumerate(self.devices):
            cum, cut = self.cum_latency_ns[i], self.cut_bytes[i]
            if len(cum) != big_n + 1 or len(cut) != big_n + 1:
                raise DelayModelError(
                    f"{dev}: cum_latency_ns and cut_bytes need N+1 = {big_n + 1} entries (p = 0..N), "
                    f"got {len(cum)} and {len(cut)}"
                )
            if cum[0] != 0:
                raise DelayModelError(f"{dev}: cum_latency_ns[0] must be 0, got {cum[0]}")
            if any(c < 0 for c in cum) or any(b < 0 for b in cut):
                raise DelayModelError(f"{dev}: negative latency or byte count")
            if not self.rate_bps[i] > 0:
                raise DelayModelError(f"{dev}: rate_bps must be > 0, got {self.rate_bps[i]}")
            if not self.rtt_ns[i] >= 0:
                raise DelayModelError(f"{dev}: rtt_ns must be >= 0, got {self.rtt_ns[i]}")
        if self.max_partition_point is not None:
            if len(self.max_partition_point) != n:
                raise DelayModelError(f"max_partition_point has {len(self.max_partition_point)} entries")
            for dev, m in zip(self.devices, self.max_partition_point, strict=True):
                if not 0 <= m <= big_n:
                    raise DelayModelError(f"{dev}: max_partition_point {m} is outside 0..{big_n}")

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def num_stages(self) -> int:
        """N."""
        return len(self.edge_stage_ns)

    @property
    def bounds(self) -> tuple[int, ...]:
        """Each device's feasible maximum partition point."""
        if self.max_partition_point is None:
            return (self.num_stages,) * self.num_devices
        return self.max_partition_point

    def check_vector(self, vector: Sequence[int]) -> tuple[int, ...]:
        """Return ``vector`` as a tuple after checking its length and that every p is in 0..N."""
        vec = tuple(int(p) for p in vector)
        if len(vec) != self.num_devices:
            raise DelayModelError(
                f"vector {list(vec)} has {len(vec)} entries for the {self.num_devices} devices "
                f"{list(self.devices)}"
            )
        for dev, p in zip(self.devices, vec, strict=True):
            if not 0 <= p <= self.num_stages:
                raise DelayModelError(f"{dev}: partition point {p} is outside 0..{self.num_stages}")
        return vec

    def is_feasible(self, vector: Sequence[int]) -> bool:
        """True when every device's partition point is within [0, max_partition_point]."""
        return all(0 <= p <= m for p, m in zip(vector, self.bounds, strict=True))


@dataclass(frozen=True)
class DelayBreakdown:
    """Per-device terms (ns) of one partition vector under one policy."""

    vector: tuple[int, ...]
    policy: Policy
    local_ns: tuple[float, ...]
    transmission_ns: tuple[float, ...]
    remote_ns: tuple[float, ...]
    delay_ns: tuple[float, ...]

    def objective(self, objective: Objective) -> float:
        return objective_value(self.delay_ns, objective)


def objective_value(delays: Sequence[float], objective: Objective) -> float:
    """``total_delay``: the sum; ``variance``: the population variance (divide by n).

    The energy objectives need the per-device terms and the power model: :func:`objective_of`.
    """
    if objective == "total_delay":
        return float(sum(delays))
    if objective == "variance":
        mean = sum(delays) / len(delays)
        return float(sum((d - mean) ** 2 for d in delays) / len(delays))
    if objective in ENERGY_OBJECTIVES:
        raise DelayModelError(f"objective {objective!r} needs the power model: use objective_of")
    raise DelayModelError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}")


def require_power(model: DelayModel) -> tuple[DevicePower, ...]:
    """The model's power models, or an error saying where they come from."""
    if model.power is None:
        raise DelayModelError(
            "the energy objectives need a power model for every device (aggregate/power_model.csv, fitted "
            "from the run's power trace: give the devices a `power` monitor)"
        )
    return model.power


def energy_j(model: DelayModel, breakdown: DelayBreakdown) -> tuple[float, ...]:
    """E_i in J: computing for L_i, transmitting for T_i, idle while waiting R_i for the result."""
    power = require_power(model)
    return tuple(
        (pw.compute_w * loc + pw.transmit_w * tx + pw.idle_w * rem) * J_PER_W_NS
        for pw, loc, tx, rem in zip(
            power, breakdown.local_ns, breakdown.transmission_ns, breakdown.remote_ns, strict=True
        )
    )


def objective_of(model: DelayModel, breakdown: DelayBreakdown, objective: Objective) -> float:
    """Any objective of one evaluated vector: ns, ns^2, J (``energy``) or J*s (``edp``)."""
    if objective in DELAY_OBJECTIVES:
        return objective_value(breakdown.delay_ns, objective)
    if objective not in ENERGY_OBJECTIVES:
        raise DelayModelError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}")
    energy = float(sum(energy_j(model, breakdown)))
    if objective == "energy":
        return energy
    return energy * float(sum(breakdown.delay_ns)) / NS_PER_S


def local_ns(model: DelayModel, device: int, p: int) -> float:
    """L_i: the device's cumulative latency of stages 1..p (0 at p = 0)."""
    return model.cum_latency_ns[device][p]


def transmission_ns(model: DelayModel, device: int, p: int) -> float:
    """T_i: 0 at p = N, else bytes(p) * 8 / rate (in ns) + RTT / 2."""
    if p == model.num_stages:
        return 0.0
    return model.cut_bytes[device][p] * 8 * NS_PER_S / model.rate_bps[device] + model.rtt_ns[device] / 2


def remote_sjf(stage_lists: Sequence[Sequence[float]]) -> list[float]:
    """R_i under shortest-job-first for the requests' remote stage lists S_i, in device order."""
    workloads = [float(sum(s)) for s in stage_lists]
    order = sorted((i for i, s in enumerate(stage_lists) if len(s) > 0), key=lambda i: (workloads[i], i))
    remote = [0.0] * len(stage_lists)
    clock = 0.0
    for i in order:
        clock += workloads[i]
        remote[i] = clock
    return remote


def remote_rr(stage_lists: Sequence[Sequence[float]]) -> list[float]:
    """R_i under round-robin: one stage per request per round, rounds in device order.

    ``R_i = sum_{r < n_i} sum_{j: n_j >= r} S_j[r] + sum_{j <= i, n_j >= n_i} S_j[n_i]`` (1-based r).
    """
    counts = [len(s) for s in stage_lists]
    remote = [0.0] * len(stage_lists)
    for i, n_i in enumerate(counts):
        if n_i == 0:
            continue
        earlier_rounds = sum(
            stage_lists[j][r - 1] for r in range(1, n_i) for j in range(len(counts)) if counts[j] >= r
        )
        last_round = sum(stage_lists[j][n_i - 1] for j in range(i + 1) if counts[j] >= n_i)
        remote[i] = float(earlier_rounds + last_round)
    return remote


def remote_stage_lists(model: DelayModel, vector: Sequence[int]) -> list[list[float]]:
    """S_i = (s_{p_i+1}, ..., s_N) for every device."""
    return [list(model.edge_stage_ns[p:]) for p in vector]


def evaluate(model: DelayModel, vector: Sequence[int], policy: Policy) -> DelayBreakdown:
    """The reference evaluation of one partition vector: per-device L, T, R and D in ns."""
    vec = model.check_vector(vector)
    stage_lists = remote_stage_lists(model, vec)
    if policy == "SJF":
        remote = remote_sjf(stage_lists)
    elif policy == "RR":
        remote = remote_rr(stage_lists)
    else:
        raise DelayModelError(f"unknown policy {policy!r}; valid: {', '.join(POLICIES)}")
    loc = tuple(local_ns(model, i, p) for i, p in enumerate(vec))
    tx = tuple(transmission_ns(model, i, p) for i, p in enumerate(vec))
    delay = tuple(a + b + c for a, b, c in zip(loc, tx, remote, strict=True))
    return DelayBreakdown(vec, policy, loc, tx, tuple(remote), delay)


# --------------------------------------------------------------------------- vectorised form


@dataclass(frozen=True)
class Tables:
    """The model as lookup tables (see the module docstring).

    ``lt[i, p]`` = L_i(p) + T_i(p); ``w[p]`` = W(p); ``f[a, b]`` / ``g[a, b]`` = what a request at partition
    point b ahead of / behind (in device order) a request at partition point a adds to the latter's R.
    """

    lt: FloatArray
    w: FloatArray
    f: FloatArray
    g: FloatArray

    @property
    def width(self) -> int:
        """N + 1, the number of partition points."""
        return int(self.w.shape[0])


def _prefix(edge_stage_ns: Sequence[float]) -> FloatArray:
    """C[k] = s_1 + ... + s_k, C[0] = 0."""
    return np.concatenate(([0.0], np.cumsum(np.asarray(edge_stage_ns, dtype=np.float64))))


def build_tables(model: DelayModel, policy: Policy) -> Tables:
    """Tabulate the model for :func:`batch_delays`."""
    big_n = model.num_stages
    prefix = _prefix(model.edge_stage_ns)
    points = np.arange(big_n + 1)
    n_rem = big_n - points  # remaining stages per partition point
    w = prefix[big_n] - prefix
    w[big_n] = 0.0
    # rows: the request whose R we compute (partition point a); columns: another request (b)
    b = points[None, :]
    na, nb = n_rem[:, None], n_rem[None, :]
    active = (na > 0) & (nb > 0)
    if policy == "RR":
        # a request at b contributes its first min(n_b, n_a) stages if it is ahead in device order,
        # its first min(n_b, n_a - 1) stages if it is behind (A(b, m) = C[b + m] - C[b]).
        ahead = prefix[b + np.minimum(nb, na)] - prefix[b]
        behind = prefix[b + np.minimum(nb, np.maximum(na - 1, 0))] - prefix[b]
        f = np.where(na > 0, ahead, 0.0)
        g = np.where(na > 0, behind, 0.0)
    elif policy == "SJF":
        wa, wb = w[:, None], w[None, :]
        f = np.where(active & (wb <= wa), wb, 0.0)
        g = np.where(active & (wb < wa), wb, 0.0)
    else:
        raise DelayModelError(f"unknown policy {policy!r}; valid: {', '.join(POLICIES)}")
    lt = np.zeros((model.num_devices, big_n + 1), dtype=np.float64)
    for i in range(model.num_devices):
        for p in range(big_n + 1):
            lt[i, p] = local_ns(model, i, p) + transmission_ns(model, i, p)
    return Tables(lt=lt, w=w, f=np.ascontiguousarray(f), g=np.ascontiguousarray(g))


def batch_delays(tables: Tables, vectors: IntArray) -> FloatArray:
    """D for many vectors at once: ``vectors`` has shape (M, n), the result (M, n) in ns."""
    m, n = vectors.shape
    width = tables.width
    f_flat, g_flat = tables.f.ravel(), tables.g.ravel()
    out = np.empty((m, n), dtype=np.float64)
    for i in range(n):
        p_i = vectors[:, i]
        d_i = tables.lt[i].take(p_i) + tables.w.take(p_i)
        row = p_i * width
        for j in range(n):
            if j == i:
                continue
            table = f_flat if j < i else g_flat
            d_i += table.take(row + vectors[:, j])
        out[:, i] = d_i
    return out


@dataclass(frozen=True)
class EnergyTables:
    """The energy model as tables: ``E_i = idle[i] * D_i + extra[i, p_i]`` (J, with D_i in ns).

    From ``E_i = P_comp L_i + P_tx T_i + P_idle R_i`` and ``R_i = D_i - L_i - T_i``:
    ``idle[i] = P_idle,i * 1e-9`` and
    ``extra[i, p] = ((P_comp,i - P_idle,i) L_i(p) + (P_tx,i - P_idle,i) T_i(p)) * 1e-9``.
    """

    idle: FloatArray
    extra: FloatArray


def build_energy_tables(model: DelayModel) -> EnergyTables:
    """Tabulate the energy model for :func:`batch_objective` and the exhaustive search."""
    power = require_power(model)
    big_n = model.num_stages
    idle = np.array([pw.idle_w * J_PER_W_NS for pw in power], dtype=np.float64)
    extra = np.zeros((model.num_devices, big_n + 1), dtype=np.float64)
    for i, pw in enumerate(power):
        for p in range(big_n + 1):
            extra[i, p] = (
                (pw.compute_w - pw.idle_w) * local_ns(model, i, p)
                + (pw.transmit_w - pw.idle_w) * transmission_ns(model, i, p)
            ) * J_PER_W_NS
    return EnergyTables(idle=idle, extra=extra)


def combine_objective(
    delays: Sequence[FloatArray], energies: Sequence[FloatArray] | None, objective: Objective
) -> FloatArray:
    """An objective from per-device arrays of delays (ns) and, for the energy objectives, energies (J)."""
    total = np.array(delays[0], dtype=np.float64, copy=True)
    for d in delays[1:]:
        total += d
    if objective == "total_delay":
        return total
    if objective == "variance":
        mean = total / len(delays)
        spread = np.zeros_like(mean)
        for d in delays:
            spread += (d - mean) ** 2
        return spread / len(delays)
    if objective not in ENERGY_OBJECTIVES:
        raise DelayModelError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}")
    if energies is None:
        raise DelayModelError(f"objective {objective!r} needs the energy tables (build_energy_tables)")
    energy = np.array(energies[0], dtype=np.float64, copy=True)
    for e in energies[1:]:
        energy += e
    if objective == "energy":
        return energy
    return energy * total / NS_PER_S


def batch_energies(energy: EnergyTables, vectors: IntArray, delays: FloatArray) -> FloatArray:
    """E for many vectors at once: (M, n) in J, from the (M, n) delays of :func:`batch_delays`."""
    out = np.empty_like(delays)
    for i in range(vectors.shape[1]):
        out[:, i] = energy.idle[i] * delays[:, i] + energy.extra[i].take(vectors[:, i])
    return out


def batch_objective(
    delays: FloatArray,
    objective: Objective,
    energy: EnergyTables | None = None,
    vectors: IntArray | None = None,
) -> FloatArray:
    """The objective per row of a (M, n) delay matrix (the energy objectives also need the vectors)."""
    columns = [delays[:, i] for i in range(delays.shape[1])]
    energies: list[FloatArray] | None = None
    if objective in ENERGY_OBJECTIVES:
        if energy is None or vectors is None:
            raise DelayModelError(f"objective {objective!r} needs the energy tables and the vectors")
        matrix = batch_energies(energy, vectors, delays)
        energies = [matrix[:, i] for i in range(matrix.shape[1])]
    return combine_objective(columns, energies, objective)


# --------------------------------------------------------------------------- synthetic instances


def synthetic_model(
    rng: np.random.Generator,
    devices: int,
    stages: int,
    bounds: Sequence[int] | None = None,
) -> DelayModel:
    """A random but plausible instance, for tests and benchmarks.

    A model of ``stages`` stages with log-normal per-stage latencies (median 4 ms on a reference board) and
    cut sizes drifting from a 150 KB input; each device is 1-4x slower than the reference (with +-10 %
    per-stage noise), the edge server 3-10x faster; links of 5-100 Mbit/s with a 1-40 ms RTT.
    """
    base = rng.lognormal(mean=np.log(4e6), sigma=0.6, size=stages)
    sizes = 150_000 * np.exp(np.cumsum(rng.normal(-0.25, 0.6, size=stages)))
    cut = tuple(float(round(b)) for b in (150_000.0, *sizes))
    cum: list[tuple[float, ...]] = []
    for _ in range(devices):
        per_stage = base * rng.uniform(1.0, 4.0) * rng.uniform(0.9, 1.1, size=stages)
        cum.append((0.0, *(float(round(c)) for c in np.cumsum(per_stage))))
    edge = base / rng.uniform(3.0, 10.0)
    return DelayModel(
        devices=tuple(f"device{i + 1}" for i in range(devices)),
        edge_stage_ns=tuple(float(round(s)) for s in edge),
        cum_latency_ns=tuple(cum),
        cut_bytes=(cut,) * devices,
        rate_bps=tuple(float(round(r)) for r in rng.uniform(5e6, 100e6, size=devices)),
        rtt_ns=tuple(float(round(r)) for r in rng.uniform(1e6, 40e6, size=devices)),
        max_partition_point=None if bounds is None else tuple(bounds),
    )
