"""Chapter 6's simulated projection for the article's rack, beside the HeadSplit article's figures.

The rack is ``scenarios/sim/rack4_pi4.yaml`` (four Raspberry Pi 4 over one access point, 8 to 12 ms RTT;
its per-device speed is an assumption written in the file). The simulator runs HeadSplit's own
placement code; the added RTT is added to every device's round trip.
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
from dit.reproduce.article import ARTICLE_256_TOKENS_S, ARTICLE_TAU, FIGURES
from dit.reproduce.context import verdict_table
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
        f"does not reproduce: {what} gives {value:.2f}x under the board speed and per-call cost "
        f"{RACK_FILE} assumes (not measured on a Pi 4)"
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
                    else f" ({sim / article:.2f}x its time) under the board speed {RACK_FILE} assumes"
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
                else f"does not reproduce under the board speed and per-call cost {RACK_FILE} assumes"
            )
        )
        rtt_rows.append([f"+{added} ms", "not measured", f"{speedup:.2f}x", expected, verdict])
    verdict_table(second, rtt_rows)
    return [first, second]


def measured_section(
    run_dirs: list[Path], cores: int | None, doc: Mapping[str, Any] | None = None
) -> Section:
    """HeadSplit's runs here: tokens/s and speedup over layer-wise per strategy and added RTT, beside the
    simulator's speedup for the article's rack at the same added RTT and the article's range. ``cores``:
    the cores every worker shares (None on real boards, each with its own)."""
    from headsplit.compare import CompareError, compare, load_variant

    doc = rack_document() if doc is None else doc
    section = Section("Strategies measured here", "measured")
    variants = []
    problems: list[str] = []
    for run in run_dirs:
        try:
            variants.append(load_variant(run))
        except CompareError as exc:
            problems.append(str(exc))
    rows: list[list[str]] = []
    simulated: dict[tuple[str, float], float] = {}
    for v in compare(variants):
        added = _added_rtt_ms(v.others)
        name = v.strategy + (" + speculation" if v.speculation else "")
        key = (v.strategy, added)
        if key not in simulated:
            simulated[key] = simulate_seconds(doc, "layerwise", added) / simulate_seconds(
                doc, v.strategy, added
            )
        figure = "ch6.speedup_full" if v.speculation else "ch6.speedup_heads"
        measured = MISSING if v.tokens_per_s is None else f"{v.tokens_per_s:.2f} tokens/s"
        if v.speedup is not None and v.strategy != "layerwise":
            measured += f", {v.speedup:.2f}x over layer-wise"
        values = _summary_values(v.path)
        moved = values.get("bytes_per_token")
        if isinstance(moved, int | float):
            measured += f", {units.size(moved)} moved per token"
        if values.get("replacements"):
            measured += f", {values['replacements']} re-placement(s)"
        measured += _energy_cells(v.path, values)
        if v.agreement is not None and v.speculation:
            measured += f", {100 * v.agreement:.0f} % of tokens as without speculation"
        sim = MISSING if v.speculation else f"{simulated[key]:.2f}x over layer-wise"
        if v.strategy == "layerwise":
            verdict, article = "the baseline", "the baseline"
        elif v.speedup is None:
            verdict, article = "cannot say: no speedup measured", FIGURES[figure].text
        elif FIGURES[figure].holds(v.speedup):
            verdict, article = "reproduces", FIGURES[figure].text
        else:
            article = FIGURES[figure].text
            workers = 4
            verdict = f"does not reproduce: {v.speedup:.2f}x" + (
                f"; {workers} workers share {cores} cores here, so their heads cannot run in parallel"
                if cores is not None and cores < workers
                else ""
            )
        rows.append([f"{name}, +{added:g} ms ({v.network})", measured, sim, article, verdict])
    verdict_table(section, rows)
    section.note = (
        "HeadSplit's runs of the chapter's sweep (python -m headsplit.compare gives the same table). "
        "Simulated: the same strategy on the article's rack at the same added RTT, without speculation."
        + (" Not compared: " + "; ".join(problems) if problems else "")
    )
    return section


def _energy_cells(run: Path, values: Mapping[str, Any]) -> str:
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


def _summary_values(run: Path) -> dict[str, Any]:
    try:
        doc = json.loads((run / "aggregate" / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {v["name"]: v.get("value") for v in doc.get("values", []) if isinstance(v, dict) and "name" in v}


def tolerance_section(run_dirs: list[Path]) -> Section:
    """The tolerance sweep: per tau, tokens/s and speedup over tau = 0, speculation's acceptance, the
    tokens as at tau = 0 and the held-out perplexity, beside the article's TinyLlama figures."""
    from headsplit.compare import CompareError, compare, load_variant

    section = Section("Speculation's tolerance: speed against fidelity", "tolerance")
    loaded = []
    problems: list[str] = []
    for run in run_dirs:
        try:
            meta = json.loads((run / "metadata.json").read_text(encoding="utf-8"))
            tau = float(meta["runtime"]["block"].get("tau", 0.05))
            loaded.append((tau, load_variant(run), _summary_values(run)))
        except (OSError, ValueError, KeyError, TypeError, CompareError) as exc:
            problems.append(f"{run.name}: {exc}")
    loaded.sort(key=lambda item: item[0])
    exact = {v.path: v for v in compare([v for _, v, _ in loaded])}
    base = next((v.tokens_per_s for tau, v, _ in loaded if tau == 0 and v.tokens_per_s), None)
    rows: list[list[str]] = []
    for tau, variant, values in loaded:
        v = exact[variant.path]
        acceptance = values.get("speculation_acceptance")
        perplexity = values.get("perplexity")
        cells = [
            MISSING if v.tokens_per_s is None else f"{v.tokens_per_s:.2f} tokens/s",
            MISSING if base is None or v.tokens_per_s is None else f"{v.tokens_per_s / base:.2f}x of tau = 0",
            "acceptance " + (MISSING if acceptance is None else f"{float(acceptance):.0f} %"),
            "tokens as at tau = 0 " + (MISSING if v.agreement is None else f"{100 * v.agreement:.0f} %"),
            "perplexity " + (MISSING if perplexity is None else f"{float(perplexity):.2f}"),
        ]
        figure = FIGURES["ch6.acceptance"]
        if tau == 0.05 and acceptance is not None:
            verdict = (
                "reproduces"
                if figure.holds(float(acceptance))
                else f"does not reproduce: {float(acceptance):.0f} % accepted; the model's weights decide how often "
                "a layer's input is close enough (seeded weights rarely are, docs/headsplit.md)"
            )
            article = figure.text
        else:
            verdict, article = MISSING, ARTICLE_TAU.get(tau, "no figure in the article")
        rows.append([f"tau = {tau:g}", ", ".join(cells), MISSING, article, verdict])
    verdict_table(section, rows)
    section.note = (
        "Greedy placement with cross-layer speculation at each tolerance (scenarios/ch6_tolerance.yaml). "
        "Fidelity: the share of tokens equal to the tau = 0 run's, and the perplexity of the held-out "
        "paragraph where the run measured it." + (" Not compared: " + "; ".join(problems) if problems else "")
    )
    return section


def _added_rtt_ms(others: str) -> float:
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
