"""llamacpp-rpc's pure parts: the bind guard, argv builders, tensor split, the launch it describes, the
block in dit's schema, the build action's plan, and the results parser on llama.cpp's output format."""

from __future__ import annotations

import copy
import csv
import json
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from dit.runtime_api import registry  # noqa: E402
from dit.runtimes import LaunchContext  # noqa: E402
from dit.scenario import resolve, validate  # noqa: E402
from dit_llamacpp import build, dit_runtime, launch, node, results, source  # noqa: E402

WILDCARD = "0.0.0.0"  # noqa: S104 - the address the guard must refuse
IFACES = {"lo": ["127.0.0.1", "::1"], "eth0": ["192.168.1.20"], "wlan0": ["10.0.0.11"]}


# -- the bind guard -------------------------------------------------------------------------------


def test_rpc_server_binds_the_inference_address_on_its_interface() -> None:
    assert (
        launch.check_bind("10.0.0.11", inference_address="10.0.0.11", local=False, interfaces=IFACES)
        == "wlan0"
    )


@pytest.mark.parametrize(
    ("address", "local", "reason"),
    [
        ("192.168.1.20", False, "is not this node's inference address 10.0.0.11"),  # the management network
        (WILDCARD, False, "wildcard"),
        ("::", True, "wildcard"),
        ("127.0.0.1", False, "loopback is allowed only in local mode"),
        ("10.0.0.11", True, "local mode binds rpc-server to loopback only"),
        ("rack-node", False, "is not an IP address"),
    ],
)
def test_rpc_server_is_refused_outside_the_rack(address: str, local: bool, reason: str) -> None:
    with pytest.raises(launch.BindRefused, match=reason):
        launch.check_bind(address, inference_address="10.0.0.11", local=local, interfaces=IFACES)


def test_an_inference_address_the_node_does_not_have_is_refused() -> None:
    with pytest.raises(launch.BindRefused, match="not an address of any interface"):
        launch.check_bind("10.0.0.99", inference_address="10.0.0.99", local=False, interfaces=IFACES)


def test_loopback_is_allowed_in_local_mode() -> None:
    assert launch.check_bind("127.0.0.1", inference_address="127.0.0.1", local=True, interfaces={}) == "lo"


def test_the_worker_program_exits_2_without_starting_rpc_server(tmp_path: Path, capsys: Any) -> None:
    marker = tmp_path / "started"
    binary = tmp_path / "fake-rpc-server"
    binary.write_text(f"#!/bin/sh\ntouch {marker}\n")
    binary.chmod(0o755)
    code = node.main(["worker", "--binary", str(binary), "--bind", WILDCARD, "--inference-address", WILDCARD,
                      "--port", "50999", "--ready", str(tmp_path / "r"), "--samples", str(tmp_path / "s")])  # fmt: skip
    assert code == 2
    assert "refused" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "r").exists()


# -- argv builders --------------------------------------------------------------------------------


def test_rpc_server_argv() -> None:
    assert launch.rpc_server_argv("/b/ggml-rpc-server", "10.0.0.11", 50052, 2) == [
        "/b/ggml-rpc-server", "-H", "10.0.0.11", "-p", "50052", "-t", "2"]  # fmt: skip
    with pytest.raises(launch.LaunchArgError, match="port: 70000"):
        launch.rpc_server_argv("x", "10.0.0.1", 70000, 1)


def test_controller_argv_offloads_every_layer_to_the_workers_greedily() -> None:
    argv = launch.controller_argv(
        "/b/llama-completion", model="/m/llama-tiny-F32.gguf", servers=["10.0.0.11:50052", "[fd00::2]:50053"],
        tensor_split=[1.0, 2.5], tokens=8, prompt="Hi there", threads=1, seed=7, ctx_size=128,
    )  # fmt: skip
    assert argv == [
        "/b/llama-completion", "-m", "/m/llama-tiny-F32.gguf", "--rpc", "10.0.0.11:50052,[fd00::2]:50053",
        "-ngl", "999", "--tensor-split", "1,2.5", "-n", "8", "-p", "Hi there", "-no-cnv", "--temp", "0",
        "--seed", "7", "-t", "1", "-c", "128", "--no-warmup", "--ignore-eos", "-fit", "off",
    ]  # fmt: skip
    with pytest.raises(launch.LaunchArgError, match="tensor_split: 1 shares for 2 workers"):
        launch.controller_argv("b", model="m", servers=["a:1", "b:2"], tensor_split=[1], tokens=1, prompt="p",
                               threads=1, seed=0, ctx_size=16)  # fmt: skip
    assert launch.endpoint("fd00::2", 1) == "[fd00::2]:1"


