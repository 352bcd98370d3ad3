"""Readiness checks and maintenance actions of a runtime, run through ansible-runner.

Both take an inventory (``-i``) or, without one, local mode: a throwaway local-mode inventory (the edge
and the given devices as directories on this machine, :func:`dit.run.inventory.local_inventory`). Every task
result is handed to ``on_event`` as it happens (the CLI prints it, NNPM streams it to its terminal).
"""

from __future__ import annotations

import shlex
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator

from dit.run.ansible_exec import HostEvent, StageOutcome, run_playbook
from dit.run.inventory import RunInventory, load_inventory, local_inventory
from dit.runtime_api.interface import (
    CHECK_PREFIX,
    Action,
    ActionPlan,
    CheckResult,
    NodeReadiness,
    ReadinessPlan,
    Runtime,
)
from dit.scenario.errors import FieldError

EventSink = Callable[[HostEvent], None]


class InputError(ValueError):
    """Inputs of an action that its schema refuses; ``errors`` name the keys."""

    def __init__(self, errors: Sequence[FieldError]) -> None:
        super().__init__("; ".join(str(e) for e in errors))
        self.errors = list(errors)


class UnknownAction(ValueError):
    """An action name the runtime does not have; the message lists its actions."""


@contextmanager
def nodes(inventory: str | None, devices: Sequence[str] | None) -> Iterator[tuple[RunInventory, Path]]:
    """The inventory to act on (local mode when None) and a private working directory.

    ``devices=None``: every device of the inventory (local mode: one, ``device1``).
    """
    with tempfile.TemporaryDirectory(prefix="dit-runtime-") as tmp:
        work = Path(tmp)
        if inventory is None:
            yield local_inventory(work, tuple(devices or ("device1",))), work
        else:
            yield load_inventory(inventory, tuple(devices) if devices is not None else None), work


def _write_plays(plays: Sequence[Mapping[str, Any]] | Path, dest: Path) -> Path:
    if isinstance(plays, Path):
        return plays
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(yaml.safe_dump([dict(p) for p in plays], sort_keys=False), encoding="utf-8")
    return dest


_DELIMITERS = ("{{", "{%", "{#")


