"""HeadSplit as a dit runtime: the scenario block, launch, readiness, actions and results parser.

The only headsplit module that imports the testbed (docs/runtimes.md is the interface, docs/headsplit.md
the user's guide). It must import without torch: the testbed loads it in the controller's own venv to
validate scenarios, so it imports nothing of headsplit but the torch-free ``headsplit.config``.

The processes it describes (HEADSPLIT.md, the contract with hs-core): one ``headsplit.worker`` per
worker device (background: torch RPC's rendezvous blocks until every rank joined, so there is no ready
file) and one ``headsplit.controller`` (main, rank 0) on the controller node; all of them read
``headsplit.json`` from their run directory and the controller writes ``results/headsplit.json``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import posixpath
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dit.analysis.run import AggregateError, LoadedRun
from dit.runtimes import (
    Action,
    ActionPlan,
    LaunchContext,
    LaunchSpec,
    ReadinessPlan,
    Results,
    RuntimeBase,
    SummaryValue,
    helpers,
)
from dit.runtimes.helpers import EDGE, energy_summary, memory_limit_bytes, write_csv
from headsplit import __version__
from headsplit import checkpoint as ckpt
from headsplit.config import PRESETS

CONFIG_FILE = "headsplit.json"
RESULT_FILE = "results/headsplit.json"
RESULT_NAME = "headsplit.json"  # collected as raw/<controller>/<controller>_headsplit.json
CONTROLLER_TAG = "hs-controller"
WORKER_TAG = "hs-worker{rank}"
STRATEGIES = ("layerwise", "roundrobin", "greedy")
DEFAULT_PORT = 29500
NODE_NAME = "^[A-Za-z][A-Za-z0-9_-]{0,62}$"
SHA256 = "^[0-9a-f]{64}$"
SHA256_TEXT = "is not a SHA-256 (64 lower-case hexadecimal digits)"
# Where the actions put files on a node (below its dit_remote_base) and where the launch finds them.
FILES_DIR = "headsplit/files"
SHARDS_DIR = "shards"  # below FILES_DIR/<pin>/: the per-worker shards of distribute-checkpoint
SHARDS_JSON = "shards.json"
PROFILES_DIR = "headsplit/profiles"
# The readiness plays' interpreter: the block's ``python`` (passed as an extra var), else the node's
# headsplit venv (``dit_headsplit_python``, see _runtime_python), else the node's dit Python.
PY = (
    "{{ dit_headsplit_check_python | default(dit_headsplit_python) | default(dit_python)"
    " | default(ansible_python_interpreter) | default('/usr/bin/python3') }}"
)
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


class HeadSplitLaunchError(ValueError):
    """A runtime block the launch cannot turn into processes; the message names the field."""


class HeadSplitResultsError(AggregateError):
    """A results file that is not what the contract says; the message names the file and the field."""


def block_schema() -> dict[str, Any]:
    """The JSON Schema of the scenario's ``runtime`` block (``name: headsplit`` added by dit)."""
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "model": {
                "title": "Model",
                "description": "The decoder, a preset of headsplit.config: `gpt2-small` and `tinyllama` at "
                "full size, `gpt2-tiny`, `llama-tiny` and `tinyllama-half` reduced (laptops, CI). Weights are "
                "seeded unless `checkpoint` is given. `smollm2-135m` is the trained SmolLM2-135M-Instruct: it "
                "needs `checkpoint` (the directory `python -m dit.models.convert smollm2-135m DIR` writes) "
                "and its prompt is tokenized with the model's own tokenizer on the machine running dit.",
                "enum": sorted(PRESETS),
                "default": "gpt2-tiny",
            },
            "checkpoint": {
                "title": "Checkpoint",
                "description": "A real checkpoint on the machine running dit: a safetensors file (shapes from "
                "`model`) or a Hugging Face-format directory (config.json + safetensors, maybe sharded; "
                "the model comes from its config.json), with its pin; the `distribute-checkpoint` action "
                "puts it (or per-worker shards of it) on the nodes, the processes verify it.",
                "type": "object",
                "additionalProperties": False,
                "required": ["path", "sha256"],
                "properties": {
                    "path": {
                        "description": "The checkpoint file or directory.",
                        "type": "string",
                        "minLength": 1,
                    },
                    "sha256": {
                        "description": "Its pin: a file's SHA-256; a directory's manifest hash "
                        "(`python -m headsplit.checkpoint DIR` prints it; docs/headsplit.md).",
                        "type": "string",
                        "pattern": SHA256,
                        "x-pattern-text": SHA256_TEXT,
                    },
                    "shards": {
                        "description": "The directory `distribute-checkpoint` (mode placement) wrote its "
                        "per-worker shards into on this machine (with shards.json): every worker reads only "
                        "its own shard and the run uses the placement they were cut for.",
                        "type": "string",
                        "minLength": 1,
                    },
                },
            },
            "controller": {
                "title": "Controller node",
                "description": "Where the controller (rank 0: embedding, LM head, placement) runs: `edge` (the "
                "edge server, the default; the article's controller is its own board) or a device that is "
                "not a worker.",
                "type": "string",
                "pattern": NODE_NAME,
                "default": EDGE,
            },
            "workers": {
                "title": "Workers",
                "description": "The devices that run a worker (rank 1, 2, ... in this order); every device "
                "of the scenario when absent. The article uses 4.",
                "type": "array",
                "minItems": 1,
                "uniqueItems": True,
                "items": {"type": "string", "pattern": NODE_NAME},
            },
            "strategy": {
                "title": "Placement strategy",
                "description": "`layerwise`: contiguous layers per worker (EdgeShard-style baseline); "
                "`roundrobin`: heads dealt in turn; `greedy`: FFN and projection first, then heads, "
                "balancing memory, costed with the measured RTT + 15 %.",
                "enum": list(STRATEGIES),
                "default": "greedy",
            },
            "speculation": {
                "title": "Cross-layer speculation",
                "description": "Start the next layer's attention on Z while the FFN runs; keep it when "
                "||FFN(Z)|| / ||Z|| < tau, else re-execute.",
                "type": "boolean",
                "default": False,
            },
            "tau": {
                "title": "Tolerance",
                "description": "The speculation tolerance on ||FFN(Z)|| / ||Z||; 0 makes speculation exact.",
                "type": "number",
                "minimum": 0,
                "default": 0.05,
            },
            "speculation_profile": {
                "title": "Speculation profile",
                "description": "The offline profile (which layer transitions speculate), a path on the machine "
                "running dit as `build-speculation-profile` fetched it; without one every transition "
                "speculates.",
                "type": "string",
                "minLength": 1,
            },
            "tokens": {
                "title": "Tokens",
                "description": "Tokens to generate after the prompt.",
                "type": "integer",
                "minimum": 1,
                "maximum": 4096,
                "default": 16,
            },
            "prompt": {
                "title": "Prompt",
                "description": "The prompt (byte-level tokens: id = byte % vocab).",
                "type": "string",
                "minLength": 1,
                "maxLength": 8192,
                "default": "Heads expose the parallelism that layers hide.",
            },
            "memory_threshold": {
                "title": "Re-placement threshold",
                "description": "Re-run the placement when a worker's memory passes this fraction of its limit.",
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": 1,
                "default": 0.85,
            },
            "rpc_timeout_s": {
                "title": "RPC timeout",
                "description": "Seconds after which a stalled RPC is retried.",
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": 3600,
                "default": 30,
            },
            "rpc_retries": {
                "title": "RPC retries",
                "description": "Retries of a stalled RPC before the run fails.",
                "type": "integer",
                "minimum": 0,
                "maximum": 10,
                "default": 3,
            },
            "port": {
                "title": "Rendezvous port",
                "description": "TCP port of torch RPC's rendezvous on the controller.",
                "type": "integer",
                "minimum": 1024,
                "maximum": 65535,
                "default": DEFAULT_PORT,
            },
            "threads": {
                "title": "Threads",
                "description": "torch threads of every process.",
                "type": "integer",
                "minimum": 1,
                "maximum": 256,
                "default": 1,
            },
            "python": {
                "title": "Runtime interpreter",
                "description": "The interpreter of headsplit's venv on every node (absolute path); without it "
                "the node's `dit_headsplit_python`, else its dit Python.",
                "type": "string",
                "pattern": "^/",
                "x-pattern-text": "is not an absolute path",
            },
        },
    }


