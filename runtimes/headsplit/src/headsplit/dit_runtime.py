"""HeadSplit as a dit runtime: the entry point (``dit.runtimes`` in pyproject.toml) and its readiness plays.

With :mod:`headsplit.plugin` (the scenario block, launch, actions and results parser, as llamacpp's
plug-in splits them), the only headsplit code that imports the testbed (docs/runtimes.md is the
interface, docs/headsplit.md the user's guide). It must import without torch: the testbed loads it in the
controller's own venv to validate scenarios, so it imports nothing of headsplit but its torch-free
modules (``config``, ``placement``, ``memory``, ``checkpoint``, ``profile_costs``).

The processes it describes (HEADSPLIT.md, the contract with hs-core): one ``headsplit.worker`` per
worker device (background: torch RPC's rendezvous blocks until every rank joined, so there is no ready
file) and one ``headsplit.controller`` (main, rank 0) on the controller node; all of them read
``headsplit.json`` from their run directory and the controller writes ``results/headsplit.json``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from dit.analysis.run import LoadedRun
from dit.runtime_api.chapters import ChapterPlan, ChapterRequest, ChapterRuns, ChapterSections
from dit.runtime_api.placement import PlacementModel
from dit.runtimes import (
    Action,
    BlockProblem,
    LaunchContext,
    LaunchSpec,
    ReadinessPlan,
    Results,
    RuntimeBase,
)
from dit.runtimes.helpers import EDGE, MIB, memory_limits, node_problems, worker_hosts
from headsplit import __version__, memory, placement, profile_costs
from headsplit.config import ModelConfig, preset
from headsplit.plugin.actions import (
    CHECKPOINT_INPUTS,
    PROFILE_INPUTS,
    build_speculation_profile,
    distribute_checkpoint,
)
from headsplit.plugin.common import (
    DEFAULT_PORT,
    PY,
    HeadSplitLaunchError,
    HeadSplitResultsError,
)
from headsplit.plugin.launch import checkpoint_problem, launch_specs, model_doc, read_paragraph
from headsplit.plugin.results import parse
from headsplit.plugin.schema import block_schema

__all__ = ["HeadSplitLaunchError", "HeadSplitResultsError", "HeadSplitRuntime"]

VERSIONS_CHECK = (
    "import importlib, sys; m = importlib.import_module(sys.argv[1]); "
    "print(sys.argv[1], getattr(m, '__version__', 'imported'))"
)
PORT_CHECK = (
    "import socket, sys\n"
    "if sys.argv[2] != 'controller':\n"
    "    print('not the controller'); sys.exit(0)\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "try:\n"
    "    s.bind(('', int(sys.argv[1])))\n"
    "except OSError as exc:\n"
    "    sys.exit(f'port {sys.argv[1]} is in use: {exc}')\n"
    "print(f'port {sys.argv[1]} is free')\n"
)
CHECKS = ("python", "torch", "headsplit", "rpc-port")


# -- readiness and actions ----------------------------------------------------------------------


def _block_of(scenario: Mapping[str, Any] | None) -> Mapping[str, Any]:
    block = scenario.get("runtime") if scenario else None
    return block if isinstance(block, Mapping) else {}


def readiness_plays(block: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per node: the runtime interpreter runs, imports torch and headsplit (versions printed); on the
    controller's node the rendezvous port is free (elsewhere that check says so and passes)."""
    controller = str(block.get("controller", EDGE))
    role = (
        "{{ 'controller' if 'edge' in group_names else 'worker' }}"
        if controller == EDGE
        else "{{ 'controller' if inventory_hostname == dit_headsplit_controller else 'worker' }}"
    )
    port = str(int(block.get("port", DEFAULT_PORT)))

    def check(name: str, argv: list[str]) -> dict[str, Any]:
        return {
            "name": f"check: {name}",
            "ansible.builtin.command": {"argv": argv},
            "changed_when": False,
            "ignore_errors": True,
        }

    return [
        {
            "name": "Readiness of the headsplit runtime",
            "hosts": "all",
            "gather_facts": False,
            "tasks": [
                check("python", [PY, "-c", "import sys; print(sys.version.split()[0])"]),
                check("torch", [PY, "-c", VERSIONS_CHECK, "torch"]),
                check("headsplit", [PY, "-c", VERSIONS_CHECK, "headsplit"]),
                check("rpc-port", [PY, "-c", PORT_CHECK, port, role]),
            ],
        }
    ]