def test_tensor_split_follows_the_scenario_else_memory_else_even() -> None:
    assert launch.tensor_split(["a", "b"], [3, 1], {}) == [3.0, 1.0]
    assert launch.tensor_split(["a", "b"], None, {"a": 512, "b": 1024}) == [1.0, 2.0]
    assert launch.tensor_split(["a", "b"], None, {"a": 512}) == [1.0, 1.0]
    with pytest.raises(launch.LaunchArgError, match=r"runtime.tensor_split: 1 shares for 2 workers \(a, b\)"):
        launch.tensor_split(["a", "b"], [1], {})


def test_cmake_argv_is_release_rpc_and_never_native_or_networked(tmp_path: Path) -> None:
    argv = build.configure_argv("cmake", tmp_path / "src", tmp_path / "b")
    for flag in (
        "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_RPC=ON",
        "-DGGML_NATIVE=OFF",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
    ):
        assert flag in argv  # fmt: skip
    assert build.build_argv("cmake", tmp_path / "b", 2)[-5:] == [
        "--target", "ggml-rpc-server", "llama-completion", "llama-bench", "llama-quantize"]  # fmt: skip


# -- the runtime in dit -----------------------------------------------------------------------------

HOSTS = ("edgeserver", "device1", "device2", "device3")
BASE: dict[str, Any] = {
    "name": "lc",
    "model": {"name": "fake", "params": {"profile": "tiny"}},
    "devices": ["device1", "device2", "device3"],
    "inference": {"enabled": False},
}


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(
        registry,
        "BUILTIN",
        {**registry.BUILTIN, "llamacpp-rpc": "dit_llamacpp.dit_runtime:LlamaCppRpcRuntime"},
    )
    registry.reset()
    yield registry.get("llamacpp-rpc")
    monkeypatch.undo()
    registry.reset()


def _doc(**overrides: Any) -> dict[str, Any]:
    out = copy.deepcopy(BASE)
    out.update(overrides)
    return out


def _context(block: dict[str, Any], **overrides: Any) -> LaunchContext:
    scenario = resolve(_doc(runtime=block, hardware={"device2": {"memory_limit_mb": 1024},
                                                     "device1": {"memory_limit_mb": 512}}))  # fmt: skip
    values: dict[str, Any] = {
        "run_id": "r1", "block": scenario["runtime"], "scenario": scenario, "edge_host": "edgeserver",
        "devices": ("device1", "device2", "device3"),
        "addresses": {"edgeserver": "10.0.0.1", "device1": "10.0.0.11", "device2": "10.0.0.12", "device3": "10.0.0.13"},
        "node_roots": {h: "/var/lib/dit/r1" for h in HOSTS}, "pythons": dict.fromkeys(HOSTS, "/usr/bin/python3"),
        "local": False, "model": {}, "edge_port": None,
    }  # fmt: skip
    values.update(overrides)
    return LaunchContext(**values)


def test_validate_refuses_a_worker_that_is_not_a_device(runtime: Any) -> None:
    bad = _doc(runtime={"name": "llamacpp-rpc", "workers": ["device1", "device9"]})
    assert [str(e) for e in validate(bad)] == [
        "runtime.workers[1]: 'device9' is not a device of the scenario (devices: device1, device2, device3)"
    ]
    # without workers every device but the controller's node works: a device may be the controller
    assert validate(_doc(runtime={"name": "llamacpp-rpc", "controller": "device3"})) == []


def test_the_block_is_validated_with_the_field_named(runtime: Any) -> None:
    assert validate(_doc(runtime={"name": "llamacpp-rpc", "quant": "Q8_0"})) == []
    errors = [str(e) for e in validate(_doc(runtime={"name": "llamacpp-rpc", "quant": "Q5"}))]
    assert any("runtime.quant" in e and "Q5" in e for e in errors), errors


def test_smollm2_takes_only_its_own_weight_types_the_field_named(runtime: Any) -> None:
    for quant in ("F32", "Q8_0", "Q4_1"):
        assert validate(_doc(runtime={"name": "llamacpp-rpc", "model": "smollm2-135m", "quant": quant})) == []
    errors = [
        str(e)
        for e in validate(_doc(runtime={"name": "llamacpp-rpc", "model": "smollm2-135m", "quant": "F16"}))
    ]
    assert errors == [
        "runtime.quant: 'F16' is not one of the weight types made for model smollm2-135m: F32, Q8_0, Q4_1"
    ]
    errors = [str(e) for e in validate(_doc(runtime={"name": "llamacpp-rpc", "quant": "Q4_1"}))]  # llama-tiny
    assert errors == ["runtime.quant: 'Q4_1' is not one of the weight types made for model llama-tiny: "
                      "F32, F16, Q8_0, Q4_0"]  # fmt: skip
    errors = [str(e) for e in validate(_doc(runtime={"name": "llamacpp-rpc", "model": "smollm2"}))]
    assert any(e.startswith("runtime.model") and "smollm2" in e for e in errors), errors
    # a file the block names is the user's: its quant is a label
    assert validate(_doc(runtime={"name": "llamacpp-rpc", "quant": "Q4_1", "gguf": "/m/x.gguf"})) == []