# -- launch -------------------------------------------------------------------------------------


def _runtime_python(ctx: LaunchContext, host: str) -> str:
    """The interpreter of headsplit on ``host``: the block's ``python``, else the testbed's choice.

    The testbed's choice (:meth:`LaunchContext.runtime_python`) is the node's runtime venv when
    ``dit runtimes install headsplit`` made one at the mirror's pin (docs/runtimes.md, "Runtime
    environments"), else the node's dit Python. The readiness plays use the same order with the host var
    ``dit_headsplit_python`` in the middle.
    """
    explicit = ctx.block.get("python")
    if isinstance(explicit, str) and explicit:
        return explicit
    return ctx.runtime_python(host)


def _node_base(ctx: LaunchContext, host: str) -> str:
    """The node's dit directory (``dit_remote_base``): the parent of its run directory."""
    return posixpath.dirname(ctx.node_roots[host].rstrip("/"))


def checkpoint_on_node(ctx: LaunchContext, host: str, path: str, sha256: str) -> str:
    """Where ``distribute-checkpoint`` put the checkpoint on ``host`` (local mode: the path itself)."""
    if ctx.local:
        return os.path.abspath(path)
    return f"{_node_base(ctx, host)}/{FILES_DIR}/{sha256}/{posixpath.basename(path)}"