def pressure_problems(block: Mapping[str, Any]) -> list[BlockProblem]:
    """``memory_pressure``: ``replace_at`` before ``full_at``, and before the last generated token."""
    pressure = block.get("memory_pressure")
    if not isinstance(pressure, Mapping):
        return []
    replace_at, full_at = pressure.get("replace_at"), pressure.get("full_at")
    tokens = block.get("tokens", 16)
    if not (isinstance(replace_at, int) and isinstance(full_at, int) and isinstance(tokens, int)):
        return []  # the schema names the field
    problems = []
    if full_at <= replace_at:
        problems.append(
            BlockProblem(("memory_pressure", "full_at"), f"{full_at} is not after replace_at ({replace_at})")
        )
    if replace_at >= tokens:
        problems.append(
            BlockProblem(
                ("memory_pressure", "replace_at"),
                f"{replace_at} is not before the last of the {tokens} tokens (token {tokens - 1})",
            )
        )
    return problems


def memory_problems(block: Mapping[str, Any], scenario: Mapping[str, Any]) -> list[BlockProblem]:
    """Each worker's peak need (:func:`headsplit.memory.needs`) against its device's memory limit, for the
    placement the run would make with equal worker speeds (the controller places with measured ones and
    checks again before anything is built): a worker that would be killed is refused at ``dit validate``."""
    raw = scenario.get("devices")
    devices = [str(d) for d in raw] if isinstance(raw, list) else []
    controller = str(block.get("controller", EDGE))
    workers = worker_hosts(block, devices, controller, default_excludes_controller=False)
    limits = memory_limits(scenario, workers)
    if not limits or not workers:
        return []
    try:
        doc = model_doc(block, len(workers))
        cfg = ModelConfig.from_json(doc["config"]) if "config" in doc else preset(doc["preset"])
    except (HeadSplitLaunchError, ValueError, TypeError):
        return []  # the schema and the launch name what is wrong with the model
    tokens = block.get("tokens", 16)
    if not isinstance(tokens, int):
        return []
    context = max(len(str(block.get("prompt", "")).encode()), 1) + tokens  # byte-level: the most tokens
    names = {f"worker{rank}": device for rank, device in enumerate(workers, start=1)}
    strategy = block.get("strategy", "greedy")
    if strategy not in placement.STRATEGIES:
        return []  # the schema names it
    specs = [placement.WorkerSpec(w, limits.get(d, 1 << 50), 1e9, 0) for w, d in names.items()]
    try:
        plan = dict(placement.place(cfg, specs, cast(placement.Strategy, strategy), context_tokens=context))
    except placement.PlacementError as exc:
        return [BlockProblem(("model",), f"{cfg.name} does not fit {len(workers)} workers: {exc}")]
    problems = []
    for worker, need in memory.needs(cfg, plan, context).items():
        device = names[worker]
        limit = limits.get(device, 0)
        if limit and need.peak_bytes > limit:
            problems.append(
                BlockProblem(
                    ("model",),
                    f"{cfg.name} {strategy} on {len(workers)} workers: {worker} ({device}) needs "
                    f"{need.describe()}, hardware.{device}.memory_limit_mb is {limit // MIB}: raise it to at "
                    f"least {-(-need.peak_bytes // MIB)} or place the model on more workers",
                )
            )
    return problems


