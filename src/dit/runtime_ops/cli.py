"""``dit runtimes``: the installed runtimes, their readiness per node, their maintenance actions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from dit.commands.common import err, load_scenarios, out
from dit.commands.common import fail as _fail
from dit.runtime_api.interface import CheckResult

if TYPE_CHECKING:  # only for typing: ansible_exec imports ansible-runner and Ansible's plug-in API, which
    # every `dit` command would pay for on start (dit --help, show, validate), not only those that run plays
    from dit.run.ansible_exec import HostEvent

app = typer.Typer(
    no_args_is_help=False,
    invoke_without_command=True,
    help="Inference runtimes: list them, check the nodes' readiness, run maintenance actions.",
)
Inventory = Annotated[
    str | None, typer.Option("-i", "--inventory", help="Act on real hosts; without it, local mode.")
]


def _runtime(name: str) -> Any:
    from dit.runtime_api import registry

    try:
        return registry.get(name)
    except registry.UnknownRuntime as exc:
        raise _fail(str(exc), 2) from None


def _print_event(event: HostEvent) -> None:
    out.print(f"{escape(event.host)} {escape(event.message())}", highlight=False)
    for stream in ("stdout", "stderr"):
        text = str(event.result.get(stream) or "").strip()
        if text:
            for line in text.splitlines()[-20:]:
                out.print(f"{escape(event.host)} {stream} {escape(line)}", highlight=False)
    for item in event.result.get("results") or []:
        if isinstance(item, dict) and str(item.get("stdout") or "").strip():
            out.print(f"{escape(event.host)} stdout {escape(str(item['stdout']).strip())}", highlight=False)


@app.callback()
def listing(ctx: typer.Context) -> None:
    """The installed runtimes, their version and their scenario block's fields."""
    if ctx.invoked_subcommand is not None:
        return
    from dit.runtime_api import registry
    from dit.runtime_ops import plays as ops

    table = Table(title="installed runtimes")
    for column in ("runtime", "version", "title", "scenario block", "actions"):
        table.add_column(column)
    for name, runtime in registry.installed().items():
        actions = ", ".join(a.name for a in runtime.actions())
        table.add_row(name, runtime.version, escape(runtime.title), ops.describe(runtime), actions)
    out.print(table)
    for name, problem in registry.problems().items():
        err.print(
            f"[yellow]warning:[/] runtime {escape(name)} did not load: {escape(problem)}", highlight=False
        )


