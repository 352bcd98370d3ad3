"""Server-rendered PNG plots of a run (matplotlib, Agg): per-layer latency and the monitor traces."""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from dit.report import labels
from dit.web.services.runpage import stamp

_LOCK = threading.Lock()  # pyplot is not thread-safe; the figures are small
_CACHE: OrderedDict[tuple[object, ...], bytes] = OrderedDict()
CACHE_SIZE = 32  # plots kept; a run page shows two, each tens of kB


def cached_png(make: Callable[[Path], bytes], csv_path: Path) -> bytes:
    """``make(csv_path)``, drawn once per version of its inputs (the CSV and the power summary beside it,
    which says which power is modelled): a run page reopened showed each plot drawn again, 8 s on the
    machine of issue 49 (item 6). At most :data:`CACHE_SIZE` plots are kept, the least recent dropped."""
    key = (make.__name__, str(csv_path), stamp(csv_path, csv_path.parent / "power_summary.csv"))
    with _LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    png = make(csv_path)
    with _LOCK:
        _CACHE[key] = png
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
    return png


def _png(fig: object) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
    return buffer.getvalue()


def layers_png(csv_path: Path) -> bytes:
    """Mean latency per stage (ms), one group of bars per device, from ``aggregate/layers.csv``."""
    frame = pd.read_csv(csv_path)
    with _LOCK:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
        hosts = sorted(frame["host"].unique())
        stages = sorted(frame["stage"].unique())
        width = 0.8 / max(1, len(hosts))
        for i, host in enumerate(hosts):
            sub = frame[frame["host"] == host].set_index("stage")
            xs = [s + (i - (len(hosts) - 1) / 2) * width for s in stages]
            ax1.bar(xs, [sub["latency_ns"].get(s, 0) / 1e6 for s in stages], width=width, label=host)
            ax2.plot(stages, [sub["cum_latency_ns"].get(s, 0) / 1e6 for s in stages], marker="o", label=host)
        ax1.set_title("latency per stage")
        ax1.set_xlabel("stage")
        ax1.set_ylabel("latency (ms)")
        ax2.set_title("cumulative latency (partition point)")
        ax2.set_xlabel("partition point p (stages 1..p on the device)")
        ax2.set_ylabel("cumulative latency (ms)")
        for ax in (ax1, ax2):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        return _png(fig)


TIME_AXIS = "time from the run's common origin (s)"
"""The monitor plot's x axis: ``t_ns`` of ``monitors.csv`` counts from the run's common start instant."""

_NAMED = {
    "cpu_pct": "CPU",
    "mem_used_pct": "memory used",
    "mem_pct": "memory",
    "power_w": "power",
    "load_cpu_target_pct": "load: CPU target",
    "load_mem_target_pct": "load: memory target",
    "throttled": "throttled",
}
_SUFFIXES = (  # metric suffix -> (unit shown, divisor of the recorded value)
    ("_pct", "%", 1.0),
    ("_temp_c", "°C", 1.0),
    ("_freq_khz", "MHz", 1000.0),
    ("_w", "W", 1.0),
    ("_a", "A", 1.0),
    ("_v", "V", 1.0),
    ("_bytes", "MB", 1e6),
)


def monitor_axis(metric: str) -> tuple[str, float]:
    """The y-axis label of a monitor metric with its unit, and the divisor of its recorded value.

    ``cpu_pct`` -> ``("CPU (%)", 1)``, ``cpu0_freq_khz`` -> ``("cpu0 frequency (MHz)", 1000)``.
    """
    for suffix, unit, divisor in _SUFFIXES:
        if metric.endswith(suffix):
            stem = metric.removesuffix(suffix)
            name = _NAMED.get(metric) or {
                "_temp_c": f"{stem} temperature",
                "_freq_khz": f"{stem} frequency",
            }.get(suffix, stem.replace("_", " "))
            return f"{name} ({unit})", divisor
    if metric == "throttled":
        return "throttled (flags)", 1.0
    return metric.replace("_", " "), 1.0


def monitor_metrics(frame: pd.DataFrame) -> list[str]:
    """The metrics worth a panel: CPU, memory, temperature, frequency and power, as present."""
    present = set(frame["metric"].unique())
    wanted: list[str] = []
    for metric in ("cpu_pct", "mem_used_pct", "mem_pct", "power_w", "load_cpu_target_pct"):
        if metric in present:
            wanted.append(metric)
    temps = sorted(m for m in present if m.endswith("_temp_c"))
    freqs = sorted(m for m in present if m.endswith("_freq_khz"))
    wanted += temps[:1] + freqs[:1]
    return wanted[:4] or sorted(present)[:4]


def monitors_figure(frame: pd.DataFrame, fake_power: Sequence[str] = ()) -> object:
    """One panel per metric on a shared time axis from the common origin, each y axis with its unit.

    ``fake_power``: nodes whose ``power_w`` comes from a fake sensor; their power line says so.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = monitor_metrics(frame) if not frame.empty else []
    fig, axes = plt.subplots(
        max(1, len(metrics)), 1, figsize=(10, 2.2 * max(1, len(metrics))), squeeze=False, sharex=True
    )
    if not metrics:
        axes[0][0].text(0.5, 0.5, "no monitor samples", ha="center", va="center")
    for ax, metric in zip((row[0] for row in axes), metrics, strict=False):
        label, divisor = monitor_axis(metric)
        sub = frame[frame["metric"] == metric]
        for node, rows in sub.groupby("node"):
            name = labels.node_label(node, fake_power) if metric == "power_w" else str(node)
            # a line through one sample draws nothing (a load's CPU target is often set once): a marker
            ax.plot(rows["t_ns"] / 1e9, rows["value"] / divisor, label=name, linewidth=1,
                    marker="o" if len(rows) < 2 else None, markersize=4)  # fmt: skip
        ax.set_ylabel(label, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1][0].set_xlabel(TIME_AXIS)
    fig.tight_layout()
    return fig


def monitors_png(csv_path: Path) -> bytes:
    """The monitor traces of ``aggregate/monitors.csv`` (tidy: node, t_ns, metric, value)."""
    frame = pd.read_csv(csv_path)
    fake_power = labels.fake_power_nodes(csv_path.parent)  # power_summary.csv beside it
    with _LOCK:
        return _png(monitors_figure(frame, fake_power))