class HeadSplitRuntime(RuntimeBase):
    """Attention heads placed across workers over torch RPC, with cross-layer speculation."""

    name = "headsplit"
    version = __version__
    title = "HeadSplit: attention heads across workers over torch RPC, cross-layer speculation"
    # local mode: every process listens on its device's own address (headsplit.netif.pin), so what it
    # sends on the connections made to it leaves from there (docs/network.md says what does not)
    sends_from_source_address = True

    def check_block(self, block: Mapping[str, Any], scenario: Mapping[str, Any]) -> list[BlockProblem]:
        """At ``dit validate``: the controller and the workers are nodes of this scenario; the paragraph
        ``perplexity`` scores can be read (``perplexity_paragraph`` only with ``perplexity: true``); a
        trained model has its ``checkpoint``; the profile run ``placement_profile`` names has costs of
        every worker's device and of no other; ``memory_pressure`` passes the threshold before the limit
        and before the last token; every worker's peak need fits its device's ``memory_limit_mb``
        (:func:`memory_problems`)."""
        problems = node_problems(block, scenario, default_excludes_controller=False)
        _, problem = read_paragraph(block)
        if problem is not None:
            problems.append(BlockProblem(("perplexity_paragraph",), problem))
        problem = checkpoint_problem(block)
        if problem is not None:
            problems.append(BlockProblem(("checkpoint",), problem))
        problems += pressure_problems(block)
        if not problems:
            problems += memory_problems(block, scenario)
        path = block.get("placement_profile")
        if isinstance(path, str) and not problems:
            raw = scenario.get("devices")
            devices = [str(d) for d in raw] if isinstance(raw, list) else []
            controller = str(block.get("controller", EDGE))
            workers = worker_hosts(block, devices, controller, default_excludes_controller=False)
            try:
                profile_costs.costs_document(profile_costs.read_profile(path), workers)
            except profile_costs.ProfileError as exc:
                problems.append(BlockProblem(("placement_profile",), str(exc)))
        return problems

    def block_schema(self) -> Mapping[str, Any]:
        return block_schema()

    def readiness(self, scenario: Mapping[str, Any] | None, workdir: Path) -> ReadinessPlan:
        block = _block_of(scenario)
        # the block's strings travel as variables (data), never pasted into the plays' text
        extravars: dict[str, Any] = {"dit_headsplit_controller": str(block.get("controller", EDGE))}
        if block.get("python"):
            extravars["dit_headsplit_check_python"] = block["python"]
        return ReadinessPlan(plays=readiness_plays(block), checks=CHECKS, extravars=extravars)

    def actions(self) -> Sequence[Action]:
        return (
            Action(
                "distribute-checkpoint",
                "Distribute a checkpoint",
                "Copies a checkpoint (file or Hugging Face directory) to every node "
                "(<dit_remote_base>/headsplit/files/<sha256>/), or with mode placement cuts it here into one "
                "safetensors file per worker holding its units' tensors and copies each worker its own "
                "(.../<sha256>/shards/); every copy is verified on its node by SHA-256.",
                CHECKPOINT_INPUTS,
                distribute_checkpoint,
            ),
            Action(
                "build-speculation-profile",
                "Build the speculation profile",
                "Runs python -m headsplit.speculation on the edge server, fetches the profile and copies it "
                "to every device (<dit_remote_base>/headsplit/profiles/), SHA-256 verified.",
                PROFILE_INPUTS,
                build_speculation_profile,
            ),
        )

    def launch(self, ctx: LaunchContext) -> Sequence[LaunchSpec]:
        return launch_specs(ctx)

    def parse_results(self, run: LoadedRun) -> Results:
        return parse(run)

    # The chapter's sections import dit's report and simulator: loaded when a chapter asks, not when dit
    # loads the runtime to validate a scenario
    def chapter_plan(self, request: ChapterRequest) -> ChapterPlan | None:
        from headsplit.plugin import chapter6

        return chapter6.chapter_plan(request)

    def chapter_sections(self, runs: ChapterRuns) -> ChapterSections | None:
        from headsplit.plugin import chapter6

        return chapter6.chapter_sections(runs)

    def placement_model(self) -> PlacementModel:
        """HeadSplit's placement and cost model, which ``dit simulate`` places every unit with."""
        from headsplit.plugin.placement_model import MODEL

        return MODEL
