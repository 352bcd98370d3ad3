"""HeadSplit's launch: one ``headsplit.worker`` per worker device and the ``headsplit.controller``,
their ``headsplit.json`` config and where on the node they find checkpoints, shards and profiles."""

from __future__ import annotations

import functools
import json
import os
import posixpath
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dit.runtimes import (
    LaunchContext,
    LaunchSpec,
    helpers,
)
from dit.runtimes.helpers import memory_limit_bytes
from headsplit import checkpoint as ckpt
from headsplit import profile_costs
from headsplit.config import DEFAULT_TAU
from headsplit.plugin.common import (
    CONFIG_FILE,
    CONTROLLER_TAG,
    DEFAULT_PORT,
    FILES_DIR,
    HELD_OUT,
    PLACEMENT_COSTS_FILE,
    PROFILES_DIR,
    RESULT_FILE,
    SHARDS_DIR,
    SHARDS_JSON,
    WORKER_TAG,
    HeadSplitLaunchError,
)
from headsplit.worker import EXIT_NOTE

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


@functools.lru_cache(maxsize=2)
def model_tokenizer(model: str) -> Any:
    """A trained model's own tokenizer, from its verified packaged file (nothing is downloaded)."""
    try:
        from transformers import AutoTokenizer

        from dit.models.catalogue import entry
        from dit.models.packaged import ensure_packaged
        from dit.models.weights import WeightsError
    except ImportError as exc:
        raise HeadSplitLaunchError(
            f"runtime.model: {model} tokenizes with its own tokenizer, which needs dit[llm] "
            f"(transformers, gguf) on the machine running dit ({exc})"
        ) from None
    try:
        path, _ = ensure_packaged(entry(model))
    except WeightsError as exc:
        raise HeadSplitLaunchError(f"runtime.model: {model}: {exc}") from None
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@functools.lru_cache(maxsize=8)
def model_tokens(model: str, text: str) -> tuple[int, ...]:
    """``text`` in a trained model's own tokens."""
    return tuple(int(i) for i in model_tokenizer(model)(text)["input_ids"])


def checkpoint_problem(block: Mapping[str, Any]) -> str | None:
    """What is wrong with ``runtime.checkpoint`` for the block's model: a trained preset has no seeded
    weights to fall back on, so it needs its checkpoint (found at validate, not 19 s into apply)."""
    name = str(block.get("model", "gpt2-tiny"))
    if name in TRAINED and not isinstance(block.get("checkpoint"), Mapping):
        return (
            f"model {name} runs its trained weights: give the directory "
            f"`python -m dit.models.convert {name} DIR` writes and the pin it prints"
        )
    return None


def prompt_ids(block: Mapping[str, Any]) -> list[int] | None:
    """The prompt in a trained model's own tokens, tokenized here (the nodes' HeadSplit venvs have no
    tokenizer); None for the other presets (byte-level tokens on the controller)."""
    name = str(block.get("model", "gpt2-tiny"))
    if name not in TRAINED:
        return None
    problem = checkpoint_problem(block)
    if problem is not None:
        raise HeadSplitLaunchError(f"runtime.checkpoint: {problem}")
    return list(model_tokens(name, str(block.get("prompt", "")) or "Hello"))