def _scenario_doc(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    return load_scenarios(path)[0].to_dict()  # its errors read as under dit validate and dit run


def checks_cell(checks: Sequence[CheckResult]) -> str:
    """A node's checks in one cell: a passing one with its detail (a version, a path), as a failing one's
    detail is the row's reason: ``python ok (3.11.7), tcp ok (listens), gguf FAILED``."""
    return ", ".join(
        f"{c.name} ok ({c.detail})" if c.ok and c.detail else f"{c.name} {'ok' if c.ok else 'FAILED'}"
        for c in checks
    )


@app.command()
def check(
    runtime: Annotated[
        str | None, typer.Option("--runtime", "-r", help="Default: the scenario's, else layers.")
    ] = None,
    inventory: Inventory = None,
    scenario: Annotated[
        Path | None, typer.Option("--scenario", "-s", help="Check for this scenario (its model, devices).")
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Print every task result.")] = False,
) -> None:
    """Readiness of every node for a runtime; exits 1 when a node is not ready."""
    from dit.run.inventory import InventoryError
    from dit.runtime_ops import plays as ops
    from dit.scenario.spec import DEFAULT_RUNTIME

    doc = _scenario_doc(scenario)
    name = runtime or str((doc or {}).get("runtime", {}).get("name", DEFAULT_RUNTIME))
    chosen = _runtime(name)
    devices = tuple(doc["devices"]) if doc else None
    try:
        with ops.nodes(inventory, devices) as (inv, work):
            verdicts = ops.check(chosen, inv, work, doc, _print_event if verbose else lambda _e: None)
    except InventoryError as exc:
        raise _fail(str(exc), 2) from None
    except ops.InputError as exc:  # the runtime's check would paste a block value into its plays
        raise _fail(f"{name}: {exc}", 2) from None
    table = Table(title=f"readiness for {name}")
    for column in ("node", "state", "checks", "reason"):
        table.add_column(column)
    colour = {"ok": "green", "failed": "red", "unreachable": "red"}
    for verdict in verdicts:
        checks = checks_cell(verdict.checks)
        table.add_row(
            verdict.host,
            f"[{colour[verdict.state]}]{verdict.state}[/]",
            escape(checks),
            escape(verdict.reason),
        )
    out.print(table)
    if not all(v.ok for v in verdicts):
        raise typer.Exit(1)


@app.command()
def act(
    runtime: Annotated[str, typer.Argument(help="The runtime.")],
    action: Annotated[str, typer.Argument(help="One of its maintenance actions.")],
    inventory: Inventory = None,
    sets: Annotated[
        list[str] | None, typer.Option("--set", help="An input of the action, key=value (repeatable).")
    ] = None,
) -> None:
    """Run a maintenance action of a runtime on every node, its output streamed."""
    from dit.run.inventory import InventoryError
    from dit.runtime_ops import plays as ops

    chosen = _runtime(runtime)
    try:
        spec = ops.action_of(chosen, action)
        inputs = ops.validate_inputs(spec, ops.parse_sets(sets or [], spec.inputs))
    except ops.UnknownAction as exc:
        raise _fail(str(exc), 2) from None
    except ops.InputError as exc:
        for error in exc.errors:
            err.print(f"[red]{escape(runtime)} {escape(action)}:[/] {escape(str(error))}", highlight=False)
        raise typer.Exit(2) from None
    try:
        with ops.nodes(inventory, None) as (inv, work):
            outcome = ops.act(chosen, spec, inputs, inv, work, _print_event)
    except InventoryError as exc:
        raise _fail(str(exc), 2) from None
    except ops.InputError as exc:  # the runtime's plan would paste an input into its playbook's text
        for error in exc.errors:
            err.print(f"[red]{escape(runtime)} {escape(action)}:[/] {escape(str(error))}", highlight=False)
        raise typer.Exit(2) from None
    if not outcome.ok or outcome.failures():
        raise _fail(f"{runtime} {action}: {outcome.status}")
    out.print(f"{escape(runtime)} {escape(action)}: done", highlight=False)


@app.command()
def install(
    runtime: Annotated[str, typer.Argument(help="An external runtime declared in mirror/sources.yaml.")],
    inventory: Inventory = None,
    mirror: Annotated[
        Path | None,
        typer.Option("--mirror", help="The mirror directory ($DIT_MIRROR_DIR, else /srv/dit-mirror)."),
    ] = None,
    mirror_url: Annotated[
        str | None,
        typer.Option(
            "--mirror-url", help="The mirror as the nodes read it (default: dit_mirror_url, else --mirror)."
        ),
    ] = None,
    sources: Annotated[
        Path | None,
        typer.Option("--sources", help="The sources file ($DIT_MIRROR_SOURCES, else mirror/sources.yaml)."),
    ] = None,
) -> None:
    """Install a runtime at its pin into its own venv on every node, from the mirror, hashes required."""
    import os

    from dit.run.inventory import InventoryError
    from dit.runtime_ops import plays as ops

    mirror_dir = (mirror or Path(os.environ.get("DIT_MIRROR_DIR", "/srv/dit-mirror"))).resolve()
    try:
        with ops.nodes(inventory, None) as (inv, work):
            outcome = ops.install(runtime, inv, work, mirror_dir, mirror_url, sources, _print_event)
    except ops.InstallError as exc:
        raise _fail(str(exc), 2) from None
    except InventoryError as exc:
        raise _fail(str(exc), 2) from None
    if not outcome.ok or outcome.failures():
        raise _fail(f"{runtime} install: {outcome.status}")
    out.print(f"{escape(runtime)} install: done", highlight=False)
