"""Pure pieces of the launch: argv builders, the tensor split and the bind-address guard.

Nothing here starts a process or reads the machine: the node programs (:mod:`dit_llamacpp.node`) and
the runtime (:mod:`dit_llamacpp.dit_runtime`) call these with what they found, so every rule is a unit
test away.

Why the guard exists: ``rpc-server`` has **no authentication and no encryption**: anyone who reaches
its port can allocate memory on the worker, write tensors into it and run graphs (llama.cpp prints
"Never expose the RPC server to an open network!"). It may therefore listen only on the node's
inference address inside the rack (the isolated access point's network), never on the wildcard
address and never on the management network. Loopback is allowed only in local mode, where every node
is this machine and nothing else reaches it; in local mode it is also the only address allowed.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Mapping, Sequence

RPC_SERVER = "ggml-rpc-server"  # tools/rpc's CMake target: the rpc-server of llama.cpp's docs
CONTROLLER = "llama-completion"


class BindRefused(ValueError):
    """``rpc-server`` would listen on an address outside the rack's inference network."""


class LaunchArgError(ValueError):
    """An argument of an argv builder is out of range; the message names it."""


class SessionError(ValueError):
    """A llama.cpp session file that is not one this version writes; the message names the file."""


SESSION_MAGIC = 0x6767736E  # 'ggsn'
SESSION_VERSION = 10  # LLAMA_SESSION_VERSION of the pinned llama.cpp


def session_tokens(data: bytes, where: str) -> list[int]:
    """The token ids of a llama.cpp session file (``--prompt-cache FILE --prompt-cache-all``): its header
    is ``u32 magic 'ggsn', u32 version, u32 n, int32 tokens[n]`` -- the prompt as llama.cpp tokenised
    it, then every generated token (the state that follows is not read)."""
    if len(data) < 12:
        raise SessionError(f"{where}: too short for a llama.cpp session file")
    magic, version, n = struct.unpack_from("<III", data, 0)
    if magic != SESSION_MAGIC:
        raise SessionError(f"{where}: magic {magic:#x} is not a llama.cpp session ('ggsn')")
    if version != SESSION_VERSION:
        raise SessionError(f"{where}: session version {version}, expected {SESSION_VERSION}")
    if len(data) < 12 + 4 * n:
        raise SessionError(f"{where}: header says {n} tokens, file is too short")
    return list(struct.unpack_from(f"<{n}i", data, 12))


def session_argv(session: str) -> list[str]:
    """``llama-completion`` arguments that write the session file the token ids are read from.

    llama.cpp saves its whole state there after the prompt and again at the end, reading the KV cache
    back from the rpc-servers: traffic and time that a timing run must not carry.
    """
    return ["--prompt-cache", session, "--prompt-cache-all"]


def check_bind(
    address: str,
    *,
    inference_address: str,
    local: bool,
    interfaces: Mapping[str, Sequence[str]],
) -> str:
    """The interface ``rpc-server`` may bind ``address`` on, or :class:`BindRefused` saying why not.

    ``inference_address`` is the node's address on the inference network (the testbed's
    ``dit_inference_address``); ``interfaces`` maps each interface of the node to its addresses
    (``ip -j addr``). See the module docstring for the rules.
    """
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise BindRefused(
            f"bind address {address!r} is not an IP address (rpc-server has no authentication)"
        ) from None
    if ip.is_unspecified:
        raise BindRefused(
            f"bind address {address}: the wildcard would expose rpc-server (no authentication) on every interface"
        )
    if local:
        if not ip.is_loopback:
            raise BindRefused(f"bind address {address}: local mode binds rpc-server to loopback only")
        return "lo"
    if ip.is_loopback:
        raise BindRefused(f"bind address {address}: loopback is allowed only in local mode")
    if address != inference_address:
        raise BindRefused(
            f"bind address {address} is not this node's inference address {inference_address} "
            "(rpc-server has no authentication: it listens inside the rack only)"
        )
    for name, addrs in interfaces.items():
        if any(_same(address, a) for a in addrs):
            return name
    raise BindRefused(f"bind address {address} is not an address of any interface of this node")


def _same(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b.split("/", 1)[0])
    except ValueError:
        return False


def rpc_server_argv(binary: str, host: str, port: int, threads: int) -> list[str]:
    """``ggml-rpc-server -H host -p port -t threads`` (no ``--cache``: nothing is written on the node)."""
    if not 1 <= port <= 65535:
        raise LaunchArgError(f"port: {port} is not a TCP port")
    if threads < 1:
        raise LaunchArgError(f"threads: {threads} must be at least 1")
    return [binary, "-H", host, "-p", str(port), "-t", str(threads)]


def endpoint(host: str, port: int) -> str:
    """``host:port`` as ``--rpc`` reads it (an IPv6 address in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def controller_argv(
    binary: str,
    *,
    model: str,
    servers: Sequence[str],
    tensor_split: Sequence[float],
    tokens: int,
    prompt: str,
    threads: int,
    seed: int,
    ctx_size: int,
) -> list[str]:
    """``llama-completion`` generating ``tokens`` tokens greedily with every layer on the RPC workers.

    ``-ngl 999`` offloads every layer to the non-CPU devices, which are the RPC servers (in their
    ``--rpc`` order); ``--tensor-split`` gives their shares of the layers. ``--temp 0`` is greedy,
    ``-no-cnv`` a plain completion, ``--no-warmup`` keeps the warm-up pass out of the timings, and
    ``--ignore-eos`` makes the count exact, ``-fit off`` keeps llama.cpp from refitting the split to
    the devices' free memory (the split is the scenario's).
    """
    if not servers:
        raise LaunchArgError("workers: needs at least one rpc-server")
    if len(tensor_split) != len(servers):
        raise LaunchArgError(f"tensor_split: {len(tensor_split)} shares for {len(servers)} workers")
    if any(s < 0 for s in tensor_split) or sum(tensor_split) <= 0:
        raise LaunchArgError(f"tensor_split: {list(tensor_split)} needs non-negative shares, not all 0")
    if tokens < 1:
        raise LaunchArgError(f"tokens: {tokens} must be at least 1")
    if threads < 1:
        raise LaunchArgError(f"threads: {threads} must be at least 1")
    return [
        binary,
        "-m", model,
        "--rpc", ",".join(servers),
        "-ngl", "999",
        "--tensor-split", ",".join(f"{s:g}" for s in tensor_split),
        "-n", str(tokens),
        "-p", prompt,
        "-no-cnv",
        "--temp", "0",
        "--seed", str(seed),
        "-t", str(threads),
        "-c", str(ctx_size),
        "--no-warmup",
        "--ignore-eos",
        "-fit", "off",
    ]  # fmt: skip


def tensor_split(
    workers: Sequence[str], explicit: Sequence[float] | None, memory: Mapping[str, int]
) -> list[float]:
    """The layer shares of the workers: the scenario's ``tensor_split``, else their memory limits.

    With memory limits for only some workers, or none, the split is even (every share 1).
    """
    if explicit is not None:
        if len(explicit) != len(workers):
            raise LaunchArgError(
                f"runtime.tensor_split: {len(explicit)} shares for {len(workers)} workers ({', '.join(workers)})"
            )
        return [float(x) for x in explicit]
    limits = [memory.get(w, 0) for w in workers]
    if all(limit > 0 for limit in limits):
        smallest = min(limits)
        return [round(limit / smallest, 3) for limit in limits]
    return [1.0] * len(workers)