def read_paragraph(block: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(text, problem): the paragraph ``perplexity: true`` scores (surrounding whitespace stripped), the
    held-out one unless ``perplexity_paragraph`` names a file; text None without ``perplexity``. The
    problem, if any, is what is wrong with ``runtime.perplexity_paragraph``."""
    other = block.get("perplexity_paragraph")
    if not block.get("perplexity"):
        return None, None if other is None else "has no effect without runtime.perplexity: true"
    file = HELD_OUT if other is None else Path(str(other))
    try:
        text = file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        return None, f"{file}: {exc.strerror}"
    except UnicodeDecodeError as exc:
        return None, f"{file}: not UTF-8 text ({exc.reason} at byte {exc.start})"
    if len(text) < 2:
        return None, f"{file}: less than 2 characters of text"
    return text, None


def paragraph_text(block: Mapping[str, Any]) -> str | None:
    """:func:`read_paragraph`'s text; its problem raised, naming the field."""
    text, problem = read_paragraph(block)
    if problem is not None:
        raise HeadSplitLaunchError(f"runtime.perplexity_paragraph: {problem}")
    return text


def perplexity_config(block: Mapping[str, Any]) -> dict[str, Any] | None:
    """``perplexity`` of headsplit.json: the paragraph's text and, for a trained model, its ids in the
    model's own tokens (tokenized here, like the prompt); None when the block does not ask for it."""
    text = paragraph_text(block)
    if text is None:
        return None
    name = str(block.get("model", "gpt2-tiny"))
    return {"text": text, "ids": list(model_tokens(name, text)) if name in TRAINED else None}


def profile_on_node(ctx: LaunchContext, host: str, path: str) -> str:
    """Where ``build-speculation-profile`` put the profile on ``host`` (local mode: the path itself)."""
    if ctx.local:
        return os.path.abspath(path)
    return f"{_node_base(ctx, host)}/{PROFILES_DIR}/{posixpath.basename(path)}"


def placement_costs(block: Mapping[str, Any], workers: Sequence[str]) -> dict[str, Any] | None:
    """The document of ``placement-costs.json`` (headsplit.profile_costs) from the profile run
    ``placement_profile`` names, for ``workers`` (devices, rank order); None without one. Read here,
    where dit runs, and shipped to the controller as a file: the path is never template text."""
    path = block.get("placement_profile")
    if not isinstance(path, str):
        return None
    try:
        return profile_costs.costs_document(profile_costs.read_profile(path), workers)
    except profile_costs.ProfileError as exc:
        raise HeadSplitLaunchError(f"runtime.placement_profile: {exc}") from None


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
            # a device's own address (local mode: its loopback address), where its packets must leave
            # from for the link emulator to select them; None: the edge, or a node the kernel tells apart
            "source_address": ctx.source_addresses.get(controller),
            "port": int(block.get("port", DEFAULT_PORT)),
        },
        "workers": [
            {
                "rank": rank,
                "name": f"worker{rank}",
                "host": device,
                "address": ctx.addresses[device],
                "source_address": ctx.source_addresses.get(device),
                "memory_limit_bytes": memory_limit_bytes(ctx.scenario, device),
                # local mode: the controller reads how a lost worker ended (its supervisor's note)
                "exit_note": posixpath.join(
                    ctx.node_roots[device], posixpath.dirname(RESULT_FILE), EXIT_NOTE.format(rank=rank)
                )
                if ctx.local
                else None,
            }
            for rank, device in enumerate(workers, start=1)
        ],
        "strategy": str(block.get("strategy", "greedy")),
        "control": str(block.get("control", "dataflow")),
        "speculation": bool(block.get("speculation", False)),
        "tau": float(block.get("tau", DEFAULT_TAU)),
        "speculation_profile": profile_on_node(ctx, host, str(profile)) if isinstance(profile, str) else None,
        "tokens": int(block.get("tokens", 16)),
        "prompt": str(block.get("prompt", "")),
        "prompt_ids": prompt_ids(block),
        "perplexity": perplexity_config(block),
        # the controller's own file (launch_specs ships it beside this one); None: the micro-benchmark
        "placement_profile": PLACEMENT_COSTS_FILE
        if host == controller and isinstance(block.get("placement_profile"), str)
        else None,
        "memory_threshold": float(block.get("memory_threshold", 0.85)),
        "replacement": bool(block.get("replacement", True)),
        "memory_pressure": memory_pressure(block),
        "rpc_timeout_s": float(block.get("rpc_timeout_s", 30)),
        "rpc_retries": int(block.get("rpc_retries", 3)),
        "threads": int(block.get("threads", 1)),
        "result": RESULT_FILE,
    }


def memory_pressure(block: Mapping[str, Any]) -> dict[str, int] | None:
    """``memory_pressure`` as the controller reads it (checked by the schema and check_block)."""
    value = block.get("memory_pressure")
    if not isinstance(value, Mapping):
        return None
    return {"replace_at": int(value["replace_at"]), "full_at": int(value["full_at"])}


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
    files = {CONFIG_FILE: json.dumps(run_config(ctx, controller), indent=2)}
    costs = placement_costs(ctx.block, workers)
    if costs is not None:
        files[PLACEMENT_COSTS_FILE] = json.dumps(costs, indent=1)
    specs.append(
        LaunchSpec(
            host=controller,
            name=CONTROLLER_TAG,
            argv=(_runtime_python(ctx, controller), "-m", "headsplit.controller", "--config", CONFIG_FILE),
            files=files,
            result_files=(RESULT_FILE,),
        )
    )
    return specs