def test_equivalence_needs_the_token_ids(runtime: Any) -> None:
    errors = [str(e) for e in validate(_doc(runtime={"name": "llamacpp-rpc", "equivalence": True}))]
    assert errors == ["runtime.equivalence: compares the recorded token ids: it needs token_ids: true"]
    assert validate(_doc(runtime={"name": "llamacpp-rpc", "equivalence": True, "token_ids": True})) == []


def test_the_controller_checks_the_catalogued_hash_unless_the_block_gives_one(runtime: Any) -> None:
    from dit_llamacpp import models

    def sha(block: dict[str, Any]) -> str:
        *_, ctrl = runtime.launch(_context({"name": "llamacpp-rpc", "workers": ["device1"], **block}))
        assert ctrl.argv.count("--sha256") == 1
        return str(ctrl.argv[ctrl.argv.index("--sha256") + 1])

    wheel = models.expected("smollm2-135m", "Q4_1")
    assert wheel is not None and sha({"model": "smollm2-135m", "quant": "Q4_1"}) == wheel["sha256"]
    made = models.expected("smollm2-135m", "F32")
    assert made is not None and sha({"model": "smollm2-135m"}) == made["sha256"] != wheel["sha256"]
    assert sha({"model": "smollm2-135m", "sha256": "ab" * 32}) == "ab" * 32
    assert sha({"gguf": "/m/x.gguf"}) == ""  # the user's file: checked only against the block's sha256
    *_, ctrl = runtime.launch(_context({"name": "llamacpp-rpc", "workers": ["device1"], "model": "smollm2-135m",
                                        "quant": "Q8_0"}))  # fmt: skip
    completion = list(ctrl.argv[ctrl.argv.index("--") + 1 :])
    assert completion[completion.index("-m") + 1] == "/var/cache/dit/gguf/smollm2-135m-Q8_0.gguf"


def test_launch_describes_tagged_workers_then_the_controller(runtime: Any) -> None:
    specs = runtime.launch(_context({"name": "llamacpp-rpc", "workers": ["device2", "device1"], "tokens": 8}))
    w1, w2, ctrl = specs
    assert (w1.host, w1.name, w1.main, w1.ready_file) == (
        "device2",
        "llama-worker1",
        False,
        "llamacpp-worker1.ready",
    )
    assert w1.argv[:3] == ("/usr/bin/python3", "llamacpp/node.py", "worker")
    assert w1.argv[w1.argv.index("--bind") + 1] == "10.0.0.12" and "--local" not in w1.argv
    assert w2.argv[w2.argv.index("--port") + 1] == "50053"
    assert set(w1.files) == {"llamacpp/node.py", "llamacpp/launch.py", "llamacpp/sockdiag.py"}
    assert (ctrl.host, ctrl.name, ctrl.main, ctrl.result_files) == (
        "edgeserver", "llama-controller", True, ("results/llamacpp.json",))  # fmt: skip
    completion = list(ctrl.argv[ctrl.argv.index("--") + 1 :])
    assert completion[completion.index("--rpc") + 1] == "10.0.0.12:50052,10.0.0.11:50053"
    assert completion[completion.index("--tensor-split") + 1] == "2,1"  # device2 has twice device1's memory
    assert completion[completion.index("-m") + 1] == "/var/cache/dit/gguf/llama-tiny-F32.gguf"


def test_launch_in_local_mode_passes_local_and_refuses_a_bad_worker(runtime: Any) -> None:
    loop = {h: "127.0.0.1" for h in HOSTS}
    specs = runtime.launch(
        _context({"name": "llamacpp-rpc", "workers": ["device1"]}, local=True, addresses=loop)
    )
    assert "--local" in specs[0].argv
    assert specs[0].argv[specs[0].argv.index("--bind") + 1] == "127.0.0.1"  # no address of its own given
    with pytest.raises(dit_runtime.LlamaCppLaunchError, match=r"runtime.workers\[0\]: 'device9'"):
        runtime.launch(_context({"name": "llamacpp-rpc", "workers": ["device9"]}))