def _strings(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """Every string of a JSON-shaped value, keys included, with its dotted path."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            yield where, str(key)
            yield from _strings(item, where)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _strings(item, f"{path}[{i}]" if path else f"[{i}]")


def refuse_pasted(values: Mapping[str, Any], plays: Sequence[Mapping[str, Any]] | Path, who: str) -> None:
    """Refuse plays that carry a user value holding a template delimiter in their own text.

    A play's text is a template Ansible renders; a value a user gave (an action's input, a scenario's
    runtime block) belongs in the play's variables, which dit writes unsafe. A runtime that pastes
    ``x{{ lookup('pipe', ...) }}`` into a task's argument would have it run on this machine, so such a
    plan never reaches Ansible: the error names the value's field (a defect of the runtime, not of the
    value).
    """
    if isinstance(plays, Path):
        return
    texts = [text for _, text in _strings(list(plays))]
    for where, value in _strings(dict(values)):
        for delimiter in _DELIMITERS:
            at = value.find(delimiter)
            if at < 0:
                continue
            # from the delimiter to the next '/' (a runtime may make a path absolute or normalise it)
            piece = value[at:].split("/", 1)[0]
            if len(piece) <= len(delimiter):  # a bare delimiter is in every play: look for the value
                piece = value
            if any(piece in text for text in texts):
                raise InputError([FieldError(where, (
                    f"{who} would paste this value into its playbook's template text, where "
                    f"{delimiter!r} is executed; the runtime must pass it as a variable (a defect of the "
                    "runtime: see docs/runtimes.md)"
                ))])  # fmt: skip


def check_detail(event: HostEvent) -> str:
    res = event.result
    stdout = str(res.get("stdout") or "").strip()
    if event.status in ("ok", "changed"):
        return stdout.splitlines()[-1] if stdout else "ok"
    text = str(res.get("stderr") or res.get("msg") or event.status).strip()
    text = text.splitlines()[-1][:500] if text else event.status
    if not str(res.get("stderr") or "").strip() and res.get("cmd") and res.get("rc") is not None:
        # a command that could not even start: its message is generic, its program says which
        program = str(res["cmd"]).split()[0] if str(res["cmd"]).split() else ""
        text += f" (status {res['rc']}, {program})"
    return text


def readiness_of(plan: ReadinessPlan, outcome: StageOutcome, hosts: Sequence[str]) -> list[NodeReadiness]:
    """Per host: ``unreachable`` (with the connection's reason), ``failed`` (the first failed or missing
    check) or ``ok`` (every check of the plan ran and passed)."""
    out: list[NodeReadiness] = []
    for host in hosts:
        events = outcome.results.get(host, [])
        unreachable = [e for e in events if e.status == "unreachable"]
        checks: dict[str, CheckResult] = {}
        for event in events:
            if event.task.startswith(CHECK_PREFIX) and event.status != "skipped":
                name = event.task.removeprefix(CHECK_PREFIX)
                checks[name] = CheckResult(name, event.status in ("ok", "changed"), check_detail(event))
        results = tuple(checks.values())
        if unreachable:
            reason = str(unreachable[0].result.get("msg") or "unreachable").strip()
            out.append(NodeReadiness(host, "unreachable", reason, results))
            continue
        failed = [c for c in results if not c.ok]
        missing = [c for c in plan.checks if c not in checks]
        other = [e for e in events if e.status == "failed" and not e.task.startswith(CHECK_PREFIX)]
        if failed:
            out.append(NodeReadiness(host, "failed", f"{failed[0].name}: {failed[0].detail}", results))
        elif other:
            out.append(NodeReadiness(host, "failed", f"{other[0].task}: {check_detail(other[0])}", results))
        elif missing and not events and not outcome.ok:
            reason = f"no result from Ansible ({outcome.status}, rc {outcome.rc})"
            out.append(NodeReadiness(host, "failed", reason, results))
        elif missing:
            out.append(NodeReadiness(host, "failed", f"{missing[0]}: did not run", results))
        else:
            out.append(NodeReadiness(host, "ok", "", results))
    return out


def check(
    runtime: Runtime,
    inventory: RunInventory,
    workdir: Path,
    scenario: Mapping[str, Any] | None = None,
    on_event: EventSink = lambda _e: None,
) -> list[NodeReadiness]:
    """Run ``runtime``'s readiness plays on every node of ``inventory``; one verdict per node."""
    return check_hosts(runtime, inventory.source, inventory.hosts, workdir, scenario, on_event)


def check_hosts(
    runtime: Runtime,
    source: str | Sequence[str],
    hosts: Sequence[str],
    workdir: Path,
    scenario: Mapping[str, Any] | None = None,
    on_event: EventSink = lambda _e: None,
) -> list[NodeReadiness]:
    """Run ``runtime``'s readiness plays on ``hosts`` of the inventory ``source`` (a path to a file, or
    several whose host variables merge)."""
    plan = runtime.readiness(scenario, workdir / "files")
    hosts = list(hosts)
    if not plan.plays:
        return [NodeReadiness(h, "ok", "", ()) for h in hosts]
    refuse_pasted(
        dict((scenario or {}).get("runtime") or {}), plan.plays, f"runtime {runtime.name}'s readiness check"
    )
    if plan.prepare is not None:
        plan.prepare()
    playbook = _write_plays(plan.plays, workdir / "project" / "readiness.yml")
    outcome = run_playbook(
        f"readiness of {runtime.name}",
        playbook,
        workdir / "ansible",
        source,
        ":".join(hosts),
        dict(plan.extravars),
        on_event,
        forks=max(5, len(hosts)),
    )
    return readiness_of(plan, outcome, hosts)


