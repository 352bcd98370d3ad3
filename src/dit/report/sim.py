"""``dit report`` on a simulation's result directory (``dit simulate ... --out DIR``, :mod:`dit.sim.output`).

The same page as a run's (:mod:`dit.report.build`): per placement the simulated tokens/s, latency over
tokens, memory per device and migrations; for a replay (``dit simulate --replay RUN --out DIR``) the
simulated figures beside the measured ones and the per-token MAPE. A section whose file is missing says
so. Reads only JSON and CSV: the ``sim`` extra is not needed to render it.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from matplotlib.figure import Figure

from dit import units
from dit.report.section import Section
from dit.units import MISSING

RESULT_FILE: Final = "simulation.json"  # the names dit.sim.output writes
TOKENS_FILE: Final = "tokens.csv"
MEMORY_FILE: Final = "memory.csv"
MAX_TOKEN_ROWS: Final = 40
"""A per-token table longer than this shows a sample of the tokens (the first, then spread out, the last)."""


class SimReportError(Exception):
    """The directory's simulation.json is missing or unreadable."""


def is_sim_dir(path: Path) -> bool:
    return (path / RESULT_FILE).is_file()


@dataclass(frozen=True)
class TokenRow:
    token: int
    simulated_s: float
    measured_s: float | None


Tokens = dict[str, list[TokenRow]]  # placement -> its tokens in order
Memory = dict[str, dict[str, list[int]]]  # placement -> device -> bytes after each token


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def read_tokens(path: Path) -> Tokens | None:
    """tokens.csv by placement; None when missing or unreadable (the sections say so)."""
    try:
        with path.open(encoding="utf-8") as handle:
            rows: Tokens = {}
            for row in csv.DictReader(handle):
                simulated = _float(row.get("simulated_s"))
                if simulated is None:
                    continue
                rows.setdefault(row["placement"], []).append(
                    TokenRow(int(row["token"]), simulated, _float(row.get("measured_s")))
                )
            return rows
    except (OSError, KeyError, ValueError):
        return None


def read_memory(path: Path) -> Memory | None:
    """memory.csv by placement and device; None when missing or unreadable."""
    try:
        with path.open(encoding="utf-8") as handle:
            out: Memory = {}
            for row in csv.DictReader(handle):
                out.setdefault(row["placement"], {}).setdefault(row["device"], []).append(int(row["bytes"]))
            return out
    except (OSError, KeyError, ValueError):
        return None


