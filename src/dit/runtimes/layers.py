"""The built-in runtime ``layers``: layer-by-layer profile and partitioned inference.

Each device runs the device agent (``dit-device.pyz profile``, docs/protocol.md) from the common start
instant, which is picked once every agent has prepared (the two-phase start): it profiles the model
stage by stage, then runs the scenario's partitioned inference against the edge service the apply
stage started. Its results parser is the run aggregate
(:mod:`dit.analysis.aggregate`) plus, when inference ran, the model validation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dit.analysis.run import LoadedRun
from dit.device.protocol import KEY_FILE
from dit.paths import content_root
from dit.runtime_api.interface import (
    Action,
    ActionPlan,
    LaunchContext,
    LaunchOutcome,
    LaunchSpec,
    ReadinessPlan,
    Results,
    SummaryValue,
)

PROFILE_TAG = "profile"
ORIGIN_FILE = "results/origin.json"
DONE_FILE = "results/done.json"
# The agent prepares (model, reference output, edge connection) before the instant is picked, then says
# so in this file (the two-phase start, docs/runtimes.md), so preparing is never part of the lead.
PREPARED_FILE = "profile.prepared.json"

FRAMEWORK_CHECK = (
    "import importlib, sys; m = importlib.import_module(sys.argv[1]); "
    "print(getattr(m, '__version__', 'imported'))"
)
PYTHON_CHECK = (
    "import sys; print('%d.%d.%d' % sys.version_info[:3]); sys.exit(0 if sys.version_info >= (3, 11) else 1)"
)
CHECKS = ("python", "dit-device.pyz", "framework")


def framework_of(model: str) -> str:
    """The framework a model needs on the boards: ``none``, ``tensorflow`` or ``torch``."""
    from dit.models.catalogue import entry

    try:
        return str(entry(model).framework)
    except KeyError:
        return "none"


def check_playbook() -> list[dict[str, Any]]:
    """The readiness plays (vars ``dit_check_pyz``, ``dit_check_framework``; hosts chosen with --limit).

    The node's Python (``dit_python``, else ``/usr/bin/python3``) is 3.11 or newer; ``dit-device.pyz``
    (built on the controller, copied to a temporary directory on the node and removed after) runs; the
    framework of the chosen model imports, with its version.
    """
    py = "{{ dit_python | default(ansible_python_interpreter) | default('/usr/bin/python3') }}"
    return [
        {
            "name": "Readiness of the built-in runtime",
            "hosts": "all",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "check: python",
                    "ansible.builtin.command": {"argv": [py, "-c", PYTHON_CHECK]},
                    "changed_when": False,
                    "ignore_errors": True,
                },
                {
                    "name": "A temporary directory for the device code",
                    "ansible.builtin.tempfile": {"state": "directory", "prefix": "nnpm-check-"},
                    "register": "nnpm_tmp",
                },
                {
                    "name": "Copy dit-device.pyz",
                    "ansible.builtin.copy": {
                        "src": "{{ dit_check_pyz }}",
                        "dest": "{{ nnpm_tmp.path }}/dit-device.pyz",
                        "mode": "0644",
                    },
                },
                {
                    "name": "check: dit-device.pyz",
                    "ansible.builtin.command": {"argv": [py, "{{ nnpm_tmp.path }}/dit-device.pyz", "--help"]},
                    "changed_when": False,
                    "ignore_errors": True,
                },
                {
                    "name": "check: framework",
                    "ansible.builtin.command": {
                        "argv": [py, "-c", FRAMEWORK_CHECK, "{{ dit_check_framework }}"]
                    },
                    "changed_when": False,
                    "ignore_errors": True,
                    "when": "dit_check_framework != 'none'",
                },
                {
                    "name": "Remove the temporary directory",
                    "ansible.builtin.file": {"path": "{{ nnpm_tmp.path }}", "state": "absent"},
                    "when": "nnpm_tmp.path is defined",
                },
            ],
        }
    ]


def _provision(tag: str) -> Any:
    def plan(_inputs: Mapping[str, Any]) -> ActionPlan:
        return ActionPlan(plays=content_root() / "playbooks" / "provision.yml", tags=(tag,))

    return plan


class LayersRuntime:
    """The built-in runtime (see the module docstring)."""

    name = "layers"
    title = "built-in (layer-by-layer profile + partitioned inference)"
    uses_edge_service = True  # its devices send their requests to dit's edge service
    uses_testbed_model = True  # it runs the scenario's model: the scenario must name one
    # its device agents connect to the edge from their device's source address (dit.device.client)
    sends_from_source_address = True

    @property
    def version(self) -> str:
        import dit

        return dit.__version__

    def block_schema(self) -> Mapping[str, Any]:
        # Its other settings are the scenario's own blocks (model, inference, edge_server ...). No
        # "default" for tokens: a scenario without it resolves (and hashes) exactly as before.
        return {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "tokens": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": 4096,
                    "description": (
                        "Decoder models (gpt2, tinyllama, hf_decoder, smollm2-135m): tokens generated after "
                        "the prompt, with per-token latency (aggregate/tokens.csv), per-head / projection / FFN times "
                        "(aggregate/heads.csv) and energy per token (energy.csv). Absent or 0: no generation."
                    ),
                }
            },
        }

    def readiness(self, scenario: Mapping[str, Any] | None, workdir: Path) -> ReadinessPlan:
        model = scenario.get("model") if scenario else None
        name = str(model.get("name", "fake") if isinstance(model, Mapping) else model or "fake")
        framework = framework_of(name)
        pyz = workdir / "dit-device.pyz"

        def prepare() -> None:
            from dit.device.build import build_zipapp

            pyz.parent.mkdir(parents=True, exist_ok=True)
            build_zipapp(pyz)

        checks = CHECKS if framework != "none" else CHECKS[:2]
        return ReadinessPlan(
            plays=check_playbook(),
            checks=checks,
            extravars={"dit_check_pyz": str(pyz), "dit_check_framework": framework},
            prepare=prepare,
        )

    def actions(self) -> Sequence[Action]:
        no_inputs = {"type": "object", "additionalProperties": False, "properties": {}}
        return (
            Action(
                "install-runtime",
                "Install the runtime from the mirror",
                "provision.yml --tags runtime: the runtime venv from the mirror (no index, hashes required)",
                no_inputs,
                _provision("runtime"),
            ),
            Action(
                "distribute-weights",
                "Distribute the checkpoints",
                "provision.yml --tags weights: the catalogue's model weights, verified by checksum",
                no_inputs,
                _provision("weights"),
            ),
        )

    def launch(self, ctx: LaunchContext) -> Sequence[LaunchSpec]:
        scn = ctx.scenario
        inference = scn.get("inference", {})
        equivalence = scn.get("model", {}).get("equivalence_check", {})
        hardware = scn.get("hardware", {})
        specs = []
        for index, device in enumerate(ctx.devices):
            root = ctx.node_roots[device]
            config = {
                "model": ctx.model,
                "repetitions": scn["repetitions"],
                "warmup": scn["warmup"],
                "threads": hardware.get(device, {}).get("threads"),
                "inference": {
                    "enabled": inference.get("enabled", False),
                    "vectors": [list(v) for v in inference.get("partition_points", ())],
                    "device_index": index,
                    "repetitions": inference.get("repetitions", 1),
                    "edge": {
                        "host": ctx.addresses[ctx.edge_host],
                        "port": ctx.edge_port,
                        # the run's key, shipped by the apply stage: every frame is signed with it
                        "key_file": f"{root}/{KEY_FILE}",
                        **(
                            {"source": ctx.source_addresses[device]}
                            if ctx.source_addresses.get(device)
                            else {}
                        ),
                    },
                    "equivalence": {
                        "enabled": equivalence.get("enabled", False),
                        "tolerance": float(equivalence.get("tolerance", 0.0)),
                    },
                },
                "run_id": ctx.run_id,
                "host": device,
                "results_dir": f"{root}/results",
            }
            if int(ctx.block.get("tokens") or 0) > 0:  # absent: profile.json exactly as before
                config["tokens"] = int(ctx.block["tokens"])
            specs.append(
                LaunchSpec(
                    host=device,
                    name=PROFILE_TAG,
                    argv=(
                        ctx.pythons[device],
                        f"{root}/dit-device.pyz",
                        "profile",
                        "--config",
                        f"{root}/profile.json",
                    ),
                    files={"profile.json": json.dumps(config)},
                    result_files=(ORIGIN_FILE, DONE_FILE),
                    prepared_file=PREPARED_FILE,
                )
            )
        return specs

    def started(self, outcomes: Sequence[LaunchOutcome]) -> Mapping[str, int]:
        lateness: dict[str, int] = {}
        for outcome in outcomes:
            origin = outcome.results.get(ORIGIN_FILE)
            if outcome.name == PROFILE_TAG and isinstance(origin, Mapping) and "lateness_ns" in origin:
                lateness[outcome.host] = int(origin["lateness_ns"])
        return lateness

    def parse_results(self, run: LoadedRun) -> Results:
        from dit.analysis.aggregate import aggregate_run

        summary = aggregate_run(run)
        values = [
            SummaryValue("devices", len(summary.devices), "", "int", "devices profiled"),
            SummaryValue("stages", summary.num_stages, "", "int", "partition stages of the model (N)"),
            SummaryValue(
                "edge_source", summary.edge_source, "", "str", "where the edge's per-layer times come from"
            ),
        ]
        tables = list(summary.files)
        inference = run.scenario.get("inference")
        if isinstance(inference, Mapping) and inference.get("enabled"):
            from dit.analysis.model_validation import validate_run

            validation = validate_run(run)
            mape = getattr(validation, "mape_pct", None)
            if mape is not None:
                values.append(
                    SummaryValue(
                        "model_mape", float(mape), "%", "float", "model validation: mean absolute % error"
                    )
                )
        tables_, generation = token_results(run)
        return Results(tables=tuple(tables) + tables_, summary=tuple(values) + generation)


def token_results(run: LoadedRun) -> tuple[tuple[Path, ...], tuple[SummaryValue, ...]]:
    """Token generation (``tokens`` > 0, decoder models): aggregate/heads.csv and tokens.csv, and the
    summary values of :mod:`dit.analysis.tokens`; nothing when no device generated tokens."""
    from dit.analysis.tokens import aggregate_tokens, energy_per_token_j

    found = aggregate_tokens(run)
    if found is None:
        return (), ()
    values = [
        SummaryValue("tokens", found.tokens, "", "int", "tokens generated after the prompt"),
        SummaryValue(
            "token_latency_mean",
            found.token_latency_mean_ns,
            "ns",
            "float",
            "mean per-token latency of the generation (token 0 = the prompt's prefill)",
        ),
        SummaryValue("tokens_per_s", found.tokens_per_s, "tokens/s", "float", "1 / mean per-token latency"),
    ]
    if found.headwise_ratio is not None:
        values.append(
            SummaryValue(
                "headwise_attention_ratio",
                found.headwise_ratio,
                "",
                "float",
                "decode tokens: (per-head rows + output projection) / fused attention time",
            )
        )
    energy = energy_per_token_j(run)
    if energy is not None:
        values.append(
            SummaryValue("energy_per_token", energy, "J", "float", "mean energy per generated token")
        )
    return found.tables, tuple(values)
