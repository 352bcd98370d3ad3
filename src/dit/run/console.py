"""What the user sees while a run goes: stage progress, per-node state, and tagged log lines.

Every line is also appended to the run's ``run.log`` as ``<UTC time> <node> <stream> <text>``,
as long as it can be written: a full disk or a read-only run directory must not stop a run from
tearing down, so the log is then given up with one warning and its lines go to the console. On a
terminal a Rich live panel shows the stages and each node's last task; elsewhere (CI, pipes) the
same lines are printed plainly.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from dit.device.printable import printable, printable_lines
from dit.trusted import open_private_append

if TYPE_CHECKING:  # ansible-runner and Ansible's action plugins: not for `dit show`, `ls` or `validate`
    from dit.run.ansible_exec import HostEvent

STAGES = ("preflight", "apply", "profile", "collect", "aggregate", "optimise", "teardown")
STYLE = {"ok": "green", "changed": "yellow", "failed": "red", "unreachable": "red", "skipped": "dim"}


class Reporter:
    def __init__(self, log_path: Path, console: Console, label: str) -> None:
        self.console = console
        self.label = label
        self.log_path = log_path
        self._lock = threading.Lock()
        self._log: TextIO | None = None
        try:
            # 0600: it names the edge service's port (issue 46); only root reads a run's log
            self._log = os.fdopen(open_private_append(log_path), "a", encoding="utf-8")
        except OSError as exc:
            self._log_failed(exc)
        self.stage_state: dict[str, str] = dict.fromkeys(STAGES, "pending")
        self.stage_ms: dict[str, float] = {}
        self.node_state: dict[str, str] = {}
        self._live: Live | None = None

    def close(self) -> None:
        if self._log is not None:
            try:
                self._log.close()
            except OSError as exc:  # the buffered tail could not be written
                self._log = None
                self._log_failed(exc)

    def _log_failed(self, exc: OSError) -> None:
        from dit.run.rundir import os_reason

        self._log = None
        self.console.print(
            f"[yellow]warning:[/] {escape(str(self.log_path))}: cannot write the run log "
            f"({escape(os_reason(exc))}); its lines are shown here only",
            highlight=False,
        )

    @contextmanager
    def live(self) -> Iterator[None]:
        if not self.console.is_terminal:
            yield
            return
        with Live(self._render(), console=self.console, refresh_per_second=8, transient=False) as live:
            self._live = live
            try:
                yield
            finally:
                live.update(self._render())
                self._live = None

    def _render(self) -> Group:
        stages = Table(title=escape(self.label), show_header=True, header_style="bold")
        stages.add_column("stage")
        stages.add_column("state")
        stages.add_column("time", justify="right")
        for stage in STAGES:
            state = self.stage_state[stage]
            colour = {
                "running": "cyan",
                "done": "green",
                "failed": "red",
                "stopped": "yellow",
                "skipped": "dim",
            }.get(state, "")
            ms = self.stage_ms.get(stage)
            stages.add_row(
                stage, f"[{colour}]{state}[/]" if colour else state, f"{ms / 1000:.2f} s" if ms else ""
            )
        nodes = Table(show_header=True, header_style="bold")
        nodes.add_column("node")
        nodes.add_column("last task")
        for node, state in sorted(self.node_state.items()):
            nodes.add_row(node, state)
        return Group(stages, nodes)

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render())

    def line(self, node: str, stream: str, text: str, style: str = "") -> None:
        stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        # A node's text may carry terminal escapes (a device name in a refused frame): shown escaped.
        parts = printable_lines(text)
        node, stream = printable(node), printable(stream)
        with self._lock:
            log = self._log
            if log is not None:
                try:
                    for part in parts:
                        log.write(f"{stamp} {node} {stream} {part}\n")
                    log.flush()
                except OSError as exc:
                    with contextlib.suppress(OSError):  # the same reason again
                        log.close()
                    self._log_failed(exc)
        if self._live is None or style == "red" or self._log is None:
            safe = escape("\n".join(parts))
            shown = f"[{style}]{safe}[/]" if style else safe
            self.console.print(
                f"[bold]{escape(node)}[/] [dim]{stream}[/] {shown}", markup=True, highlight=False
            )

    def event(self, event: HostEvent) -> None:
        self.node_state[event.host] = (
            f"[{STYLE.get(event.status, 'default')}]{event.status}[/] {escape(printable(event.task))}"
        )
        self.line(event.host, event.stream, event.message(), STYLE.get(event.status, ""))
        self._refresh()

    def stage(self, stage: str, state: str, ms: float | None = None) -> None:
        self.stage_state[stage] = state
        if ms is not None:
            self.stage_ms[stage] = ms
        self.line("driver", "stage", f"{stage} {state}" + (f" ({ms / 1000:.2f} s)" if ms is not None else ""))
        self._refresh()

    def info(self, text: str) -> None:
        self.line("driver", "info", text)

    def warn(self, text: str) -> None:
        self.line("driver", "warning", text, "yellow")

    def error(self, text: str) -> None:
        self.line("driver", "error", text, "red")
