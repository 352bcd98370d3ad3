"""``dit rack up|status|down``: the Typer sub-commands (mounted by :mod:`dit.cli`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dit.rack import DEFAULT_STATE_DIR, DEFAULT_SUBNET

rack_app = typer.Typer(
    no_args_is_help=True,
    help="The emulated rack: an edge node and N devices in network namespaces, reached over SSH.",
)
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)

StateDir = Annotated[
    Path,
    typer.Option(
        "--state-dir",
        envvar="DIT_RACK_DIR",
        help="The rack's journal, keys, node trees and inventory: root's alone, below directories only "
        "root can write (not /tmp; docs/rack.md).",
    ),
]


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(1)


@rack_app.command()
def up(
    devices: Annotated[int, typer.Option(help="Device nodes besides the edge node.")] = 3,
    cpu_share: Annotated[
        int, typer.Option("--cpu-share", help="Each device's CPU quota, percent of one CPU.")
    ] = 100,
    memory_mb: Annotated[int, typer.Option("--memory-mb", help="Each device's memory limit, MiB.")] = 1024,
    name: Annotated[
        str,
        typer.Option(
            help="Part of the namespaces' and cgroups' names (all names also carry the state dir's id)."
        ),
    ] = "rack",
    subnet: Annotated[
        str, typer.Option(help="The inference network's 10.x.y (a /24 on the bridge).")
    ] = DEFAULT_SUBNET,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Build the rack and write its inventory (for `dit run SCENARIO -i INVENTORY`)."""
    from dit.rack.executor import Rack, host_spec
    from dit.rack.plan import RackError

    try:
        spec = host_spec(state_dir, devices, cpu_share, memory_mb, name, subnet)
        warning = spec.oversubscription()
        if warning:
            err.print(f"[yellow]rack: warning[/]: {escape(warning)}", highlight=False)
        state = Rack(spec).up(lambda text: err.print(f"rack: {escape(text)}", highlight=False))
    except RackError as exc:
        raise _fail(str(exc)) from None
    if not state["netem"]["available"]:
        out.print(
            "[yellow]this kernel has no sch_netem[/]: delay, jitter and loss on this rack are applied by "
            "the userspace link emulator (NFQUEUE, network_backend: auto) where iptables is installed, "
            "else recorded (dit_tc_dry_run: netem); tbf/htb/u32 shaping is real.",
            highlight=False,
        )
    out.print(f"rack up: edge + {devices} devices; inventory {escape(state['inventory'])}", highlight=False)


@rack_app.command()
def status(state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Each node: namespace, cgroup, its link on the bridge, a login over SSH, processes in its cgroup."""
    from dit.rack.executor import status as rack_status
    from dit.rack.plan import RackError

    try:
        state, rows = rack_status(state_dir.resolve())
    except RackError as exc:
        raise _fail(str(exc)) from None
    spec = state["spec"]
    table = Table(
        title=f"rack {spec['name']} ({state.get('bridge', '?')}): cpu share {spec['cpu_share_pct']} %, "
        f"memory {spec['memory_mb']} MiB per device, cgroup v{state['cgroup_version']}, "
        f"netem {'real' if state['netem']['available'] else 'absent (userspace link emulator)'}"
    )
    for column in ("node", "address", "netns", "cgroup", "link", "ssh", "processes"):
        table.add_column(column)
    for row in rows:
        marks = ["ok" if flag else "[red]missing[/]" for flag in (row.netns, row.cgroup)]
        marks += [text if text == "ok" else f"[red]{escape(text)}[/]" for text in (row.link, row.ssh)]
        table.add_row(row.name, row.address, *marks, str(row.processes))
    out.print(table)
    out.print(f"inventory: {escape(state['inventory'])}", highlight=False)
    broken = [row.name for row in rows if not row.healthy]
    if broken:
        err.print(f"[red]rack: not every node answers[/]: {escape(', '.join(broken))}", highlight=False)
        raise typer.Exit(1)


@rack_app.command()
def down(state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Remove everything `rack up` created (also after it crashed half-way), and nothing else."""
    from dit.rack.executor import down as rack_down
    from dit.rack.plan import RackError

    try:
        undone, left = rack_down(state_dir.resolve())
    except RackError as exc:
        raise _fail(str(exc)) from None
    out.print(f"rack down: {undone} steps undone, {escape(str(state_dir))} {escape(left)}", highlight=False)