def shards_doc(block: Mapping[str, Any], n_workers: int) -> dict[str, Any] | None:
    """``shards.json`` of ``checkpoint.shards`` (None without shards), checked against the block."""
    ck = block.get("checkpoint")
    if not isinstance(ck, Mapping) or not ck.get("shards"):
        return None
    file = Path(str(ck["shards"])) / SHARDS_JSON
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise HeadSplitLaunchError(f"runtime.checkpoint.shards: {file} cannot be read ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), dict):
        raise HeadSplitLaunchError(f"runtime.checkpoint.shards: {file} is not a shards.json (no files)")
    if doc.get("checkpoint_sha256") != ck.get("sha256"):
        raise HeadSplitLaunchError(
            f"runtime.checkpoint.shards: {file} was cut from checkpoint {doc.get('checkpoint_sha256')}, "
            f"runtime.checkpoint.sha256 is {ck.get('sha256')}"
        )
    workers = sorted(k for k in doc["files"] if k != "controller")
    if len(workers) != n_workers:
        raise HeadSplitLaunchError(
            f"runtime.checkpoint.shards: {file} holds shards for {len(workers)} workers, the run has {n_workers}"
        )
    return doc


def _shard_on_node(ctx: LaunchContext, host: str, block: Mapping[str, Any], file: str) -> str:
    ck = block["checkpoint"]
    if ctx.local:
        return os.path.abspath(os.path.join(str(ck["shards"]), file))
    return f"{_node_base(ctx, host)}/{FILES_DIR}/{ck['sha256']}/{SHARDS_DIR}/{file}"


def _checkpoint_config(ctx: LaunchContext, host: str, workers: Sequence[str]) -> dict[str, Any] | None:
    ck = ctx.block.get("checkpoint")
    if not isinstance(ck, Mapping):
        return None
    doc = shards_doc(ctx.block, len(workers))
    if doc is None:
        return {
            "path": checkpoint_on_node(ctx, host, str(ck["path"]), str(ck["sha256"])),
            "sha256": str(ck["sha256"]),
        }
    files = doc["files"]
    return {
        "path": _shard_on_node(ctx, host, ctx.block, str(files["controller"]["file"])),
        "sha256": str(files["controller"]["sha256"]),
        "shards": {
            f"worker{rank}": {
                "path": _shard_on_node(ctx, device, ctx.block, str(files[f"worker{rank}"]["file"])),
                "sha256": str(files[f"worker{rank}"]["sha256"]),
            }
            for rank, device in enumerate(workers, start=1)
        },
    }


def model_doc(block: Mapping[str, Any], n_workers: int) -> dict[str, Any]:
    """``model`` of headsplit.json: the preset, or the checkpoint's own shape (its config.json, or the
    shards' record of it); a config HeadSplit cannot run is refused here, naming its field."""
    doc = shards_doc(block, n_workers)
    if doc is not None and isinstance(doc.get("model"), dict):
        return {"config": doc["model"]}
    ck = block.get("checkpoint")
    if isinstance(ck, Mapping):
        try:
            cfg = ckpt.directory_config(Path(str(ck["path"])))
        except ckpt.CheckpointError as exc:
            raise HeadSplitLaunchError(f"runtime.checkpoint.path: {exc}") from None
        if cfg is not None:
            return {"config": cfg.to_json()}
    return {"preset": str(block.get("model", "gpt2-tiny"))}


#: Presets with trained weights and their own tokenizer: the dit catalogue model of the same name.
TRAINED = ("smollm2-135m",)


@functools.lru_cache(maxsize=8)
def _tokenize(model: str, text: str) -> tuple[int, ...]:
    try:
        from transformers import AutoTokenizer

        from dit.models.catalogue import entry
        from dit.models.packaged import ensure_packaged
        from dit.models.weights import WeightsError
    except ImportError as exc:
        raise HeadSplitLaunchError(
            f"runtime.model: {model} tokenizes the prompt with its own tokenizer, which needs dit[llm] "
            f"(transformers, gguf) on the machine running dit ({exc})"
        ) from None
    try:
        path, _ = ensure_packaged(entry(model))
    except WeightsError as exc:
        raise HeadSplitLaunchError(f"runtime.model: {model}: {exc}") from None
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return tuple(int(i) for i in tokenizer(text)["input_ids"])


def prompt_ids(block: Mapping[str, Any]) -> list[int] | None:
    """The prompt in a trained model's own tokens, tokenized here (the nodes' HeadSplit venvs have no
    tokenizer); None for the other presets (byte-level tokens on the controller)."""
    name = str(block.get("model", "gpt2-tiny"))
    if name not in TRAINED:
        return None
    if not isinstance(block.get("checkpoint"), Mapping):
        raise HeadSplitLaunchError(
            f"runtime.checkpoint: model {name} runs its trained weights: give the directory "
            f"`python -m dit.models.convert {name} DIR` writes and the pin it prints"
        )
    return list(_tokenize(name, str(block.get("prompt", "")) or "Hello"))


def profile_on_node(ctx: LaunchContext, host: str, path: str) -> str:
    """Where ``build-speculation-profile`` put the profile on ``host`` (local mode: the path itself)."""
    if ctx.local:
        return os.path.abspath(path)
    return f"{_node_base(ctx, host)}/{PROFILES_DIR}/{posixpath.basename(path)}"


def controller_host(ctx: LaunchContext) -> str:
    return helpers.controller_host(ctx.block, ctx.edge_host, ctx.devices, error=HeadSplitLaunchError)


def worker_hosts(ctx: LaunchContext, controller: str) -> list[str]:
    """``runtime.workers``, else every device (the controller's node must then be the edge server)."""
    return helpers.worker_hosts(
        ctx.block, ctx.devices, controller, default_excludes_controller=False, error=HeadSplitLaunchError
    )


def run_config(ctx: LaunchContext, host: str) -> dict[str, Any]:
    """``headsplit.json`` as ``host`` reads it (paths of distributed files are the node's own)."""
    block = ctx.block
    controller = controller_host(ctx)
    workers = worker_hosts(ctx, controller)
    profile = block.get("speculation_profile")
    shards = shards_doc(block, len(workers))
    return {
        "model": model_doc(block, len(workers)),
        "checkpoint": _checkpoint_config(ctx, host, workers),
        **({"placement": shards["placement"]} if shards is not None else {}),
        "controller": {
            "host": controller,
            "address": ctx.addresses[controller],
            "port": int(block.get("port", DEFAULT_PORT)),
        },
        "workers": [
            {
                "rank": rank,
                "name": f"worker{rank}",
                "host": device,
                "address": ctx.addresses[device],
                "memory_limit_bytes": memory_limit_bytes(ctx.scenario, device),
            }
            for rank, device in enumerate(workers, start=1)
        ],
        "strategy": str(block.get("strategy", "greedy")),
        "speculation": bool(block.get("speculation", False)),
        "tau": float(block.get("tau", 0.05)),
        "speculation_profile": profile_on_node(ctx, host, str(profile)) if isinstance(profile, str) else None,
        "tokens": int(block.get("tokens", 16)),
        "prompt": str(block.get("prompt", "")),
        "prompt_ids": prompt_ids(block),
        "memory_threshold": float(block.get("memory_threshold", 0.85)),
        "rpc_timeout_s": float(block.get("rpc_timeout_s", 30)),
        "rpc_retries": int(block.get("rpc_retries", 3)),
        "threads": int(block.get("threads", 1)),
        "result": RESULT_FILE,
    }


def launch_specs(ctx: LaunchContext) -> list[LaunchSpec]:
    """Workers first (background, no ready file), then the controller (main, with the result file)."""
    controller = controller_host(ctx)
    workers = worker_hosts(ctx, controller)
    specs: list[LaunchSpec] = []
    for rank, device in enumerate(workers, start=1):
        specs.append(
            LaunchSpec(
                host=device,
                name=WORKER_TAG.format(rank=rank),
                argv=(_runtime_python(ctx, device), "-m", "headsplit.worker", "--config", CONFIG_FILE,
                      "--rank", str(rank)),
                files={CONFIG_FILE: json.dumps(run_config(ctx, device), indent=2)},
                main=False,  # torch RPC's rendezvous blocks until every rank joined: no ready file
            )
        )  # fmt: skip
    specs.append(
        LaunchSpec(
            host=controller,
            name=CONTROLLER_TAG,
            argv=(_runtime_python(ctx, controller), "-m", "headsplit.controller", "--config", CONFIG_FILE),
            files={CONFIG_FILE: json.dumps(run_config(ctx, controller), indent=2)},
            result_files=(RESULT_FILE,),
        )
    )
    return specs


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


CHECKPOINT_INPUTS: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["path", "sha256"],
    "properties": {
        "path": {"description": "The checkpoint file or Hugging Face directory on this machine.",
                 "type": "string", "minLength": 1},
        "sha256": {"description": "Its pin (a file's SHA-256, a directory's manifest hash).",
                   "type": "string", "pattern": SHA256, "x-pattern-text": SHA256_TEXT},
        "mode": {"description": "`whole`: every node receives the whole checkpoint; `placement`: each worker "
                 "receives a safetensors file with the tensors of the units placed on it, the controller "
                 "its own (embedding, LM head).", "enum": ["whole", "placement"], "default": "whole"},
        "workers": {"description": "mode placement: the scenario's workers (runtime.workers), rank order.",
                    "type": "array", "minItems": 1, "uniqueItems": True,
                    "items": {"type": "string", "pattern": NODE_NAME}},
        "controller": {"description": "mode placement: the controller's node (`edge`: the edge server).",
                       "type": "string", "pattern": NODE_NAME, "default": EDGE},
        "strategy": {"description": "mode placement: the placement the shards are cut for (greedy assumes "
                     "equal workers: the run's measured RTTs are not known yet).",
                     "enum": list(STRATEGIES), "default": "layerwise"},
        "model": {"description": "mode placement, a single file: its preset (a directory has config.json).",
                  "enum": sorted(PRESETS)},
        "memory_mb": {"description": "mode placement: the memory per worker the placement must fit.",
                      "type": "integer", "minimum": 1, "default": 1 << 20},
        "out": {"description": "mode placement: the directory on this machine the shards are written to "
                "(give it as the scenario's runtime.checkpoint.shards).", "type": "string", "minLength": 1,
                "default": "headsplit-shards"},
    },
}  # fmt: skip

