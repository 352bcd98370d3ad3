"""The controller's two stages: aggregate (every analysis step over one loaded run) and optimise."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from dit import units
from dit.analysis.run import LoadedRun
from dit.conditions import aggregate_hooks
from dit.report import labels
from dit.run.rundir import RunDir
from dit.runtimes import Runtime
from dit.scenario import Scenario
from dit.scenario.spec import DEFAULT_RUNTIME


def aggregate(analysed: LoadedRun, runtime: Runtime, say: Callable[[str], None]) -> None:
    """The monitor traces, the power models, the runtime's results and every condition's own step."""
    from dit.analysis.monitors import aggregate_monitors
    from dit.analysis.power_model import write_power_models
    from dit.runtime_api.interface import write_summary

    # The traces first: energy.csv and the power model are inputs of the runtime's results
    # (the layers runtime's model validation compares predicted with measured energy).
    aggregate_monitors(analysed)
    write_power_models(analysed)
    results = runtime.parse_results(analysed)
    write_summary(analysed.aggregate_dir, runtime.name, results)
    fake = labels.fake_power_nodes(analysed.aggregate_dir)  # power_summary.csv, written above
    for value in results.summary:
        shown = units.with_unit(value.value, value.unit) + labels.modelled_tag(value.unit, fake)
        say(f"{runtime.name}: {value.name} = {shown}")
    for _condition, step in aggregate_hooks():
        step(analysed)


def record_kept(
    run: RunDir, load: Callable[[], LoadedRun], runtime: Runtime, info: Callable[[str], None]
) -> None:
    """What a stopped run fetched into raw/ (collect's files, or teardown's), aggregated as far as it
    goes (:func:`aggregate_kept`); recorded as status.json's ``kept``. Beside the stage, not in the
    driver (its class stays a sequencer)."""
    raw = run.path / "raw"
    if not raw.is_dir() or not any(p.is_file() for p in raw.rglob("*")):
        return
    kept = aggregate_kept(load(), runtime)
    if kept["aggregated"]:
        info(f"aggregated from the files kept before the stop: {', '.join(kept['aggregated'])}")
    for step, why in kept["not_aggregated"].items():
        info(f"not aggregated ({step}): {why}")
    run.try_set_status(kept=kept)


def aggregate_kept(analysed: LoadedRun, runtime: Runtime) -> dict[str, Any]:
    """A stopped run's aggregate from what it kept (the files fetched into raw/ until the stop).

    Each step of :func:`aggregate` runs on its own: a step whose inputs the stop cut short (a device
    that never profiled, say) is named with why, and the others still give what they can, so the run
    page and the report show the phases, tokens and traces measured before the stop (issue 49,
    item 4). Never raises: ``{"aggregated": [step…], "not_aggregated": {step: why}}``.
    """
    from dit.analysis.monitors import aggregate_monitors
    from dit.analysis.power_model import write_power_models
    from dit.runtime_api.interface import write_summary

    def results() -> None:
        write_summary(analysed.aggregate_dir, runtime.name, runtime.parse_results(analysed))

    steps: list[tuple[str, Callable[[], object]]] = [
        ("monitors", lambda: aggregate_monitors(analysed)),
        ("power models", lambda: write_power_models(analysed)),
        (f"{runtime.name} results", results),
        *(
            (f"{condition.name} checks", lambda step=step: step(analysed))
            for condition, step in aggregate_hooks()
        ),
    ]
    done: list[str] = []
    missing: dict[str, str] = {}
    for name, step in steps:
        try:
            step()
        except Exception as exc:  # cut-short inputs break a step in any way; the others go on
            missing[name] = " ".join(str(exc).split())[:300] or type(exc).__name__
        else:
            done.append(name)
    return {"aggregated": done, "not_aggregated": missing}


def optimise_skipped(scenario: Scenario) -> str | None:
    """Why the optimise stage does not run for ``scenario`` (status.json and ``dit show`` say it), or None.
    The optimisers search the partition vectors of the layer profile only the default runtime measures."""
    if scenario.optimisation.enabled:
        return None
    name = str(scenario.runtime.get("name", DEFAULT_RUNTIME))
    if name != DEFAULT_RUNTIME:
        return f"no optimiser for runtime {name}"
    return "optimisation.enabled is false"


def optimise(analysed: LoadedRun, scenario: Scenario) -> dict[str, Any]:
    """The scenario's optimisation over the aggregate: the optimum as ``optimise/*.json`` holds it."""
    from dit.optimise.api import optimise_run

    opt = scenario.optimisation
    result = optimise_run(analysed, opt.algorithm, opt.objective, opt.policy, None)
    data: dict[str, Any] = json.loads(result.to_json())
    return data