def test_local_mode_binds_each_rpc_server_to_its_device_s_own_address(runtime: Any) -> None:
    """Local mode: the link emulator selects a device's packets by its loopback address; rpc-server
    opens no connection itself, so listening there puts everything it sends on that address."""
    loop = {h: "127.0.0.1" for h in HOSTS}
    sources = {"device1": "127.40.7.2", "device2": "127.40.7.3", "device3": "127.40.7.4"}
    w1, w2, ctrl = runtime.launch(_context({"name": "llamacpp-rpc", "workers": ["device2", "device1"]},
                                           local=True, addresses=loop, source_addresses=sources))  # fmt: skip
    assert runtime.sends_from_source_address is True
    for spec, own in ((w1, "127.40.7.3"), (w2, "127.40.7.2")):
        assert spec.argv[spec.argv.index("--bind") + 1] == own
        assert spec.argv[spec.argv.index("--inference-address") + 1] == "127.0.0.1"
        assert "--local" in spec.argv
        assert launch.check_bind(own, inference_address="127.0.0.1", local=True, interfaces={}) == "lo"
    completion = list(ctrl.argv[ctrl.argv.index("--") + 1 :])
    assert completion[completion.index("--rpc") + 1] == "127.40.7.3:50052,127.40.7.2:50053"
    # on the rack the inference address, whatever the inventory's source address
    (w1, *_) = runtime.launch(
        _context({"name": "llamacpp-rpc", "workers": ["device2"]}, source_addresses=sources)
    )
    assert w1.argv[w1.argv.index("--bind") + 1] == "10.0.0.12"


def test_token_ids_add_the_session_file_only_when_asked(runtime: Any) -> None:
    *_, plain = runtime.launch(_context({"name": "llamacpp-rpc", "workers": ["device1"], "tokens": 8}))
    assert "--prompt-cache" not in plain.argv and "--session" not in plain.argv
    *_, ctrl = runtime.launch(
        _context({"name": "llamacpp-rpc", "workers": ["device1"], "tokens": 8, "token_ids": True})
    )
    before = list(ctrl.argv[: ctrl.argv.index("--")])
    completion = list(ctrl.argv[ctrl.argv.index("--") + 1 :])
    assert before[before.index("--session") + 1] == "llamacpp/session.bin"
    assert before[before.index("--tokens") + 1] == "8"
    assert completion[-3:] == ["--prompt-cache", "llamacpp/session.bin", "--prompt-cache-all"]


def test_the_controller_reads_the_ids_from_the_session_file_and_removes_it(tmp_path: Path) -> None:
    session = tmp_path / "session.bin"
    session.write_bytes(struct.pack("<IIIiiiii", 0x6767736E, 10, 5, 1, 345, 7, 8, 9) + b"kv cache")
    assert node.token_ids(session, 2) == {"prompt_ids": [1, 345, 7], "generated_ids": [8, 9]}
    assert not session.exists()
    assert "No such file" in node.token_ids(session, 2)["token_ids_error"]
    session.write_bytes(struct.pack("<IIIi", 0x6767736E, 10, 1, 1))
    assert "1 tokens, expected a prompt and 2 generated" in node.token_ids(session, 2)["token_ids_error"]
    session.write_bytes(struct.pack("<III", 0x12345678, 10, 0))
    assert "is not a llama.cpp session" in node.token_ids(session, 2)["token_ids_error"]


def test_the_build_action_fetches_from_the_mirror_with_the_pinned_hash(runtime: Any) -> None:
    (action,) = runtime.actions()
    plan = action.plan({"cache": "/var/cache/dit/llamacpp", "jobs": 2})
    tasks = plan.plays[0]["tasks"]
    fetch = next(t for t in tasks if "ansible.builtin.get_url" in t)["ansible.builtin.get_url"]
    assert fetch["checksum"] == f"sha256:{build.SDIST_SHA256}"
    assert fetch["url"].endswith("/sdists/llama_cpp_python-0.3.36.tar.gz")
    command = tasks[-1]["ansible.builtin.command"]
    # the cache (an input) travels as a variable: data, never pasted into the plays' template text
    assert command["creates"] == f"{{{{ llamacpp_cache }}}}/{build.SDIST_SHA256[:12]}/build.json"
    assert plan.extravars["llamacpp_cache"] == "/var/cache/dit/llamacpp"
    # the converter's source is unpacked (hash-checked) by the same action: no manual step
    unpack = next(t for t in tasks if t["name"].startswith("Unpack the sdist's source"))[
        "ansible.builtin.command"
    ]
    assert unpack["argv"][-2:] == ["--dest", "{{ llamacpp_source_dir }}"]
    assert plan.extravars["llamacpp_source_dir"] == str(source.DEFAULT_DEST)
    assert command["argv"][-2:] == ["--jobs", "2"]
    mirror = action.plan({"mirror_url": "http://mirror.example/x"})
    fetch = next(t for t in mirror.plays[0]["tasks"] if "ansible.builtin.get_url" in t)[
        "ansible.builtin.get_url"
    ]
    assert fetch["url"] == "{{ llamacpp_mirror_url }}/sdists/llama_cpp_python-0.3.36.tar.gz"
    assert mirror.extravars["llamacpp_mirror_url"] == "http://mirror.example/x"


# -- results ---------------------------------------------------------------------------------------

