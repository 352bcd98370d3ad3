"""Chapter 6's simulated projection for the article's rack, beside the HeadSplit article's figures.

The rack is ``scenarios/sim/rack4_pi4.yaml``: four Raspberry Pi 4 boards whose rates, per-message latency
and per-call cost were fitted to the article's own 256-token figures (``dit simulate --fit-article``,
dit.sim.fit; what the fit could not give is said in the file). The simulator runs HeadSplit's own
placement code; the added RTT is added to every device's round trip. The measured sections are the
runtimes' own (``chapter_sections``, docs/runtimes.md): the helpers here serve them all.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from dit import units
from dit.paths import content_root
from dit.report import labels
from dit.report.section import Section
from dit.reproduce.article import ARTICLE_256_TOKENS_S, FIGURES
from dit.reproduce.chapter import (
    AbsentRuntime,
    Chapter,
    Finished,
    Plan,
    Size,
    missing_modules,
    not_installed,
    runtimes_plan,
    runtimes_sections,
)
from dit.reproduce.context import verdict_table, where_text
from dit.runtime_api import registry
from dit.runtime_api.chapters import ChapterRuns
from dit.units import MISSING

PLACEMENTS: Final = ("layerwise", "roundrobin", "greedy")
ADDED_RTT_MS: Final = (0, 5, 15, 25, 50)
RACK_FILE: Final = Path("scenarios") / "sim" / "rack4_pi4.yaml"


def rack_document() -> dict[str, Any]:
    doc = yaml.safe_load((content_root() / RACK_FILE).read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise ValueError(f"{RACK_FILE}: not a mapping")
    return doc


def simulate_seconds(doc: Mapping[str, Any], placement: str, added_rtt_ms: float = 0.0) -> float:
    """Simulated seconds to generate the document's tokens with ``placement`` and ``added_rtt_ms``."""
    from dit.sim.engine import simulate
    from dit.sim.spec import config_from

    shifted = {
        **doc,
        "devices": [{**d, "rtt_ms": float(d.get("rtt_ms", 0)) + added_rtt_ms} for d in doc["devices"]],
    }
    return simulate(config_from(shifted, placement)).total_s


def _within(value: float, key: str, simulated: bool = True) -> str:
    figure = FIGURES[key]
    holds = figure.holds(value)
    what = "the simulation" if simulated else "the measurement"
    if holds is None:
        return MISSING
    if holds:
        return f"reproduces: {value:.2f}x lies in the article's range"
    return (
        f"does not reproduce: {what} gives {value:.2f}x with the board rates, latency and per-call cost "
        f"{RACK_FILE} fitted to the article's three 256-token times (no one set gives all three)"
    )


def sections(not_measured: str, doc: Mapping[str, Any] | None = None) -> list[Section]:
    """The 256-token table and the added-RTT table; ``not_measured`` is why the column is empty here."""
    doc = rack_document() if doc is None else doc
    tokens = int(doc.get("tokens", 256))
    seconds = {p: simulate_seconds(doc, p) for p in PLACEMENTS}
    first = Section("Placements on the article's rack", "placements")
    first.note = (
        f"{tokens} tokens of {doc.get('model')} on four simulated boards ({RACK_FILE}). "
        f"Measured here: {not_measured}."
    )
    rows: list[list[str]] = []
    for placement in PLACEMENTS:
        article = ARTICLE_256_TOKENS_S[placement]
        sim = seconds[placement]
        same = tokens == 256
        rows.append(
            [
                f"{tokens} tokens, {placement}",
                "not measured",
                f"{sim:.1f} s",
                f"{article:.1f} s" if same else f"{article:.1f} s (256 tokens)",
                f"{'within' if abs(sim - article) <= 0.2 * article else 'not within'} 20 % of the article"
                + (
                    ""
                    if abs(sim - article) <= 0.2 * article
                    else f" ({sim / article:.2f}x its time) with the parameters {RACK_FILE} fitted"
                ),
            ]
        )
    for placement in ("roundrobin", "greedy"):
        speedup = seconds["layerwise"] / seconds[placement]
        rows.append(
            [
                f"speedup of {placement} over layer-wise",
                "not measured",
                f"{speedup:.2f}x",
                FIGURES["ch6.speedup_heads"].text,
                _within(speedup, "ch6.speedup_heads"),
            ]
        )
    verdict_table(first, rows)

    second = Section("Greedy over layer-wise as the round trip grows", "rtt")
    second.note = (
        "Every board's round trip increased by the added RTT. The article: "
        f"{FIGURES['ch6.rtt'].text}. Measured here: {not_measured}."
    )
    rtt_rows: list[list[str]] = []
    for added in ADDED_RTT_MS:
        layerwise = simulate_seconds(doc, "layerwise", added)
        greedy = simulate_seconds(doc, "greedy", added)
        speedup = layerwise / greedy
        if added <= 15:
            expected, good = "≥ 1.35x", speedup >= 1.35
        elif added >= 25:
            expected, good = "layer-wise better (< 1x)", speedup < 1
        else:
            expected, good = "no figure", None
        verdict = (
            MISSING
            if good is None
            else (
                "reproduces"
                if good
                else f"does not reproduce with the parameters {RACK_FILE} fitted to the 256-token times"
            )
        )
        rtt_rows.append([f"+{added} ms", "not measured", f"{speedup:.2f}x", expected, verdict])
    verdict_table(second, rtt_rows)
    return [first, second]


