"""The scenario's ``runtime`` block of HeadSplit as a JSON Schema (merged into dit's by the testbed)."""

from __future__ import annotations

from typing import Any

from dit.runtimes.helpers import EDGE
from headsplit.config import CONTROLS, DEFAULT_TAU, PRESETS
from headsplit.plugin.common import (
    ABSOLUTE_PATH,
    ABSOLUTE_PATH_TEXT,
    DEFAULT_PORT,
    NODE_NAME,
    SHA256,
    SHA256_TEXT,
    STRATEGIES,
)
from headsplit.profile_costs import HEADS_CSV


def block_schema() -> dict[str, Any]:
    """The JSON Schema of the scenario's ``runtime`` block (``name: headsplit`` added by dit).

    ``x-readable`` marks the files on the machine running dit a field names (what is read below it):
    dit refuses one the scenario's author could not read (dit.scenario.author)."""
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
                        "x-readable": ["**"],
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
                        "x-readable": ["**"],
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
            "control": {
                "title": "Control",
                "description": "How a token is driven. `dataflow`: the controller sends one message that "
                "starts the token and receives its last X; every worker pushes what it produces to its "
                "consumers as soon as it exists (the speculation test decided where the FFN runs). "
                "`rpc`: the controller calls every stage of every layer and waits (kept for comparison).",
                "enum": list(CONTROLS),
                "default": "dataflow",
            },
            "placement_profile": {
                "title": "Placement profile",
                "description": "The run directory of a profile run on the machine running dit: a run of the "
                "`layers` runtime with `tokens:` on a decoder model, on this run's worker devices (no other). "
                "The placement then costs each head, projection and FFN at the FLOP/s that run measured for "
                "that kind on the worker's device (`aggregate/heads.csv`, decode tokens) instead of the "
                "start-up micro-benchmark, so a device profiled slower gets less work; a profile of another "
                "model is carried over by FLOPs (docs/headsplit.md). The source, the placement and its "
                "predicted time per token are recorded.",
                "type": "string",
                "minLength": 1,
                "x-readable": [HEADS_CSV],
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
                "default": DEFAULT_TAU,
            },
            "speculation_profile": {
                "title": "Speculation profile",
                "description": "The offline profile (which layer transitions speculate), a path on the machine "
                "running dit as `build-speculation-profile` fetched it; without one every transition "
                "speculates.",
                "type": "string",
                "minLength": 1,
                "x-readable": ["."],
            },
            "repeat": {
                "title": "Repeat",
                "description": "Which timing of this configuration the run is (1, 2, ...; none: 1): a label that "
                "changes nothing in the run, so that a sweep can time the same configuration again, "
                "interleaved with others. `python -m headsplit.compare` sets a repeat beside the layer-wise "
                "run of the same repeat; `dit reproduce ch6` times layer-wise and greedy twice at +0 ms, "
                "the second time in reverse order, so that a drift of the machine's speed hits both alike.",
                "type": "integer",
                "minimum": 1,
                "maximum": 100,
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
            "perplexity": {
                "title": "Perplexity",
                "description": "After the generation, a teacher-forced perplexity pass over a held-out "
                "paragraph through the same engine (placement, workers, speculation at tau): the fidelity "
                "side of tau beside the speed. The paragraph is headsplit's held-out one (not in the "
                "speculation corpus) unless `perplexity_paragraph` names another.",
                "type": "boolean",
                "default": False,
            },
            "perplexity_paragraph": {
                "title": "Perplexity paragraph",
                "description": "A UTF-8 text file on the machine running dit scored instead of the held-out "
                "paragraph (needs `perplexity: true`).",
                "type": "string",
                "minLength": 1,
                "x-readable": ["."],
            },
            "memory_threshold": {
                "title": "Re-placement threshold",
                "description": "Re-run the placement when a worker's memory passes this fraction of its limit.",
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": 1,
                "default": 0.85,
            },
            "replacement": {
                "title": "Re-placement",
                "description": "Re-run the placement when a worker passes `memory_threshold` of its limit, "
                "migrating units and KV slices (the article's); `false`: a static placement, which ends "
                "the run with `oom` when a worker passes its limit.",
                "type": "boolean",
                "default": True,
            },
            "memory_pressure": {
                "title": "Emulated memory pressure",
                "description": "Put one worker under memory pressure on a model whose KV caches grow too "
                "little to fill a board within a short run: after the first placement, the worker whose "
                "memory grows fastest gets a limit (and the run a threshold) derived from that placement, "
                "so that its bytes pass the threshold at generated token `replace_at` and its limit at "
                "`full_at` (the counted bytes of units and KV slices, not a cgroup: no process is "
                "killed). Results: `memory_pressure` (the worker, limit, threshold).",
                "type": "object",
                "additionalProperties": False,
                "required": ["replace_at", "full_at"],
                "properties": {
                    "replace_at": {
                        "description": "The generated token after which the threshold is passed "
                        "(re-placement), before the last token.",
                        "type": "integer",
                        "minimum": 1,
                    },
                    "full_at": {
                        "description": "The generated token after which the limit is passed (a static "
                        "placement runs out of memory there), after `replace_at`.",
                        "type": "integer",
                        "minimum": 2,
                    },
                },
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
                "pattern": ABSOLUTE_PATH,
                "x-pattern-text": ABSOLUTE_PATH_TEXT,
            },
        },
    }