# The lines formatted as src/llama-context.cpp formats them (the same printf formats).
CTX = "llama_perf_context_print: "
STDERR = "".join(
    [
        CTX + f"       load time = {120.0:10.2f} ms\n",
        CTX
        + "prompt eval time = %10.2f ms / %5d tokens (%8.2f ms per token, %8.2f tokens per second)\n"  # noqa: UP031 - the C printf format itself
        % (10.0, 9, 1.11, 900.0),
        CTX
        + "       eval time = %10.2f ms / %5d runs   (%8.2f ms per token, %8.2f tokens per second)\n"  # noqa: UP031 - the C printf format itself
        % (70.0, 7, 10.0, 100.0),
        CTX + "      total time = %10.2f ms / %5d tokens\n" % (200.0, 16),  # noqa: UP031 - the C printf format itself
    ]
)


def test_timings_are_read_from_llama_cpp_performance_lines() -> None:
    t = results.parse_timings(STDERR)
    assert (t.prompt_tokens, t.prompt_tokens_per_s, t.eval_runs, t.eval_ms_per_token) == (9, 900.0, 7, 10.0)
    assert t.tokens_generated == 8 and t.load_ms == 120.0
    with pytest.raises(results.ParseError, match="no 'prompt eval time' line"):
        results.parse_timings("main: error: failed to load model")


def test_worker_traffic_splits_the_weights_upload_from_inference() -> None:
    rows = [
        {"t_ns": 0, "rx": 0, "tx": 0, "tcp_acked": 0, "tcp_received": 0, "tcp_sockets": 0, "hwm": 10},
        {"t_ns": 100, "rx": 5000, "tx": 100, "tcp_acked": 100, "tcp_received": 5000, "tcp_sockets": 1, "hwm": 900},
        {"t_ns": 200, "rx": 5600, "tx": 400, "tcp_acked": 400, "tcp_received": 5600, "tcp_sockets": 1, "hwm": 950},
        {"t_ns": 300, "rx": 5600, "tx": 400, "tcp_acked": 400, "tcp_received": 5600, "tcp_sockets": 2, "hwm": 950},
    ]  # fmt: skip
    text = "\n".join(json.dumps(r) for r in rows) + '\n{"t_ns": 4'  # a torn last line from the kill
    t = results.worker_traffic("worker1", "d1", results.read_samples(text, "s"), 50, 250, 90)
    # start 50 -> the sample at 0; end 250 -> the one at 300; first output 90 -> the one at 100 (at or after)
    assert (t.rpc_bytes, t.rpc_bytes_load, t.if_rx, t.if_tx, t.rss_peak) == (6000, 5100, 5600, 400, 950)
    assert t.split_ns == 100
    assert (t.rpc_bytes_sent, t.rpc_bytes_received, t.rpc_connections, t.rpc_bytes_missing) == (
        400,
        5600,
        2,
        "",
    )


def test_an_upload_that_ends_as_the_prompt_is_printed_is_not_counted_as_inference() -> None:
    """On the emulated rack the output layer's worker received the last 43 MB of its weights in the 0.1 s
    before llama.cpp printed the prompt: split at the sample before the first output, they counted as
    inference (2.99 MB per token against 279 kB at +15 ms). Split at the first sample at or after it,
    what that sample holds of the generation leaves its tokens out of the division."""
    mb = 1_000_000
    rows = [
        {"t_ns": 0, "tcp_acked": 0, "tcp_received": 0, "tcp_sockets": 1},
        {"t_ns": 1_472, "tcp_acked": 0, "tcp_received": 155 * mb, "tcp_sockets": 1},  # upload going on
        {"t_ns": 1_587, "tcp_acked": 1_000, "tcp_received": 198 * mb, "tcp_sockets": 1},  # upload done
        {"t_ns": 2_600, "tcp_acked": 1_000 + 3_000_000, "tcp_received": 198 * mb + 160_000, "tcp_sockets": 1},
    ]
    t = results.worker_traffic("worker4", "d4", rows, 0, 2_600, 1_585)  # the prompt printed at 1585
    assert t.rpc_bytes_load == 198 * mb + 1_000 and t.split_ns == 1_587
    # 16 tokens, printed from 1_600 on every 60: all 16 after the split sample
    tokens = [1_600 + 60 * i for i in range(16)]
    assert results.tokens_after(1_587, tokens, 16) == 16 and results.tokens_after(1_700, tokens, 16) == 14
    assert results.bytes_per_token([t], tokens, 16) == pytest.approx(3_160_000 / 16)
    # a generation shorter than the sampling interval (all 16 tokens before the split sample at 2 600):
    # counted from the sample before the first output (1 587) over every token, not left out
    late = results.worker_traffic("worker4", "d4", rows, 0, 2_600, 2_000)
    assert late.split_ns == 2_600 and results.tokens_after(2_600, tokens, 16) == 0
    assert results.bytes_per_token([late], tokens, 16) == pytest.approx(3_160_000 / 16)