def energy_cells(run: Path, values: Mapping[str, Any]) -> str:
    """ ", <energy> per token, EDP <J*s>" from the run's summary, said to be modelled where a node's power
    came from a fake sensor (local mode); "" without a power trace."""
    per_token, edp = values.get("energy_per_token"), values.get("edp")
    if not isinstance(per_token, int | float):
        return ""
    cells = f", {units.energy(float(per_token))} per token"
    if isinstance(edp, int | float):
        cells += f", EDP {units.with_unit(float(edp), 'J*s')}"
    if labels.fake_power_nodes(run / "aggregate"):
        cells += " (fake sensor: modelled, not measured)"
    return cells


def summary_values(run: Path) -> dict[str, Any]:
    try:
        doc = json.loads((run / "aggregate" / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {v["name"]: v.get("value") for v in doc.get("values", []) if isinstance(v, dict) and "name" in v}


def added_rtt_ms(others: str) -> float:
    """The worker-to-worker RTT a sweep point adds: twice each device's delay (netem delays each egress)."""
    try:
        point = json.loads(others)
    except ValueError:
        return 0.0
    delays = [
        float(block.get("delay_ms", 0))
        for path, value in (point if isinstance(point, list) else [])
        if path == "network" and isinstance(value, dict)
        for block in value.values()
        if isinstance(block, dict)
    ]
    return 2 * max(delays, default=0.0)


def simulated_memory(doc: Mapping[str, Any], tokens: int = 512) -> str:
    """The article's rack (``RACK_FILE``) generating ``tokens`` with re-placement: how often it re-places,
    or why it never does (each board's peak against 85 % of its memory)."""
    from dit.sim.engine import simulate
    from dit.sim.spec import config_from

    result = simulate(config_from({**doc, "tokens": tokens, "replacement": True}, "greedy"))
    if result.migrations or result.oom:
        moved = sum(m.bytes for m in result.migrations)
        return f"{len(result.migrations)} re-placement(s) in {tokens} tokens, {units.size(moved)} moved" + (
            f"; out of memory: {result.oom}" if result.oom else ""
        )
    peak = max((max(sample.values()) for sample in result.memory), default=0)
    boards = min(float(d["memory_mb"]) for d in doc["devices"]) * 1e6
    return (
        f"no re-placement in {tokens} tokens: a board peaks at {units.size(peak)}, under 85 % of the "
        f"{units.size(boards)} {RACK_FILE} gives it (a static placement fits too)"
    )


#: Chapter 6 sets llama.cpp's RPC beside HeadSplit (issue 37).
ABSENT: Final[Mapping[str, AbsentRuntime]] = {
    "llamacpp-rpc": AbsentRuntime(
        "llama.cpp RPC: the llamacpp-rpc runtime is not installed here (pip install ./runtimes/llamacpp)",
        "llama.cpp RPC beside HeadSplit",
        "llamacpp",
        "llama.cpp RPC",
        40,
    )
}
RUNTIMES: Final = ("headsplit",)


def _plan(size: Size, local: bool) -> Plan:
    missing = missing_modules("torch") + [name for name in RUNTIMES if name not in registry.installed()]
    if missing:
        install = "pip install -e '.[llm]'; pip install ./runtimes/headsplit"
        return not_installed("ch6", size, "Chapter 6", missing, install)
    return runtimes_plan(CHAPTER, size, local)


def _report(done: Finished) -> list[Section]:
    finished = done.finished_runs()
    found = sections("the section above" if finished else done.not_measured())
    if done.outcomes:
        ctx = done.ctx
        runtimes = runtimes_sections(
            ChapterRuns(
                "ch6",
                {d.parent.name: tuple(f for f in finished if f.parent == d.parent) for d in finished},
                tuple(o.run_dir for o in done.outcomes if o.run_dir is not None),
                where_text(ctx),
                ctx.cores if ctx.shared_machine else None,
                done.plan.not_run,
            ),
            ABSENT,
        )
        found[:0] = runtimes.sections
        ctx.network = runtimes.network
    return found


CHAPTER: Final = Chapter(
    "ch6",
    "Chapter 6 — HeadSplit: strategies, added RTT, speculation, memory re-placement",
    _plan,
    _report,
    runtimes=RUNTIMES,
    absent=ABSENT,
    fitting_quotas=True,
)
