"""Chapter 6's simulated projection for the article's rack, beside the HeadSplit article's figures.

The rack is ``scenarios/sim/rack4_pi4.yaml``: four Raspberry Pi 4 boards whose rates, per-message latency
and per-call cost were fitted to the article's own 256-token figures (``dit simulate --fit-article``,
dit.sim.fit; what the fit could not give is said in the file). The simulator runs HeadSplit's own
placement code; the added RTT is added to every device's round trip.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import yaml

from dit import units
from dit.paths import content_root
from dit.report import labels
from dit.report.section import Section
from dit.reproduce.article import ARTICLE_256_TOKENS_S, ARTICLE_TAU, FIGURES
from dit.reproduce.ch6_tokens import why
from dit.reproduce.context import verdict_table
from dit.units import MISSING

if TYPE_CHECKING:
    from headsplit.breakdown import Token

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


def measured_section(
    run_dirs: list[Path],
    cores: int | None,
    doc: Mapping[str, Any] | None = None,
    found: Mapping[Path, Token] | None = None,
    where: str = "",
) -> Section:
    """HeadSplit's runs here: tokens/s and speedup over layer-wise per strategy, control and added RTT,
    beside the simulator's speedup for the article's rack at the same added RTT and the article's range;
    a strategy that misses it says which part of its token is why (``found``: the runs' median decode
    tokens, ch6_tokens). ``cores``: the cores every worker shares without a quota each (local mode; None
    on boards or a rack whose quotas fit)."""
    from headsplit.compare import CompareError, compare, load_variant

    doc = rack_document() if doc is None else doc
    found = found or {}
    baselines = {(t.control, t.one_way_ms): t for t in found.values() if t.name == "layerwise"}
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
            mine = found.get(v.path)
            base = None if mine is None else baselines.get((mine.control, mine.one_way_ms))
            if mine is not None and base is not None:
                verdict += "; " + why(base, mine)
        rows.append(
            [f"{name}, +{added:g} ms ({v.network}), control {v.control}", measured, sim, article, verdict]
        )
    verdict_table(section, rows)
    geometry = "; ".join(sorted({t.geometry for t in found.values()}))
    section.note = (
        (f"Measured on {where}" + (f"; {geometry}" if geometry else "") + ". " if where else "")
        + "HeadSplit's runs of the chapter's sweep (python -m headsplit.compare gives the same table). "
        "Simulated: the same strategy on the article's rack at the same added RTT, without speculation "
        f"({RACK_FILE}, fitted to the article's 256-token times)."
        + (" Not compared: " + "; ".join(problems) if problems else "")
    )
    return section


def llamacpp_section(run_dirs: list[Path], not_run: str | None) -> Section:
    """llama.cpp's RPC runs beside HeadSplit's strategies: tokens/s, per-token latency and bytes moved per
    weight type and added RTT; ``not_run`` says why there are none (llama.cpp not built here, ...)."""
    section = Section("llama.cpp RPC beside HeadSplit", "llamacpp")
    rows: list[list[str]] = []
    for run in run_dirs:
        try:
            meta = json.loads((run / "metadata.json").read_text(encoding="utf-8"))
            block = meta["runtime"]["block"]
            point = meta.get("scenario", {}).get("sweep_point") or []
        except (OSError, ValueError, KeyError, TypeError) as exc:
            rows.append([run.name, f"unreadable: {exc}", MISSING, MISSING, MISSING])
            continue
        values = _summary_values(run)
        tps, latency = values.get("tokens_per_s"), values.get("token_latency_mean")
        cells = [MISSING if not isinstance(tps, int | float) else f"{tps:.2f} tokens/s"]
        if isinstance(latency, int | float):
            cells.append(f"{latency / 1e6:.1f} ms per token after the first")
        cells.append(_llamacpp_bytes(run, values.get("bytes_per_token")))
        added = _added_rtt_ms(json.dumps(point))
        model = block.get("model", "?")
        rows.append(
            [
                f"llama.cpp RPC, {model} {block.get('quant', 'F32')}, +{added:g} ms",
                ", ".join(cells) + _energy_cells(run, values),
                MISSING,
                "no figure: the article did not run llama.cpp",
                f"beside HeadSplit, not against it: {model} here, HeadSplit's sweep runs its own model "
                "(the llamacpp-rpc runtime has no GGUF of it)",
            ]
        )
    if not rows:
        rows.append(["llama.cpp RPC", not_run or "no finished run", MISSING, MISSING, MISSING])
    verdict_table(section, rows)
    section.note = (
        "llama.cpp's RPC backend (docs/llamacpp.md) on the same four workers, every layer offloaded over "
        "--rpc, the controller on the edge server; tokens/s counts the prefill as HeadSplit's does. Bytes "
        "moved per token: the TCP payload through the rpc-servers' connections after the weights' upload "
        "(the kernel's per-socket counters, both directions; docs/llamacpp.md, Results), per generated token "
        "as HeadSplit's rows count theirs."
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


def _description(run: Path, name: str) -> str:
    """The summary value's description ("" where there is none)."""
    try:
        doc = json.loads((run / "aggregate" / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    for value in doc.get("values", []):
        if isinstance(value, dict) and value.get("name") == name:
            return str(value.get("description") or "")
    return ""


def _llamacpp_bytes(run: Path, moved: Any) -> str:
    """The llama.cpp row's bytes moved per token, or why there is no figure: the run's own reason
    ("... (not measured: <reason>)"), or a run aggregated before the rpc-servers' TCP bytes were counted
    (its figure came from per-process I/O counters, which miss send/recv)."""
    text = _description(run, "bytes_per_token")
    marker = "(not measured: "
    if marker in text:
        return "bytes moved not measured: " + text[text.index(marker) + len(marker) :].removesuffix(")")
    if not isinstance(moved, int | float):
        return "bytes moved not measured"
    if "TCP" not in text:
        return "bytes moved not measured: aggregated before the rpc-servers' TCP bytes were counted"
    return f"{units.size(moved)} moved per token"


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


# -- memory re-placement --------------------------------------------------------------------------------


SPEED_ROW: Final = "tokens/s before and after the first re-placement"


@dataclass(frozen=True)
class MemoryRun:
    """One run of the memory pair, as its results say: the re-placements and the out-of-memory."""

    path: Path
    replacement: bool
    pressure: Mapping[str, Any] | None  # the results' memory_pressure: worker, limit_bytes, threshold
    values: Mapping[str, Any]
    replacements: list[dict[str, str]]  # hs_replacements.csv rows
    token_ns: dict[int, int]  # token index -> total_ns (hs_tokens.csv)
    oom: Mapping[str, Any] | None


def load_memory_run(run: Path) -> MemoryRun:
    """A run of the memory pair (``ValueError`` naming the file when one cannot be read)."""
    meta = _json(run / "metadata.json")
    block = meta.get("runtime", {}).get("block") if isinstance(meta.get("runtime"), dict) else None
    if not isinstance(block, dict):
        raise ValueError(f"{run / 'metadata.json'}: no runtime block")
    raw = sorted(run.glob("raw/*/*_headsplit.json"))
    if not raw:
        raise ValueError(f"{run}: no raw/<controller>/<controller>_headsplit.json")
    doc = _json(raw[0])
    replacements = _csv(run / "aggregate" / "hs_replacements.csv")
    tokens = {int(r["token"]): int(r["total_ns"]) for r in _csv(run / "aggregate" / "hs_tokens.csv")}
    pressure = doc.get("memory_pressure")
    oom = doc.get("oom")
    return MemoryRun(
        run,
        bool(block.get("replacement", True)),
        pressure if isinstance(pressure, dict) else None,
        _summary_values(run),
        replacements,
        tokens,
        oom if isinstance(oom, dict) else None,
    )


def _json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a mapping")
    return doc


def _csv(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            return list(csv.DictReader(handle))
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror}") from None


def _rate(token_ns: Mapping[int, int], tokens: Iterable[int]) -> float | None:
    """Tokens per second over ``tokens`` (their own step times: memory sampling and migration excluded)."""
    chosen = [token_ns[t] for t in tokens if t in token_ns]
    total = sum(chosen)
    return len(chosen) * 1e9 / total if chosen and total > 0 else None


def _tokens_per_s(value: float | None) -> str:
    return MISSING if value is None else f"{value:.2f} tokens/s"


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


def memory_section(
    run_dirs: list[Path], doc: Mapping[str, Any] | None = None, simulate: bool = True
) -> Section:
    """The memory pair: greedy with re-placement beside the same run with a static placement, both under
    the same emulated memory pressure (``runtime.memory_pressure``); beside the article's figures and the
    simulator's 512 tokens on the article's rack."""
    section = Section("Memory: re-placement against a static placement", "memory")
    problems: list[str] = []
    runs: dict[bool, MemoryRun] = {}
    for path in run_dirs:
        try:
            loaded = load_memory_run(path)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        runs[loaded.replacement] = loaded
    sim = MISSING
    if simulate:
        sim = simulated_memory(rack_document() if doc is None else doc)
    moving, static = runs.get(True), runs.get(False)
    not_run = "not measured: the run with {} did not finish here"
    rows: list[list[str]] = []

    if moving is None:
        rows.append(["re-placements", not_run.format("re-placement"), sim, FIGURES["ch6.replacement"].text,
                     "cannot say: not measured"])  # fmt: skip
        rows.append([SPEED_ROW, not_run.format("re-placement"), MISSING, "no figure in the article",
                     MISSING])  # fmt: skip
    else:
        rows += _replacement_rows(moving, sim)
    rows.append(_static_row(static, moving))
    verdict_table(section, rows)
    section.note = (
        "Greedy placement under the same emulated memory pressure twice: with HeadSplit's re-placement "
        "(replacement: true) and with a static placement (replacement: false). A worker's KV caches grow "
        "too little to fill its memory within the run's tokens, so runtime.memory_pressure gives the "
        "worker whose memory grows fastest a limit derived from its first placement: its counted bytes "
        "(unit weights, KV slices) pass the threshold and the limit at the generated tokens set there ("
        + _pressure_text(runs)
        + ")"
        + ". Where they happen is therefore set, not measured: measured are what the re-placement moves, "
        "what it costs, the speed around it, and that the static placement stops. Not a cgroup: no process "
        "is killed. Tokens/s here: the tokens' own step times (memory sampling and migration excluded)."
        + (" Not compared: " + "; ".join(problems) if problems else "")
    )
    return section


def _replacement_rows(run: MemoryRun, sim: str) -> list[list[str]]:
    figure = FIGURES["ch6.replacement"]
    events = run.replacements
    if not events:
        said = "no re-placement: the threshold was never passed" + (
            f" (out of memory at token {run.oom.get('token')})" if run.oom else ""
        )
        return [
            ["re-placements", said, sim, figure.text, "does not reproduce: no re-placement fired"],
            [SPEED_ROW, MISSING, MISSING, "no figure in the article", MISSING],
        ]
    parts = []
    planning_ms: list[float] = []
    for event in events:
        moved = event.get("bytes") or ""
        planning_ms.append(int(event["planning_ns"]) / 1e6)
        parts.append(
            f"at token {event['token']} ({event.get('worker') or MISSING}): {event['moved_units']} units "
            f"moved, {units.size(int(moved)) if moved else MISSING + ' bytes'}, migration "
            f"{units.duration(int(event['migration_ns']))}, planning {units.duration(int(event['planning_ns']))}"
        )
    total = run.values.get("migration_bytes")
    measured = f"{len(events)} re-placement(s): " + "; ".join(parts)
    measured += f"; {units.size(total) if isinstance(total, int | float) else MISSING} moved in all"
    if run.oom:
        measured += f"; then out of memory at token {run.oom.get('token')} ({run.oom.get('worker')})"
    worst = max(planning_ms)
    verdict = (
        f"reproduces the planning time: {worst:.2f} ms, under the article's 5 ms (on this machine's cores, "
        "not a Pi 4's); the count is set by the emulated pressure, not comparable with the article's 1.4"
        if figure.holds(worst)
        else f"does not reproduce: planning took {worst:.2f} ms, over the article's 5 ms"
    )
    first = int(events[0]["token"])
    last = max(run.token_ns, default=-1)
    before = _rate(
        run.token_ns, range(1, first + 1)
    )  # decode tokens up to the re-placement (token 0: prefill)
    after = _rate(run.token_ns, range(first + 1, last + 1))
    speed = f"before (tokens 1 to {first}) {_tokens_per_s(before)}, after (tokens {first + 1} to {last}) "
    speed += _tokens_per_s(after)
    if before and after:
        speed += f" ({after / before:.2f}x)"
    return [
        ["re-placements", measured, sim, figure.text, verdict],
        [SPEED_ROW, speed, MISSING, "no figure in the article",
         "no figure to hold it to"],
    ]  # fmt: skip


def _static_row(static: MemoryRun | None, moving: MemoryRun | None) -> list[str]:
    figure = FIGURES["ch6.static_oom"]
    name = "static placement (replacement: false)"
    if static is None:
        return [name, "not measured: the run with a static placement did not finish here", MISSING,
                figure.text, "cannot say: not measured"]  # fmt: skip
    generated = static.values.get("tokens_generated")
    rate = _rate(static.token_ns, [t for t in static.token_ns if t > 0])
    if static.oom:
        oom = static.oom
        measured = (
            f"failed: out of memory at token {oom.get('token')} ({oom.get('worker')}: {_excess(oom)} over its "
            f"{units.size(oom.get('limit_bytes'))} limit), "
            f"{generated if generated is not None else MISSING} tokens generated at {_tokens_per_s(rate)}"
        )
        if moving is not None and moving.oom is None:
            verdict = (
                "reproduces: the static placement runs out of memory where re-placement generated every token"
            )
        else:
            verdict = (
                "reproduces the static placement's out of memory (no run with re-placement to set beside it)"
            )
        verdict += (
            "; the token is the one the emulated pressure sets, not a measurement of the article's ~400"
        )
    else:
        measured = f"no out of memory: {generated if generated is not None else MISSING} tokens generated at "
        measured += _tokens_per_s(rate)
        verdict = "does not reproduce: the static placement did not run out of memory"
    return [name, measured, MISSING, figure.text, verdict]


def _excess(oom: Mapping[str, Any]) -> str:
    """How far past its limit the worker went (``oom``: the results' out-of-memory record)."""
    used, limit = oom.get("bytes"), oom.get("limit_bytes")
    if not isinstance(used, int) or not isinstance(limit, int):
        return MISSING
    return units.size(used - limit)


def _pressure_text(runs: Mapping[bool, MemoryRun]) -> str:
    """Each run's squeezed worker, limit, threshold and tokens; said once when both runs had the same
    (each run places by its own measured rates, so the two placements, and the worker, can differ)."""
    said: dict[str, list[str]] = {}
    for replacement in (True, False):
        run = runs.get(replacement)
        pressure = run.pressure if run is not None else None
        if not pressure:
            continue
        text = (
            f"{pressure.get('worker')}: limit {units.size(pressure.get('limit_bytes'))}, threshold "
            f"{100 * float(pressure.get('threshold', 0)):.4f} %, tokens {pressure.get('replace_at')} and "
            f"{pressure.get('full_at')}"
        )
        said.setdefault(text, []).append("with re-placement" if replacement else "static")
    if not said:
        return "no run recorded them"
    if len(said) == 1:
        return next(iter(said))
    return "; ".join(f"{' and '.join(whom)}: {text}" for text, whom in said.items())
