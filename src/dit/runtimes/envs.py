"""An external runtime's environment on the nodes: its venv at its pin, its checkpoints, what a run records.

A runtime declared in ``mirror/sources.yaml`` (:mod:`dit.mirror.runtimes`) is installed per node into
``<dit_runtimes_dir>/<name>-<pin12>`` by ``roles/runtime_env`` (``dit runtimes install``). Preflight
reads that venv on every node (``dit_facts``: installed or not, its stamp, its packages), the SHA-256
of every checkpoint the scenario's runtime block names and the runtime's custom facts (JSON files its
``node_facts`` names); :func:`runtime_record` turns the facts into the
``runtime`` entry of ``metadata.json`` and the per-host interpreter of the launch
(:attr:`dit.runtime_api.interface.LaunchContext.runtime_pythons`): the venv's ``bin/python`` where it is
installed, else the node's ``dit_python``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dit.mirror.runtimes import RuntimeSource, declared
from dit.runtime_api.interface import JSONSchema

CHECKPOINT_FIELDS = ("checkpoint", "checkpoints")
CHECKPOINT_KEYWORD = "x-dit-checkpoint"  # a block property marked ``"x-dit-checkpoint": true`` names files


@dataclass(frozen=True)
class RuntimeEnv:
    """The venv a runtime is expected in on every node (None fields: the runtime declares none)."""

    source: RuntimeSource | None
    pin: str | None
    dirname: str | None  # <name>-<pin12>

    @property
    def declared(self) -> bool:
        return self.source is not None


def expected_env(runtime: str, sources_file: Path | None = None) -> RuntimeEnv:
    """The venv of ``runtime`` as the sources file pins it (``$DIT_MIRROR_SOURCES``, else this
    checkout's ``mirror/sources.yaml``); an undeclared runtime (the built-in one) has none."""
    source = declared(runtime, sources_file)
    if source is None:
        return RuntimeEnv(None, None, None)
    pin = source.pin
    return RuntimeEnv(source, pin, source.env_name(pin))


def checkpoint_paths(schema: JSONSchema, block: Mapping[str, Any]) -> list[str]:
    """The checkpoint files a runtime block names: its ``checkpoint``/``checkpoints`` fields and every
    property the block's schema marks ``"x-dit-checkpoint": true`` (a path or a list of paths)."""
    props = dict(schema.get("properties") or {})
    found: list[str] = []
    for key, value in block.items():
        spec = props.get(key) if isinstance(props.get(key), dict) else {}
        if key not in CHECKPOINT_FIELDS and not (spec or {}).get(CHECKPOINT_KEYWORD):
            continue
        values = value if isinstance(value, list) else [value]
        found.extend(str(v) for v in values if isinstance(v, str) and v)
    return list(dict.fromkeys(found))


@dataclass
class RuntimeRecord:
    """What preflight found: the ``runtime`` entry of metadata.json, interpreters, warnings."""

    metadata: dict[str, Any]
    pythons: dict[str, str]
    warnings: list[str] = field(default_factory=list)


def runtime_record(
    name: str,
    version: str,
    block: Mapping[str, Any],
    env: RuntimeEnv,
    facts: Mapping[str, Mapping[str, Any]],
    dit_pythons: Mapping[str, str],
) -> RuntimeRecord:
    """``metadata.json``'s ``runtime`` (name, version, block, pin, venv, packages, checkpoints, nodes)
    and every host's runtime interpreter, from the preflight facts of each host. ``nodes.<host>`` holds
    the venv found there and the runtime's custom facts by name (``runtime_facts``, e.g.
    ``llamacpp_build``)."""
    pythons = dict(dit_pythons)
    warnings: list[str] = []
    nodes: dict[str, Any] = {}
    venv: str | None = None
    package_lists: dict[str, list[dict[str, str]]] = {}
    for host, host_facts in facts.items():
        found = host_facts.get("runtime_env")
        if not env.declared or not isinstance(found, Mapping):
            continue
        venv = venv or str(found.get("venv"))
        node: dict[str, Any] = {"installed": bool(found.get("installed")), "venv": found.get("venv")}
        if found.get("installed") and not found.get("error"):
            pythons[host] = str(found["python"])
            node.update(python=found["python"], stamp=found.get("stamp"))
            package_lists[host] = list(found.get("packages") or [])
        elif found.get("installed"):
            node["error"] = found["error"]
            warnings.append(
                f"runtime {name}: the venv {found.get('venv')} on {host} cannot be read: {found['error']}"
            )
        else:
            warnings.append(
                f"runtime {name}: no venv {found.get('venv')} on {host} (pin {str(env.pin)[:12]}); its "
                f"processes there run with {pythons.get(host)} (install it: dit runtimes install {name})"
            )
        nodes[host] = node
    for host, host_facts in facts.items():
        custom = host_facts.get("runtime_facts")  # the runtime's own node facts (RuntimeBase.node_facts)
        if isinstance(custom, Mapping) and custom:
            nodes.setdefault(host, {}).update({str(k): v for k, v in custom.items()})
    distinct = {tuple((p["name"], p["version"]) for p in pkgs) for pkgs in package_lists.values()}
    packages: list[dict[str, str]] | None = next(iter(package_lists.values()), [])
    if len(distinct) > 1:
        packages = None
        warnings.append(f"runtime {name}: the venvs' packages differ between nodes (recorded per node)")
        for host, pkgs in package_lists.items():
            nodes[host]["packages"] = pkgs
    checkpoints: dict[tuple[str, str | None], dict[str, Any]] = {}
    for host, host_facts in facts.items():
        for entry in host_facts.get("checkpoints") or []:
            key = (str(entry.get("path")), entry.get("sha256"))
            record = checkpoints.setdefault(
                key,
                {k: entry.get(k) for k in ("path", "sha256", "size", "error") if entry.get(k) is not None}
                | {"hosts": []},
            )
            record["hosts"] = sorted([*record["hosts"], host])
    paths = [path for path, _ in checkpoints]
    for path in sorted({p for p in paths if paths.count(p) > 1}):
        warnings.append(f"runtime {name}: checkpoint {path} differs between nodes")
    metadata = {
        "name": name,
        "version": version,
        "block": dict(block),
        "pin": env.pin,
        "source": env.source.describe() if env.source is not None else None,
        "venv": venv if env.declared else None,
        "packages": packages,
        "checkpoints": list(checkpoints.values()),
        "nodes": nodes,
    }
    return RuntimeRecord(metadata, pythons, warnings)


def runtime_dir(hostvars: Mapping[str, Any]) -> str:
    """Where a node keeps its runtimes' venvs (``dit_runtimes_dir``, default ``/opt/dit/runtimes``)."""
    return str(hostvars.get("dit_runtimes_dir") or "/opt/dit/runtimes")


def pythons_of(hosts: Sequence[str], hostvars: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Every host's ``dit_python`` (``/usr/bin/python3`` when the inventory does not say)."""
    return {host: str(hostvars.get(host, {}).get("dit_python", "/usr/bin/python3")) for host in hosts}