PROFILE_INPUTS: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "model": {"description": "The model preset.", "enum": sorted(PRESETS), "default": "gpt2-tiny"},
        "tau": {"description": "The tolerance the profile is built for.", "type": "number", "minimum": 0,
                "default": 0.05},
        "corpus": {"description": "A text corpus on the edge server (default: headsplit's own).",
                   "type": "string", "minLength": 1},
        "out": {"description": "Directory on this machine the profile is fetched into.", "type": "string",
                "minLength": 1, "default": "headsplit-profiles"},
    },
}  # fmt: skip


def _verified_copy_tasks(
    src: str, dest_dir: str, name: str, sha_expr: str, what: str
) -> list[dict[str, Any]]:
    """Copy ``src`` to ``dest_dir/name`` on the node and check its SHA-256 there (both hashes on failure)."""
    dest = f"{dest_dir}/{name}"
    return [
        {
            "name": f"The {what}'s directory",
            "ansible.builtin.file": {"path": dest_dir, "state": "directory", "mode": "0755"},
        },
        {
            "name": f"Copy the {what}",
            "ansible.builtin.copy": {"src": src, "dest": dest, "mode": "0644"},
        },
        {
            "name": f"SHA-256 of the {what} on the node",
            "ansible.builtin.stat": {"path": dest, "get_checksum": True, "checksum_algorithm": "sha256"},
            "register": "hs_copied",
        },
        {
            "name": f"The {what}'s SHA-256 on the node is the expected one",
            "ansible.builtin.assert": {
                "that": [f"hs_copied.stat.checksum == {sha_expr}"],
                "fail_msg": (
                    f"{{{{ inventory_hostname }}}}: {dest}: SHA-256 {{{{ hs_copied.stat.checksum }}}}, "
                    f"expected {{{{ {sha_expr} }}}}"
                ),
                "quiet": True,
            },
        },
    ]


BASE = "{{ dit_remote_base | default('/var/tmp/dit') }}"