def read_result(path: Path) -> dict[str, Any]:
    file = path / RESULT_FILE
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SimReportError(f"{file}: cannot be read as JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("placements"), list):
        raise SimReportError(f"{file}: not a simulation result (no placements list)")
    return doc


def _s(seconds: float | None) -> str:
    return units.duration(None if seconds is None else seconds * 1e9)


def _rate(value: float | None) -> str:
    return MISSING if value is None else f"{value:.2f} tokens/s"


def sample(count: int, limit: int = MAX_TOKEN_ROWS) -> list[int]:
    """Token indices to show: all of them up to ``limit``, else 0, 1, 2, 5, 10, 20, 50, ... and the last."""
    if count <= limit:
        return list(range(count))
    picks = {0, count - 1}
    step = 1
    while step < count:
        picks.update(x for x in (step, 2 * step, 5 * step) if x < count)
        step *= 10
    return sorted(picks)


# --------------------------------------------------------------------------- sections


def facts(doc: Mapping[str, Any], path: Path) -> Section:
    kind = doc.get("kind", "simulation")
    section = Section(
        "Simulation",
        "facts",
        note="Simulated by dit simulate (docs/simulator.md), not measured"
        + (": the replay's measured figures come from the run named below." if kind == "replay" else "."),
    )
    devices = doc.get("devices") or []
    rows = [
        ("result", path.name),
        ("kind", "replay of a run" if kind == "replay" else "simulation of a file"),
        ("source", str(doc.get("source", MISSING))),
        ("model", str(doc.get("model", MISSING))),
        ("devices", str(len(devices)) if devices else MISSING),
        ("tokens", f"{doc.get('tokens', MISSING)} (prompt {doc.get('prompt_tokens', MISSING)})"),
        ("speculation", "on" if doc.get("speculation") else "off"),
        ("re-placement", "on" if doc.get("replacement") else "off"),
    ]
    section.table("", ["", ""], rows)
    if devices:
        section.table(
            "Devices",
            ["device", "speed", "memory", "RTT to controller", "bandwidth", "per-call cost"],
            [
                (
                    d.get("name", MISSING),
                    f"{d['flops_per_s'] / 1e9:.3g} GFLOP/s" if "flops_per_s" in d else MISSING,
                    units.size(d.get("memory_bytes")),
                    _s(d.get("rtt_s")),
                    units.rate(8 * d["bandwidth_bytes_per_s"]) if "bandwidth_bytes_per_s" in d else MISSING,
                    _s(d.get("call_overhead_s")),
                )
                for d in devices
            ],
        )
    return section


def _peak(per_device: Mapping[str, list[int]] | None) -> tuple[str, int] | None:
    if not per_device:
        return None
    device = max(per_device, key=lambda d: max(per_device[d], default=0))
    return device, max(per_device[device], default=0)


def placements(doc: Mapping[str, Any], tokens: Tokens | None, memory: Memory | None) -> Section:
    """One row per placement: tokens/s, times, the largest memory, migrations, out of memory, events."""
    section = Section("Simulated, per placement", "placements")
    missing = [
        name for name, data in ((TOKENS_FILE, tokens), (MEMORY_FILE, memory)) if data is None
    ]  # fmt: skip
    if missing:
        section.note = f"Missing: {', '.join(missing)} (the columns read from it show {MISSING})."
    rows = []
    for p in doc.get("placements") or []:
        name = str(p.get("placement", MISSING))
        per_token = (tokens or {}).get(name)
        peak = _peak((memory or {}).get(name))
        moves = p.get("migrations") or []
        rows.append(
            (
                name,
                p.get("tokens", MISSING),
                _rate(p.get("tokens_per_s")),
                _s(p.get("simulated_s")),
                _s(p.get("token_latency_mean_s")),
                _s(per_token[-1].simulated_s) if per_token else MISSING,
                f"{units.size(peak[1])} ({peak[0]})" if peak else MISSING,
                len(moves),
                units.size(sum(m.get("bytes", 0) for m in moves)),
                p.get("oom") or "no",
                f"{p['events']:,}" if isinstance(p.get("events"), int) else MISSING,
            )
        )
    section.table(
        "",
        ["placement", "tokens", "tokens/s", "simulated time", "token latency mean", "last token",
         "largest memory (device)", "migrations", "migrated", "out of memory", "events"],
        rows,
    )  # fmt: skip
    return section


def latency(doc: Mapping[str, Any], tokens: Tokens | None) -> Section:
    """Latency over tokens: a figure (one line per placement, the measured one for a replay) and a table."""
    section = Section("Latency over tokens", "latency")
    if tokens is None:
        section.note = f"No per-token latencies: {TOKENS_FILE} is missing or unreadable."
        return section
    names = [
        str(p.get("placement")) for p in doc.get("placements") or [] if str(p.get("placement")) in tokens
    ]
    if not names:
        section.note = f"No per-token latencies: {TOKENS_FILE} has no row of this result's placements."
        return section
    measured = next((tokens[n] for n in names if any(t.measured_s is not None for t in tokens[n])), None)
    # the prompt's prefill (token 0) takes many times a decode token: plotted, it flattens the rest
    first = 1 if doc.get("prompt_tokens") and max(len(tokens[n]) for n in names) > 1 else 0
    figure = Figure(figsize=(7.0, 3.4))
    ax = figure.subplots()
    for name in names:
        shown = tokens[name][first:]
        ax.plot([t.token for t in shown], [1e3 * t.simulated_s for t in shown], label=name)
    if measured is not None:
        points = [(t.token, 1e3 * t.measured_s) for t in measured[first:] if t.measured_s is not None]
        ax.plot([x for x, _ in points], [y for _, y in points], "k--", marker=".", label="measured")
    ax.set_xlabel("token")
    ax.set_ylabel("latency (ms)")
    ax.legend(fontsize="small")
    section.figure(
        "Per-token latency"
        + (", decode tokens (the prompt's prefill, token 0, is in the table)" if first else ""),
        figure,
    )
    longest = max(len(tokens[n]) for n in names)
    picks = sample(longest)
    columns = ["token", *names, *(["measured"] if measured is not None else [])]
    rows = []
    for i in picks:
        row: list[Any] = [i]
        row += [_s(tokens[n][i].simulated_s) if i < len(tokens[n]) else MISSING for n in names]
        if measured is not None:
            row.append(_s(measured[i].measured_s) if i < len(measured) else MISSING)
        rows.append(row)
    caption = "" if len(picks) == longest else f"{len(picks)} of {longest} tokens"
    section.table(caption, columns, rows)
    return section


def memory_section(doc: Mapping[str, Any], memory: Memory | None) -> Section:
    """Each device's memory limit and, per placement, its peak and its bytes after the last token."""
    section = Section("Memory per device", "memory")
    if memory is None:
        section.note = f"No memory records: {MEMORY_FILE} is missing or unreadable."
        return section
    names = [str(p.get("placement")) for p in doc.get("placements") or []]
    limits = {str(d.get("name")): d.get("memory_bytes") for d in doc.get("devices") or []}
    devices = list(limits) or sorted({d for per in memory.values() for d in per})
    rows = []
    for device in devices:
        row: list[Any] = [device, units.size(limits.get(device))]
        for name in names:
            series = memory.get(name, {}).get(device)
            row += [units.size(max(series)), units.size(series[-1])] if series else [MISSING, MISSING]
        rows.append(row)
    columns = ["device", "limit", *(f"{n}: {what}" for n in names for what in ("peak", "last token"))]
    section.table("", columns, rows)
    plotted = [n for n in names if memory.get(n)]
    if plotted:
        figure = Figure(figsize=(7.0, 3.2))
        ax = figure.subplots()
        for name in plotted:
            per = memory[name]
            steps = max(len(s) for s in per.values())
            ax.plot(range(steps), [max(s[t] for s in per.values() if t < len(s)) / 1e6 for t in range(steps)],
                    label=name)  # fmt: skip
        ax.set_xlabel("token")
        ax.set_ylabel("largest device memory (MB)")
        ax.legend(fontsize="small")
        section.figure("The most loaded device's memory after each token, per placement", figure)
    return section


def migrations(doc: Mapping[str, Any]) -> Section:
    section = Section("Migrations", "migrations")
    rows = [
        (p.get("placement", MISSING), m.get("token", MISSING), m.get("moved_units", MISSING),
         units.size(m.get("bytes")), _s(m.get("seconds")))
        for p in doc.get("placements") or []
        for m in p.get("migrations") or []
    ]  # fmt: skip
    if not rows:
        section.note = "No migration in any placement" + (
            "." if doc.get("replacement") else " (re-placement is off in this simulation)."
        )
        return section
    section.table("", ["placement", "before token", "units moved", "bytes", "time"], rows)
    return section


def replay(doc: Mapping[str, Any], tokens: Tokens | None) -> Section:
    """Simulated beside measured: tokens/s, mean decode latency, the MAPE, and the per-token table."""
    section = Section("Simulated beside measured", "replay")
    r = doc.get("replay")
    if doc.get("kind") != "replay" or not isinstance(r, Mapping):
        section.note = (
            "Not a replay: nothing measured to set beside the simulation (dit simulate --replay RUN_DIR "
            "--out DIR replays a run)."
        )
        return section
    calibration = r.get("calibration")
    section.note = (
        f"The per-call cost ({_s(r.get('call_overhead_s'))}, the same on every device"
        + (", CPU time: each device's wall time through its CPU quota" if r.get("cpu_time") else "")
        + ") was fitted on "
        + (
            f"another run, {calibration}: nothing of this run's timings went into the simulation, the "
            "MAPE is a prediction."
            if calibration
            else "this run itself so that the mean simulated decode latency equals the measured one: "
            "the MAPE measures how well the simulation follows the token-to-token latency, not an "
            "independent prediction."
        )
        + (f" Compute rates: {r['rates']}." if r.get("rates") else "")
    )
    per_token = next(iter((tokens or {}).values()), None)
    decode_from = int(r.get("decode_from") or 0)
    decode = [t for t in per_token or [] if t.token >= decode_from]
    measured = [t.measured_s for t in decode if t.measured_s is not None]
    rows = [
        ("tokens/s", _rate(r.get("simulated_tokens_per_s")), _rate(r.get("measured_tokens_per_s"))),
        (
            "decode token latency, mean",
            _s(statistics.fmean(t.simulated_s for t in decode)) if decode else MISSING,
            _s(statistics.fmean(measured)) if measured else MISSING,
        ),
        ("per-token latency MAPE (decode tokens)", units.percent(r.get("mape_percent")), ""),
    ]
    if r.get("speculation"):
        rows.append(("speculation kept (the run's acceptance)", f"{r.get('acceptance', 0):.2f}", ""))
    section.table("", ["", "simulated", "measured"], rows)
    if per_token is None:
        section.note += f" No per-token table: {TOKENS_FILE} is missing or unreadable."
        return section
    picks = sample(len(per_token))
    token_rows = []
    for i in picks:
        t = per_token[i]
        error = (
            units.percent(100 * (t.simulated_s - t.measured_s) / t.measured_s) if t.measured_s else MISSING
        )
        token_rows.append(
            (f"{t.token}" + (" (prefill)" if t.token < decode_from else ""), _s(t.simulated_s),
             _s(t.measured_s), error)
        )  # fmt: skip
    caption = "Per token" + ("" if len(picks) == len(per_token) else f" ({len(picks)} of {len(per_token)})")
    section.table(caption, ["token", "simulated", "measured", "error"], token_rows)
    return section


def sim_sections(path: Path) -> tuple[str, list[Section]]:
    """The title and sections of a simulation's (or a replay's) report."""
    doc = read_result(path)
    tokens = read_tokens(path / TOKENS_FILE)
    memory = read_memory(path / MEMORY_FILE)
    kind = "replay" if doc.get("kind") == "replay" else "simulation"
    title = f"{doc.get('model', 'model')} — {kind}"
    return title, [
        facts(doc, path),
        placements(doc, tokens, memory),
        latency(doc, tokens),
        memory_section(doc, memory),
        migrations(doc),
        replay(doc, tokens),
    ]