def test_worker_traffic_without_tcp_counters_is_absent_with_the_reason_never_zero() -> None:
    # a run recorded before the TCP counters (rchar/wchar only), and a node without sock_diag
    old = [
        {"t_ns": 0, "rx": 0, "tx": 0, "rchar": 0, "wchar": 0},
        {"t_ns": 9, "rx": 5, "tx": 5, "rchar": 9, "wchar": 1},
    ]
    t = results.worker_traffic("worker1", "d1", old, 1, 8, 5)
    assert (t.rpc_bytes, t.rpc_bytes_load, t.rpc_bytes_sent, t.rpc_connections) == (None, None, None, None)
    assert t.rpc_bytes_missing.startswith("the samples carry no TCP counters") and (t.if_rx, t.if_tx) == (
        5,
        5,
    )
    error = "sock_diag: no NETLINK_SOCK_DIAG socket: [Errno 93] Protocol not supported"
    rows = [{"t_ns": 0, "tcp_error": error}, {"t_ns": 9, "tcp_error": error}]
    t = results.worker_traffic("worker2", "d2", rows, 1, 8, 5)
    assert t.rpc_bytes is None and t.rpc_bytes_missing == error
    assert results.bytes_missing([t]) == f"worker2: {error}"


def _run(tmp_path: Path, stderr: str) -> Any:
    from dit.analysis.run import LoadedRun

    run = tmp_path / "run"
    (run / "scenario.yaml").parent.mkdir(parents=True)
    (run / "scenario.yaml").write_text("name: lc\ndevices: [device1, device2]\n", encoding="utf-8")
    start, end = 1_000_000, 9_000_000
    controller = {
        "argv": ["llama-completion", "--rpc", "127.0.0.1:50052,127.0.0.1:50053", "-n", "8"],
        "returncode": 0, "start_ns": start, "end_ns": end, "stdout": "Hi there and", "stderr": stderr,
        "stdout_chunks": [[3_000_000, 8], [4_000_000, 4], [5_000_000, 4], [7_000_000, 4]],
    }  # fmt: skip
    (run / "raw" / "edge").mkdir(parents=True)
    (run / "raw" / "edge" / "edge_llamacpp.json").write_text(json.dumps(controller), encoding="utf-8")
    for rank, device in ((1, "device1"), (2, "device2")):
        samples = [
            {"t_ns": 0, "rx": 0, "tx": 0, "tcp_received": 100, "tcp_acked": 0, "tcp_sockets": 1, "rss": 1, "hwm": 1},
            {"t_ns": 2_900_000, "rx": 9, "tx": 9, "tcp_received": 100 + 4000 * rank, "tcp_acked": 50,
             "tcp_sockets": 1, "rss": 7, "hwm": 7 * rank},
            # the first sample after the first output (3 ms): the upload was over by then
            {"t_ns": 3_100_000, "rx": 9, "tx": 9, "tcp_received": 100 + 4000 * rank, "tcp_acked": 50,
             "tcp_sockets": 1, "rss": 7, "hwm": 7 * rank},
            {"t_ns": 9_500_000, "rx": 99, "tx": 99, "tcp_received": 100 + 4000 * rank + 800, "tcp_acked": 250,
             "tcp_sockets": 2, "hwm": 7 * rank},
        ]  # fmt: skip
        (run / "raw" / device).mkdir(parents=True)
        (run / "raw" / device / f"{device}_llamacpp-worker{rank}.jsonl").write_text(
            "".join(json.dumps(s) + "\n" for s in samples), encoding="utf-8"
        )
    return LoadedRun(run)


def test_parse_gives_headsplit_s_columns_from_a_recorded_run(tmp_path: Path) -> None:
    got = dit_runtime.LlamaCppRpcRuntime().parse_results(_run(tmp_path, STDERR))
    assert [p.name for p in got.tables] == ["llamacpp_workers.csv", "llamacpp_chunks.csv"]
    v = {s.name: (s.value, s.unit) for s in got.summary}
    assert v["tokens_generated"] == (8, "")
    # 8 tokens over the 10 ms prompt eval + 70 ms eval; 9 prompt tokens in 10 ms; 7 runs in 70 ms
    assert v["tokens_per_s"] == (pytest.approx(8 / 0.080), "1/s")
    assert v["prompt_tokens_per_s"] == (pytest.approx(900.0), "1/s")
    assert v["generation_tokens_per_s"] == (pytest.approx(7 / 0.070), "1/s")
    assert v["token_latency_mean"] == (10_000_000, "ns") and v["prefill_latency"] == (10_000_000, "ns")
    # worker N (TCP counters): load = 4000 N received + 50 sent, then 800 received + 200 sent in generation
    assert v["bytes_total"] == (4000 + 4000 * 2 + 2 * (50 + 1000), "B")
    assert v["bytes_load"] == (4000 + 4000 * 2 + 2 * 50, "B")
    assert v["bytes_per_token"] == (2 * 1000 / 8, "B")
    assert v["worker_memory_peak"] == (14, "B")
    assert v["token_latency_p50"] == (1_000_000, "ns") and v["token_latency_p99"] == (2_000_000, "ns")
    assert "energy" not in v  # no power trace in this run
    with got.tables[0].open(encoding="utf-8") as handle:
        w2 = list(csv.DictReader(handle))[1]
    assert (w2["rpc_bytes"], w2["rpc_bytes_load"], w2["rpc_bytes_sent"], w2["rpc_bytes_received"]) == (
        "9050",
        "8050",
        "250",
        "8800",
    )
    assert (w2["rpc_connections"], w2["if_rx_bytes"], w2["rpc_bytes_missing"]) == ("1", "99", "")