LOCAL_PY = "{{ ansible_playbook_python }}"  # this machine's dit interpreter (headsplit is installed in it)


def _local(task: dict[str, Any]) -> dict[str, Any]:
    return {**task, "delegate_to": "localhost", "run_once": True}


def _node_verify(dest: str, sha: str, what: str) -> dict[str, Any]:
    """Verify a checkpoint file or directory on the node with headsplit's own check (names the file and
    both hashes; a directory is checked file by file against the SHA256SUMS sent with it)."""
    return {
        "name": f"The {what} on the node is the pinned one",
        "ansible.builtin.command": {"argv": [PY, "-m", "headsplit.checkpoint", dest, "--sha256", sha]},
        "changed_when": False,
    }


# An action's inputs, and what is derived from them here (an absolute path, a file name), reach the plays
# only as these variables: the plays' own text is a template, and a path such as "x{{ lookup(...) }}" pasted
# into it would run on this machine. Extra variables are written unsafe (data, never a template).
CK_PATH = "{{ hs_checkpoint_path }}"
CK_NAME = "{{ hs_checkpoint_name }}"
OUT = "{{ hs_out }}"


def _whole_file_play() -> dict[str, Any]:
    """One safetensors file: checked here and on every node with Ansible's own SHA-256 (no headsplit
    needed on this machine)."""
    path, name = CK_PATH, CK_NAME
    local = [
        _local({
            "name": "SHA-256 of the checkpoint on this machine",
            "ansible.builtin.stat": {"path": path, "get_checksum": True, "checksum_algorithm": "sha256"},
            "register": "hs_local",
        }),
        _local({
            "name": "The checkpoint on this machine is the pinned one",
            "ansible.builtin.assert": {
                "that": ["hs_local.stat.exists", "hs_local.stat.checksum == dit_action_inputs.sha256"],
                "fail_msg": (
                    f"{path}: SHA-256 {{{{ hs_local.stat.checksum | default('(no such file)') }}}}, "
                    "expected {{ dit_action_inputs.sha256 }}"
                ),
                "quiet": True,
            },
        }),
    ]  # fmt: skip
    return {
        "name": "HeadSplit: distribute the checkpoint",
        "hosts": "all",
        "gather_facts": False,
        "tasks": local + _verified_copy_tasks(
            path, f"{BASE}/{FILES_DIR}/{{{{ dit_action_inputs.sha256 }}}}", name,
            "dit_action_inputs.sha256", "checkpoint",
        ),
    }  # fmt: skip


def distribute_checkpoint(inputs: Mapping[str, Any]) -> ActionPlan:
    """Verify the checkpoint here; copy it whole to every node, or cut it into per-worker shards here
    and copy each worker its own; verify every copy on its node."""
    local_path = os.path.abspath(str(inputs["path"]))
    extravars: dict[str, Any] = {
        "hs_checkpoint_path": local_path,
        "hs_checkpoint_name": posixpath.basename(local_path.rstrip("/")),
    }
    path, name = CK_PATH, CK_NAME
    sha = "{{ dit_action_inputs.sha256 }}"
    here = _local({
        "name": "The checkpoint on this machine is the pinned one",
        "ansible.builtin.command": {"argv": [LOCAL_PY, "-m", "headsplit.checkpoint", path, "--sha256", sha]},
        "changed_when": False,
    })  # fmt: skip
    dest_dir = f"{BASE}/{FILES_DIR}/{sha}"
    if inputs.get("mode", "whole") == "whole" and not os.path.isdir(local_path):
        return ActionPlan(plays=[_whole_file_play()], extravars=extravars)
    if inputs.get("mode", "whole") == "whole":
        is_dir = True
        tasks: list[dict[str, Any]] = [
            here,
            {"name": "The checkpoint's directory", "ansible.builtin.file": {"path": dest_dir, "state": "directory",
                                                                            "mode": "0755"}},
            {"name": "Copy the checkpoint", "ansible.builtin.copy": {"src": path, "dest": f"{dest_dir}/",
                                                                     "mode": "preserve" if is_dir else "0644"}},
        ]  # fmt: skip
        if is_dir:  # the manifest taken here goes with it: the node names a changed file
            extravars["hs_checkpoint_manifest"] = ckpt.manifest_text(ckpt.manifest(Path(local_path)))
            tasks.append(
                {
                    "name": "The manifest of the checkpoint (SHA256SUMS)",
                    "ansible.builtin.copy": {
                        "content": "{{ hs_checkpoint_manifest }}",
                        "dest": f"{dest_dir}/{name}/{ckpt.SUMS}",
                        "mode": "0644",
                    },
                }
            )
        tasks.append(_node_verify(f"{dest_dir}/{name}", sha, "checkpoint"))
        play = {"name": "HeadSplit: distribute the checkpoint", "hosts": "all", "gather_facts": False,
                "tasks": tasks}  # fmt: skip
        return ActionPlan(plays=[play], extravars=extravars)
    workers = [str(w) for w in inputs.get("workers") or []]
    if not workers:
        raise HeadSplitLaunchError("workers: mode placement needs the scenario's workers (runtime.workers)")
    extravars |= {
        "hs_out": os.path.abspath(str(inputs.get("out", "headsplit-shards"))),
        "hs_workers": workers,
        "hs_controller": str(inputs.get("controller", EDGE)),
    }
    out = OUT
    argv = [LOCAL_PY, "-m", "headsplit.shard", "--checkpoint", path, "--sha256", sha, "--workers",
            str(len(workers)), "--strategy", str(inputs.get("strategy", "layerwise")), "--memory-mb",
            str(int(inputs.get("memory_mb", 1 << 20))), "--out", out]  # fmt: skip
    if inputs.get("model"):
        argv += ["--model", "{{ dit_action_inputs.model }}"]
    is_controller = (
        "'edge' in group_names"
        if extravars["hs_controller"] == EDGE
        else "inventory_hostname == hs_controller"
    )
    owner = f"('controller' if {is_controller} else 'worker' ~ (hs_workers.index(inventory_hostname) + 1))"
    record = f"(lookup('file', hs_out ~ '/{SHARDS_JSON}') | from_json).files[{owner}]"
    shard_dir = f"{dest_dir}/{SHARDS_DIR}"
    when = f"({is_controller}) or inventory_hostname in hs_workers"
    tasks = [
        here,
        _local({"name": "Cut the checkpoint into per-worker shards here", "ansible.builtin.command": {"argv": argv},
                "changed_when": True}),
        {"name": "The shards' directory", "ansible.builtin.file": {"path": shard_dir, "state": "directory",
                                                                   "mode": "0755"}, "when": when},
        {"name": "Copy this node's shard", "ansible.builtin.copy": {
            "src": f"{out}/{{{{ {record}.file }}}}", "dest": f"{shard_dir}/{{{{ {record}.file }}}}",
            "mode": "0644"}, "when": when},
        {**_node_verify(f"{shard_dir}/{{{{ {record}.file }}}}", f"{{{{ {record}.sha256 }}}}", "shard"),
         "when": when},
    ]  # fmt: skip
    play = {"name": "HeadSplit: distribute per-worker checkpoint shards", "hosts": "all", "gather_facts": False,
            "tasks": tasks}  # fmt: skip
    return ActionPlan(plays=[play], extravars=extravars)