def action_of(runtime: Runtime, name: str) -> Action:
    actions = {a.name: a for a in runtime.actions()}
    if name not in actions:
        listed = ", ".join(actions) or "none"
        raise UnknownAction(f"runtime {runtime.name} has no action {name!r}; its actions: {listed}")
    return actions[name]


def _string_typed(schema: Mapping[str, Any] | None, parts: Sequence[str]) -> bool:
    """Whether the input schema declares the field at ``parts`` a string (and not a number/boolean)."""
    node: Any = schema
    for part in parts:
        if not isinstance(node, Mapping):
            return False
        node = (node.get("properties") or {}).get(part)
    if not isinstance(node, Mapping):
        return False
    kind = node.get("type")
    kinds = set(kind) if isinstance(kind, list) else {kind}
    if "enum" in node and kind is None:
        kinds = {type(v).__name__ for v in node["enum"]}
        return kinds == {"str"}
    return "string" in kinds and not kinds & {"number", "integer", "boolean"}


def parse_sets(items: Sequence[str], schema: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``key=value`` pairs, typed by the action's input ``schema``: a field it declares a string keeps
    the text as given (``sha256=000…0`` stays 64 characters, not the integer 0); any other value is read
    as a YAML scalar (``2`` is a number, ``true`` a boolean). A dotted key makes nested mappings."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise InputError([FieldError(item, "expected key=value")])
        parts = key.strip().split(".")
        if _string_typed(schema, parts):
            value: Any = text
        else:
            try:
                value = yaml.safe_load(text) if text.strip() else ""
            except yaml.YAMLError:
                value = text
        node = out
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise InputError([FieldError(key, f"{part} is set both as a value and as a mapping")])
            node = child
        node[parts[-1]] = value
    return out


def validate_inputs(action: Action, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` checked against the action's input schema, its defaults applied."""
    from dit.scenario.schema import apply_defaults, render_error

    errors: list[FieldError] = []
    for error in Draft202012Validator(dict(action.inputs)).iter_errors(dict(values)):
        errors.extend(render_error(error))
    if errors:
        raise InputError(sorted(errors, key=lambda e: e.path))
    out = dict(values)
    apply_defaults(out, action.inputs)
    return out


def act(
    runtime: Runtime,
    action: Action,
    inputs: Mapping[str, Any],
    inventory: RunInventory,
    workdir: Path,
    on_event: EventSink = lambda _e: None,
) -> StageOutcome:
    """Run one maintenance action (its inputs already validated) on every node of ``inventory``."""
    return act_on_hosts(runtime, action, inputs, inventory.source, inventory.hosts, workdir, on_event)


def act_on_hosts(
    runtime: Runtime,
    action: Action,
    inputs: Mapping[str, Any],
    source: str | Sequence[str],
    hosts: Sequence[str],
    workdir: Path,
    on_event: EventSink = lambda _e: None,
) -> StageOutcome:
    """Run one maintenance action (its inputs already validated) on ``hosts`` of the inventory ``source``."""
    plan = action.plan(inputs)
    refuse_pasted(inputs, plan.plays, f"runtime {runtime.name}'s action {action.name}")
    playbook = _write_plays(plan.plays, workdir / "project" / f"{action.name}.yml")
    return run_playbook(
        f"{runtime.name} {action.name}",
        playbook,
        workdir / "ansible",
        source,
        ":".join(hosts),
        {**dict(plan.extravars), "dit_action_inputs": dict(inputs)},
        on_event,
        tags=plan.tags,
        forks=max(5, len(hosts)),
    )


def describe(runtime: Runtime) -> str:
    """One line: the block's fields (``name`` excluded), for ``dit runtimes``."""
    props = dict(runtime.block_schema().get("properties", {}))
    return ", ".join(shlex.quote(k) for k in props) or "(no fields)"


class InstallError(ValueError):
    """A runtime that cannot be installed: not declared, or not in the mirror at its pin."""


def install_plays(
    runtime: str,
    mirror_dir: Path,
    mirror_url: str | None,
    local: bool,
    sources_file: Path | None = None,
) -> ActionPlan:
    """The plays of ``dit runtimes install``: ``roles/runtime_env`` with the runtime's declared pin.

    The role's variables (paths and a URL a user gave) are the plan's extra variables, written unsafe,
    not the play's ``vars:``, which Ansible would render as templates.

    Refused (:class:`InstallError`) when the sources file does not declare the runtime or the mirror
    directory holds no build of it at that pin.
    """
    import sys

    from dit.mirror.build import host_arch
    from dit.mirror.runtimes import RUNTIME_JSON, RuntimeSourceError, default_sources_file
    from dit.runtimes.envs import expected_env

    where = sources_file or default_sources_file()
    try:
        env = expected_env(runtime, sources_file)
    except RuntimeSourceError as exc:
        raise InstallError(str(exc)) from None
    if env.dirname is None or env.pin is None:
        raise InstallError(
            f"runtime {runtime} is not declared in {where} (runtimes:): only a declared external runtime "
            "is installed into its own venv"
        )
    built = mirror_dir / "runtimes" / env.dirname / RUNTIME_JSON
    if not built.is_file():
        raise InstallError(
            f"the mirror {mirror_dir} holds no build of {runtime} at pin {env.pin[:12]} ({built} is missing): "
            f"run mirror/build --runtime {runtime}"
        )
    role_vars: dict[str, Any] = {
        "runtime_env_name": runtime,
        "runtime_env_pin": env.pin,
        "runtime_env_mirror_dir": str(mirror_dir),
    }
    if mirror_url:
        role_vars["runtime_env_mirror_url"] = mirror_url
    if local:  # the nodes are this machine: its interpreter and architecture
        role_vars |= {"runtime_env_python": sys.executable, "runtime_env_arch": host_arch()}
    plays = [
        {
            "name": f"Install the runtime {runtime} at {env.pin[:12]} into its venv",
            "hosts": "all",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Apply the runtime_env role",
                    "ansible.builtin.include_role": {"name": "runtime_env"},
                }
            ],
        }
    ]
    return ActionPlan(plays=plays, extravars=role_vars)


def install(
    runtime: str,
    inventory: RunInventory,
    workdir: Path,
    mirror_dir: Path,
    mirror_url: str | None = None,
    sources_file: Path | None = None,
    on_event: EventSink = lambda _e: None,
) -> StageOutcome:
    """Install ``runtime`` at its declared pin into its venv on every node (local mode: once, on this
    machine, whose nodes share one runtimes directory)."""
    return install_on_hosts(
        runtime,
        inventory.source,
        inventory.edge_host if inventory.local else inventory.limit,
        inventory.local,
        workdir,
        mirror_dir,
        mirror_url,
        sources_file,
        on_event,
        forks=max(5, len(inventory.hosts)),
    )


def install_on_hosts(
    runtime: str,
    source: str | Sequence[str],
    limit: str,
    local: bool,
    workdir: Path,
    mirror_dir: Path,
    mirror_url: str | None = None,
    sources_file: Path | None = None,
    on_event: EventSink = lambda _e: None,
    forks: int = 5,
) -> StageOutcome:
    """Install ``runtime`` at its pin on the hosts ``limit`` of the inventory ``source``; ``local``: they
    are this machine (its interpreter and architecture; its nodes share one runtimes directory, so one
    host is enough). Refused (:class:`InstallError`) before anything runs, as :func:`install_plays`."""
    plan = install_plays(runtime, mirror_dir, mirror_url, local, sources_file)
    playbook = _write_plays(plan.plays, workdir / "project" / "install.yml")
    return run_playbook(
        f"{runtime} install",
        playbook,
        workdir / "ansible",
        source,
        limit,
        dict(plan.extravars),
        on_event,
        forks=forks,
    )