def test_parse_says_why_the_bytes_are_not_measured(tmp_path: Path) -> None:
    run = _run(tmp_path, STDERR)
    error = "sock_diag: the kernel refused the dump: No such file or directory"
    samples = run.path / "raw" / "device2" / "device2_llamacpp-worker2.jsonl"
    samples.write_text(
        "".join(json.dumps({"t_ns": t, "rx": t, "tx": t, "tcp_error": error}) + "\n" for t in (0, 9_500_000)),
        encoding="utf-8",
    )
    got = dit_runtime.LlamaCppRpcRuntime().parse_results(run)
    by_name = {s.name: s for s in got.summary}
    for name in ("bytes_total", "bytes_load", "bytes_per_token"):
        assert by_name[name].value is None  # not 0, not worker1's alone
        assert by_name[name].description.endswith(f"(not measured: worker2: {error})")
    assert by_name["tokens_per_s"].value is not None
    with got.tables[0].open(encoding="utf-8") as handle:
        w1, w2 = csv.DictReader(handle)
    assert w1["rpc_bytes"] == "5050" and (w2["rpc_bytes"], w2["rpc_bytes_missing"]) == ("", error)
    assert w1["rpc_bytes_lower_bound"] == ""
    assert w2["if_rx_bytes"] == "9500000"  # the interface columns as before


def test_parse_says_when_the_bytes_are_a_lower_bound(tmp_path: Path) -> None:
    run = _run(tmp_path, STDERR)
    samples = run.path / "raw" / "device1" / "device1_llamacpp-worker1.jsonl"
    note = "sock_diag: cannot join the destroy notices: [Errno 1] Operation not permitted"
    rows = [{**json.loads(line), "tcp_final_error": note} for line in samples.read_text().splitlines()]
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    by_name = {s.name: s for s in dit_runtime.LlamaCppRpcRuntime().parse_results(run).summary}
    assert by_name["bytes_total"].value == 4000 + 4000 * 2 + 2 * (50 + 1000)  # measured, but
    assert by_name["bytes_total"].description.endswith(f"after its last sample: worker1: {note})")


def _perf(prompt_ms: float, prompt_tokens: int, eval_ms: float, runs: int) -> str:
    """llama.cpp's two performance lines, with the rates it prints (rounded, as it prints them)."""
    eval_rate = f"{runs * 1e3 / eval_ms:8.2f}" if runs else "     inf"
    eval_each = f"{eval_ms / runs:8.2f}" if runs else "     inf"
    return (
        CTX + f"prompt eval time = {prompt_ms:10.2f} ms / {prompt_tokens:5d} tokens "
        f"({prompt_ms / prompt_tokens:8.2f} ms per token, {prompt_tokens * 1e3 / prompt_ms:8.2f} tokens per second)\n"
        + CTX
        + f"       eval time = {eval_ms:10.2f} ms / {runs:5d} runs   "
        f"({eval_each} ms per token, {eval_rate} tokens per second)\n"
    )


def _values(run: Any) -> dict[str, Any]:
    return {s.name: s.value for s in dit_runtime.LlamaCppRpcRuntime().parse_results(run).summary}


def test_tokens_per_s_counts_the_prefill_as_headsplit_s_does(tmp_path: Path) -> None:
    # a 40 ms prefill of 9 prompt tokens, then 7 decode runs in 70 ms: 8 tokens generated
    v = _values(_run(tmp_path, _perf(40.0, 9, 70.0, 7)))
    assert v["tokens_per_s"] == pytest.approx(8 / 0.110)  # not llama.cpp's eval rate, 100/s
    assert v["prompt_tokens_per_s"] == pytest.approx(9 / 0.040)
    assert v["generation_tokens_per_s"] == pytest.approx(7 / 0.070)
    assert v["token_latency_mean"] == 10_000_000 and v["prefill_latency"] == 40_000_000


def test_one_token_has_no_decode_columns(tmp_path: Path) -> None:
    # llama.cpp prints "0 runs (inf ms per token, ...)": no decode to measure, so no decode columns
    v = _values(_run(tmp_path, _perf(40.0, 9, 0.0, 0)))
    assert v["tokens_generated"] == 1 and v["tokens_per_s"] == pytest.approx(1 / 0.040)
    assert v["generation_tokens_per_s"] is None and v["token_latency_mean"] is None