def profile_name(model: str, tau: float) -> str:
    return f"speculation-{model}-tau{tau:g}.json"


def build_speculation_profile(inputs: Mapping[str, Any]) -> ActionPlan:
    """Run ``python -m headsplit.speculation`` on the edge server, fetch the profile, distribute it."""
    model, tau = str(inputs.get("model", "gpt2-tiny")), float(inputs.get("tau", 0.05))
    extravars = {
        "hs_profile_name": profile_name(model, tau),
        "hs_profile_model": model,
        "hs_out_dir": os.path.abspath(str(inputs.get("out", "headsplit-profiles"))),
    }
    name, out_dir = "{{ hs_profile_name }}", "{{ hs_out_dir }}"
    on_edge = f"{BASE}/{PROFILES_DIR}/{name}"
    argv = [PY, "-m", "headsplit.speculation", "--model", "{{ hs_profile_model }}", "--tau", f"{tau:g}",
            "--out", on_edge]  # fmt: skip
    if inputs.get("corpus"):
        extravars["hs_corpus"] = str(inputs["corpus"])
        argv += ["--corpus", "{{ hs_corpus }}"]
    build = {
        "name": "HeadSplit: build the speculation profile on the edge server",
        "hosts": "edge",
        "gather_facts": False,
        "tasks": [
            {
                "name": "The profiles directory",
                "ansible.builtin.file": {"path": f"{BASE}/{PROFILES_DIR}", "state": "directory", "mode": "0755"},
            },
            {"name": "Build the profile", "ansible.builtin.command": {"argv": argv}, "changed_when": True},
            {
                "name": "SHA-256 of the profile",
                "ansible.builtin.stat": {"path": on_edge, "get_checksum": True, "checksum_algorithm": "sha256"},
                "register": "hs_profile",
            },
            {
                "name": "Fetch the profile",
                "ansible.builtin.fetch": {"src": on_edge, "dest": f"{out_dir}/{name}", "flat": True},
            },
            {
                "name": "The profile's SHA-256",
                "ansible.builtin.set_fact": {"hs_profile_sha256": "{{ hs_profile.stat.checksum }}"},
            },
            {"name": "Say where it is", "ansible.builtin.debug": {
                "msg": f"{out_dir}/{name} sha256 {{{{ hs_profile_sha256 }}}}"}},
        ],
    }  # fmt: skip
    sha = "hostvars[groups['edge'][0]].hs_profile_sha256"
    distribute = {
        "name": "HeadSplit: distribute the speculation profile",
        "hosts": "devices",
        "gather_facts": False,
        "tasks": _verified_copy_tasks(f"{out_dir}/{name}", f"{BASE}/{PROFILES_DIR}", name, sha, "profile"),
    }
    return ActionPlan(plays=[build, distribute], extravars=extravars)


# -- results ------------------------------------------------------------------------------------

TOKEN_TIMINGS = (
    "total_ns",
    "attention_ns",
    "projection_ns",
    "ffn_ns",
    "gather_ns",
    "broadcast_ns",
    "reexec_ns",
)


def _where(file: Path, field: str, problem: str) -> HeadSplitResultsError:
    return HeadSplitResultsError(f"{file}: {field}: {problem}")


def _int(file: Path, doc: Mapping[str, Any], key: str, where: str) -> int:
    value = doc.get(key)
    if key not in doc:
        raise _where(file, f"{where}{key}", "is missing")
    if not isinstance(value, int) or isinstance(value, bool):
        raise _where(file, f"{where}{key}", f"{value!r} is not an integer")
    return value


def _list(file: Path, doc: Mapping[str, Any], key: str, where: str, *, optional: bool = False) -> list[Any]:
    value = doc.get(key)
    if value is None and (optional or key in doc):
        return []
    if key not in doc:
        raise _where(file, f"{where}{key}", "is missing")
    if not isinstance(value, list):
        raise _where(file, f"{where}{key}", f"{value!r} is not a list")
    return value