def test_parse_tables_the_token_ids_when_the_run_recorded_them(tmp_path: Path) -> None:
    run = _run(tmp_path, STDERR)
    file = run.path / "raw" / "edge" / "edge_llamacpp.json"
    doc = json.loads(file.read_text(encoding="utf-8"))
    file.write_text(json.dumps({**doc, "prompt_ids": [1, 2], "generated_ids": [5, 6, 7]}), encoding="utf-8")
    got = dit_runtime.LlamaCppRpcRuntime().parse_results(run)
    # llama.cpp's eval counter says 8 (with token_ids it counts the prompt's last token): the ids say 3
    assert {s.name: s.value for s in got.summary}["tokens_generated"] == 3
    assert [p.name for p in got.tables][-1] == "llamacpp_tokens.csv"
    with got.tables[-1].open(encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    assert rows == [["phase", "index", "token_id"], ["prompt", "0", "1"], ["prompt", "1", "2"],
                    ["generated", "0", "5"], ["generated", "1", "6"], ["generated", "2", "7"]]  # fmt: skip


def _with_ids(tmp_path: Path, block: str) -> Any:
    run = _run(tmp_path, STDERR)
    (run.path / "scenario.yaml").write_text(f"name: lc\ndevices: [device1, device2]\nruntime: {block}\n",
                                            encoding="utf-8")  # fmt: skip
    file = run.path / "raw" / "edge" / "edge_llamacpp.json"
    doc = json.loads(file.read_text(encoding="utf-8"))
    file.write_text(
        json.dumps({**doc, "prompt_ids": [1, 2], "generated_ids": [5, 6, 7, 8]}), encoding="utf-8"
    )
    return run


def test_equivalence_puts_the_reference_comparison_in_the_results_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, list[int], list[int]]] = []

    def reference(model: str, prompt: list[int], ids: list[int]) -> dict[str, Any]:
        calls.append((model, list(prompt), list(ids)))
        return {
            "equal": False,
            "hf_ids": [5, 6, 9, 8],
            "llama_ids": ids,
            "first_divergence": 2,
            "agreement": 0.75,
        }

    monkeypatch.setattr(dit_runtime, "run_reference", reference)
    run = _with_ids(
        tmp_path, "{name: llamacpp-rpc, model: smollm2-135m, quant: Q4_1, token_ids: true, equivalence: true}"
    )
    got = dit_runtime.LlamaCppRpcRuntime().parse_results(run)
    v = {s.name: s.value for s in got.summary}
    assert (v["reference_first_difference"], v["reference_agreement"]) == (2, 0.75)
    assert calls == [("smollm2-135m", [1, 2], [5, 6, 7, 8])]
    assert got.tables[-1].name == "llamacpp_equivalence.json"
    saved = json.loads(got.tables[-1].read_text(encoding="utf-8"))
    assert (saved["model"], saved["prompt_ids"], saved["generated_ids"], saved["hf_ids"]) == (
        "smollm2-135m", [1, 2], [5, 6, 7, 8], [5, 6, 9, 8])  # fmt: skip
    dit_runtime.LlamaCppRpcRuntime().parse_results(run)  # aggregated again: the saved comparison is reused
    assert len(calls) == 1


def test_equivalence_says_why_there_is_no_comparison(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dit_runtime, "run_reference", lambda *a: {"error": "No module named 'torch'"})
    run = _with_ids(tmp_path, "{name: llamacpp-rpc, token_ids: true, equivalence: true}")
    got = {s.name: s for s in dit_runtime.LlamaCppRpcRuntime().parse_results(run).summary}
    assert got["reference_agreement"].value is None and got["reference_first_difference"].value is None
    assert "No module named 'torch'" in got["reference_agreement"].description
    # without equivalence nothing is compared
    monkeypatch.setattr(dit_runtime, "run_reference", lambda *a: pytest.fail("compared without equivalence"))
    plain = _with_ids(tmp_path / "plain", "{name: llamacpp-rpc, token_ids: true}")
    assert "reference_agreement" not in {
        s.name for s in dit_runtime.LlamaCppRpcRuntime().parse_results(plain).summary
    }


def test_the_reference_child_s_failure_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dit_runtime.sys, "executable", "/bin/false")
    assert "exited 1" in dit_runtime.run_reference("llama-tiny", [1], [2])["error"]


def test_parse_names_the_file_when_llama_cpp_did_not_finish(tmp_path: Path) -> None:
    with pytest.raises(
        dit_runtime.LlamaCppResultsError, match=r"edge_llamacpp\.json: no 'prompt eval time' line"
    ):
        dit_runtime.LlamaCppRpcRuntime().parse_results(_run(tmp_path, "error: failed to load model\n"))