def _records(file: Path, doc: Mapping[str, Any], key: str, ints: Iterable[str]) -> list[Mapping[str, Any]]:
    rows: list[Mapping[str, Any]] = []
    for i, row in enumerate(_list(file, doc, key, "", optional=True)):
        if not isinstance(row, Mapping):
            raise _where(file, f"{key}[{i}]", f"{row!r} is not a mapping")
        for name in ints:
            _int(file, row, name, f"{key}[{i}].")
        rows.append(row)
    return rows


def read_results(file: Path) -> dict[str, Any]:
    """The controller's results file, checked field by field against the contract (HEADSPLIT.md)."""
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise HeadSplitResultsError(f"{file}: cannot be read ({exc.strerror})") from exc
    except json.JSONDecodeError as exc:
        raise HeadSplitResultsError(f"{file}: not JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise HeadSplitResultsError(f"{file}: the top level is not a mapping")
    for key in ("tokens_generated", "start_ns", "end_ns"):
        _int(file, doc, key, "")
    if "prompt_tokens" in doc:  # optional: the prompt rate is left out without it
        _int(file, doc, "prompt_tokens", "")
    rate = doc.get("tokens_per_s")
    if not isinstance(rate, int | float) or isinstance(rate, bool) or not math.isfinite(rate):
        raise _where(
            file, "tokens_per_s", f"{rate!r} is not a number" if "tokens_per_s" in doc else "is missing"
        )
    for i, token in enumerate(_list(file, doc, "tokens", "")):
        where = f"tokens[{i}]."
        if not isinstance(token, Mapping):
            raise _where(file, f"tokens[{i}]", f"{token!r} is not a mapping")
        for key in ("index", *TOKEN_TIMINGS):
            _int(file, token, key, where)
        for key in ("speculated", "accepted", "rejected"):
            for j, layer in enumerate(_list(file, token, key, where)):
                if not isinstance(layer, int) or isinstance(layer, bool):
                    raise _where(file, f"{where}{key}[{j}]", f"{layer!r} is not a layer index")
        links = token.get("bytes")
        if not isinstance(links, Mapping):
            raise _where(
                file, f"{where}bytes", "is missing" if "bytes" not in token else f"{links!r} is not a mapping"
            )
        for link, count in links.items():
            if not isinstance(count, int) or isinstance(count, bool):
                raise _where(file, f"{where}bytes[{link!r}]", f"{count!r} is not a byte count")
    _records(file, doc, "memory", ("token", "bytes"))
    _records(file, doc, "replacements", ("token", "planning_ns", "migration_ns", "moved_units"))
    _records(file, doc, "retries", ("time_ns", "attempt"))
    for i, worker in enumerate(_list(file, doc, "workers", "")):
        if not isinstance(worker, Mapping) or not isinstance(worker.get("name"), str):
            raise _where(file, f"workers[{i}].name", "is missing")
        for j, rtt in enumerate(_list(file, worker, "rtt_ns", f"workers[{i}].", optional=True)):
            if not isinstance(rtt, int) or isinstance(rtt, bool):
                raise _where(file, f"workers[{i}].rtt_ns[{j}]", f"{rtt!r} is not an integer")
    oom = doc.get("oom")
    if oom is not None:
        if not isinstance(oom, Mapping):
            raise _where(file, "oom", f"{oom!r} is neither null nor a mapping")
        _int(file, oom, "token", "oom.")
        if not isinstance(oom.get("worker"), str):
            raise _where(file, "oom.worker", "is missing")
    return doc


def find_results(run: LoadedRun) -> tuple[str, Path]:
    """The controller's host and its results file ``raw/<host>/<host>_headsplit.json``."""
    return helpers.find_results(run, RESULT_NAME, error=HeadSplitResultsError)


def _percentile(ordered: Sequence[int], q: float) -> int:
    """Nearest-rank percentile of sorted values."""
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def parse(run: LoadedRun) -> Results:
    """``raw/<controller>/<controller>_headsplit.json`` -> ``aggregate/hs_*.csv`` and summary values."""
    controller, file = find_results(run)
    doc = read_results(file)
    out = run.aggregate_dir
    tokens = list(doc["tokens"])
    extra = sorted({k for t in tokens for k in t if k.endswith("_ns") and k not in TOKEN_TIMINGS})
    timings = [*TOKEN_TIMINGS, *extra]
    bytes_per_token = [sum(int(v) for v in t["bytes"].values()) for t in tokens]
    tables = [
        write_csv(
            out / "hs_tokens.csv",
            ["token", "token_id", *timings, "speculated", "accepted", "rejected", "bytes"],
            (
                [
                    t["index"],
                    t.get("token_id", ""),
                    *(t.get(k, "") for k in timings),
                    len(t["speculated"]),
                    len(t["accepted"]),
                    len(t["rejected"]),
                    total,
                ]
                for t, total in zip(tokens, bytes_per_token, strict=True)
            ),
        ),
        write_csv(
            out / "hs_layers.csv",
            ["token", "layer", "speculated", "accepted"],
            (
                [t["index"], layer, int(layer in t["speculated"]), int(layer in t["accepted"])]
                for t in tokens
                for layer in sorted({*t["speculated"], *t["accepted"], *t["rejected"]})
            ),
        ),
        write_csv(
            out / "hs_links.csv",
            ["token", "link", "bytes"],
            ([t["index"], link, count] for t in tokens for link, count in sorted(t["bytes"].items())),
        ),
        write_csv(
            out / "hs_memory.csv",
            ["token", "worker", "bytes"],
            ([m["token"], m.get("worker", ""), m["bytes"]] for m in doc.get("memory") or []),
        ),
        write_csv(
            out / "hs_replacements.csv",
            ["token", "worker", "planning_ns", "migration_ns", "moved_units"],
            (
                [r["token"], r.get("worker", ""), r["planning_ns"], r["migration_ns"], r["moved_units"]]
                for r in doc.get("replacements") or []
            ),
        ),
        write_csv(
            out / "hs_retries.csv",
            ["time_ns", "worker", "call", "attempt", "error"],
            (
                [r["time_ns"], r.get("worker", ""), r.get("call", ""), r["attempt"], r.get("error", "")]
                for r in doc.get("retries") or []
            ),
        ),
        write_csv(
            out / "hs_rtt.csv",
            ["worker", "host", "sample", "rtt_ns"],
            (
                [w["name"], w.get("host", ""), i, rtt]
                for w in doc.get("workers") or []
                for i, rtt in enumerate(w.get("rtt_ns") or [])
            ),
        ),
    ]

    # the shared LLM columns (docs/runtimes.md, "LLM summary columns"): token 0 is the prompt's prefill,
    # the tokens after it the decode; a column this run cannot measure is left out, never approximated
    generated = int(doc["tokens_generated"])
    wall_ns = int(doc["end_ns"]) - int(doc["start_ns"])
    values = [
        SummaryValue("tokens_generated", generated, "", "int", "tokens generated"),
        SummaryValue("tokens_per_s", generated * 1e9 / wall_ns if wall_ns > 0 else None, "1/s", "float",
                     "generated tokens / (prefill + decode) wall time"),
    ]  # fmt: skip
    decode = sorted(int(t["total_ns"]) for t in tokens if t["index"] > 0)
    if decode:
        values += [
            SummaryValue("generation_tokens_per_s", len(decode) * 1e9 / sum(decode) if sum(decode) else None,
                         "1/s", "float", "tokens after the first / decode time (prefill excluded)"),
            SummaryValue("token_latency_mean", round(statistics.fmean(decode)), "ns", "int",
                         "mean latency of a generated token (prefill excluded)"),
            SummaryValue("token_latency_p50", _percentile(decode, 50), "ns", "int", "median token latency"),
            SummaryValue("token_latency_p99", _percentile(decode, 99), "ns", "int", "99th percentile token latency"),
        ]  # fmt: skip
    prefill = [int(t["total_ns"]) for t in tokens if t["index"] == 0]
    if prefill:
        values.append(
            SummaryValue("prefill_latency", prefill[0], "ns", "int", "token 0: the prompt's prefill")
        )
        prompt = doc.get("prompt_tokens")
        if isinstance(prompt, int) and not isinstance(prompt, bool) and prompt > 0 and prefill[0] > 0:
            values.append(
                SummaryValue("prompt_tokens_per_s", prompt * 1e9 / prefill[0], "1/s", "float",
                             "prompt tokens / prefill time")
            )  # fmt: skip
    total = sum(int(t["total_ns"]) for t in tokens)
    for part in ("attention", "projection", "ffn"):
        share = 100.0 * sum(int(t[f"{part}_ns"]) for t in tokens) / total if total else None
        values.append(SummaryValue(f"{part}_share", share, "%", "float", f"{part} time / token time"))
    speculated = sum(len(t["speculated"]) for t in tokens)
    accepted = sum(len(t["accepted"]) for t in tokens)
    rejected = sum(len(t["rejected"]) for t in tokens)
    values += [
        SummaryValue("speculation_acceptance", 100.0 * accepted / speculated if speculated else None, "%", "float",
                     "speculated layer transitions whose attention was kept"),
        SummaryValue("reexecutions", rejected, "", "int", "speculative attentions re-executed on the exact input"),
        SummaryValue("replacements", len(doc.get("replacements") or []), "", "int", "placement re-runs (memory)"),
        SummaryValue("retries", len(doc.get("retries") or []), "", "int", "RPC retries after a stall"),
        SummaryValue("bytes_total", sum(bytes_per_token), "B", "int", "bytes moved between processes"),
        SummaryValue("bytes_per_token", statistics.fmean(bytes_per_token) if tokens else None, "B", "float",
                     "mean bytes moved per token"),
    ]  # fmt: skip
    placement = doc.get("placement")
    if isinstance(placement, Mapping) and isinstance(placement.get("planning_ns"), int):
        values.append(
            SummaryValue("placement_planning", placement["planning_ns"], "ns", "int", "initial placement")
        )
    oom = doc.get("oom")
    if isinstance(oom, Mapping):
        values += [
            SummaryValue(
                "oom_token", int(oom["token"]), "", "int", "token at which a worker ran out of memory"
            ),
            SummaryValue("oom_worker", str(oom["worker"]), "", "str", "the worker that ran out of memory"),
        ]
    start, end = int(doc["start_ns"]), int(doc["end_ns"])
    hosts = [
        controller,
        *(str(w["host"]) for w in doc.get("workers") or [] if isinstance(w.get("host"), str)),
    ]
    values += energy_summary(run, hosts, start, end, int(doc["tokens_generated"]), "the generation")
    return Results(tables=tuple(tables), summary=tuple(values))


class HeadSplitRuntime(RuntimeBase):
    """Attention heads placed across workers over torch RPC, with cross-layer speculation."""

    name = "headsplit"
    version = __version__
    title = "HeadSplit: attention heads across workers over torch RPC, cross-layer speculation"

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
