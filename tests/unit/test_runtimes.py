"""Runtimes as plug-ins: schema merge, path-precise errors, launch specs, results parser, readiness."""

from __future__ import annotations

import copy
import csv
import json
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dit.analysis.run import LoadedRun
from dit.devtools.schemadoc import render_reference
from dit.run.ansible_exec import HostEvent, StageOutcome
from dit.run.launch import LaunchError, check_specs, launch_vars, outcomes, start_margins
from dit.runtime_api import registry
from dit.runtime_api.interface import (
    PORTS_PER_NODE,
    Action,
    ActionPlan,
    Results,
    uses_edge_service,
    write_summary,
)
from dit.runtime_ops import plays as ops
from dit.runtimes import LaunchContext, LaunchOutcome, LaunchSpec, ReadinessPlan, SummaryValue
from dit.runtimes.layers import LayersRuntime
from dit.scenario import ScenarioError, expand, loads, resolve, validate
from dit.scenario.schema import load_schema

BASE: dict[str, Any] = {
    "name": "rt",
    "model": {"name": "fake", "params": {"profile": "tiny"}},
    "devices": ["device1", "device2"],
    "inference": {"enabled": False},
}


def doc(**overrides: Any) -> dict[str, Any]:
    out = copy.deepcopy(BASE)
    out.update(overrides)
    return out


def messages(raw: dict[str, Any]) -> list[str]:
    return [str(e) for e in validate(raw)]


# -- schema -------------------------------------------------------------------------------------


def test_without_a_runtime_block_the_scenario_runs_layers_and_keeps_its_hash() -> None:
    (scenario,) = expand(doc())
    assert scenario.runtime == {"name": "layers"}
    assert "runtime" not in scenario.data  # the resolved document (hence the hash) is as before
    (explicit,) = expand(doc(runtime={"name": "layers"}))
    assert explicit.runtime == {"name": "layers"}


def test_the_installed_runtimes_block_is_merged_with_defaults(echo: Any) -> None:
    assert messages(doc(runtime={"name": "echo", "rounds": 3})) == []
    resolved = resolve(doc(runtime={"name": "echo", "rounds": 3}))
    assert resolved["runtime"] == {
        "name": "echo",
        "rounds": 3,
        "payload_bytes": 1024,
        "interval_ms": 0,
        "placement": "round_robin",
    }


def test_errors_in_a_runtime_block_name_the_path(echo: Any) -> None:
    assert messages(doc(runtime={"name": "echo", "placement": "gredy"})) == [
        "runtime.placement: 'gredy' is not one of round_robin, greedy"
    ]
    assert messages(doc(runtime={"name": "echo", "rounds": 0})) == ["runtime.rounds: 0 is less than 1"]
    assert messages(doc(runtime={"name": "echo", "rouns": 2})) == [
        "runtime.rouns: unknown field; did you mean 'rounds'?"
    ]


def test_a_field_of_another_runtime_is_refused(echo: Any) -> None:
    assert messages(doc(runtime={"name": "layers", "rounds": 2})) == [
        "runtime.rounds: unknown field (allowed: name, tokens)"
    ]


def test_an_unknown_runtime_lists_the_installed_ones(echo: Any) -> None:
    # ./dev setup installs the in-repo runtimes too (headsplit, llamacpp-rpc): they are listed as well
    installed = ", ".join(registry.installed())
    assert "echo, " in installed and "layers" in installed
    assert messages(doc(runtime={"name": "ecko"})) == [f"runtime.name: 'ecko' is not one of {installed}"]


def test_a_block_without_a_name_is_the_default_runtimes(echo: Any) -> None:
    # NNPM's form sends the block untouched as {}: that is the layers runtime, as no block is
    assert messages(doc(runtime={})) == []
    assert expand(doc(runtime={}))[0].runtime == {"name": "layers"}
    # and another runtime's field without its name is refused, naming the field
    assert messages(doc(runtime={"rounds": 3})) == ["runtime.rounds: unknown field (allowed: name, tokens)"]


def test_sweeps_sweep_runtime_fields(echo: Any) -> None:
    # rounds is not written: the sweep finds the field in the echo block's schema
    raw = doc(runtime={"name": "echo"}, sweep={"path": "runtime.rounds", "values": [1, 4]})
    variants = expand(raw)
    assert [v.runtime["rounds"] for v in variants] == [1, 4]
    assert [v.label for v in variants] == ["rt[runtime.rounds=1]", "rt[runtime.rounds=4]"]
    bad = doc(runtime={"name": "echo"}, sweep={"path": "runtime.placement", "values": ["greedy", "gredy"]})
    with pytest.raises(ScenarioError) as info:
        expand(bad)
    assert any("runtime.placement" in str(e) and "'gredy' is not one of" in str(e) for e in info.value.errors)


def test_a_runtime_checks_its_block_against_the_scenario_at_validate_time(echo: Any) -> None:
    assert messages(doc(runtime={"name": "echo", "workers": ["device1", "device9"]})) == [
        "runtime.workers[1]: 'device9' is not a device of the scenario (devices: device1, device2)"
    ]
    assert messages(doc(runtime={"name": "echo", "workers": ["device2"]})) == []
    # a sweep that makes the list wrong is refused at the value that does
    raw = doc(runtime={"name": "echo"}, devices=["device1", "device2"],
              sweep={"path": "runtime.workers", "values": [["device1"], ["device3"]]})  # fmt: skip
    assert messages(raw) == [
        "sweep.values[1]: runtime.workers=[\"device3\"]: runtime.workers[0]: 'device3' is not a device of "
        "the scenario "
        "(devices: device1, device2)"
    ]


def test_a_runtime_whose_check_fails_is_refused_by_name_not_by_a_traceback(
    echo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(block: Any, scenario: Any) -> Any:
        raise KeyError("devices")

    monkeypatch.setattr(echo, "check_block", broken)
    assert messages(doc(runtime={"name": "echo"})) == [
        "runtime: runtime 'echo' failed to check its block: KeyError: 'devices'"
    ]


def test_partition_optimisation_needs_the_layers_runtime(echo: Any) -> None:
    raw = doc(runtime={"name": "echo"}, optimisation={"enabled": True, "algorithm": "greedy"})
    assert "optimisation.enabled: partition optimisation needs the layers runtime, not 'echo'" in messages(
        raw
    )


def test_the_scenario_reference_documents_every_installed_runtime(echo: Any) -> None:
    text = render_reference(load_schema())
    assert "## `runtime`" in text
    assert (
        "| `runtime.placement` | `round_robin` \\| `greedy` | `round_robin` | "
        "Order in which the controller visits the workers. Only when name is echo. |"
    ) in text
    assert "| `runtime.name` | " + " \\| ".join(f"`{name}`" for name in registry.installed()) + " |" in text


def test_the_reference_has_one_row_per_runtime_field_with_that_runtimes_default(echo: Any) -> None:
    text = render_reference(load_schema())
    rows = [line for line in text.splitlines() if line.startswith("| `runtime.")]
    # the default runtime's block again (for a block without a name) makes no "Only ." row
    assert not [row for row in rows if "Only ." in row]
    for field in ("runtime.port", "runtime.tokens"):
        conditions = [
            row.rsplit("Only when name is ", 1)[1].split(".")[0] for row in rows if f"`{field}`" in row
        ]
        assert len(conditions) == len(set(conditions)), (field, conditions)  # one row per runtime
    # each row's default is its runtime's own, not another runtime's of the same field name
    (echo_port,) = [row for row in rows if "`runtime.port`" in row and "Only when name is echo." in row]
    assert echo_port.split(" | ")[2] == ""  # echo's port has no default: the testbed's port then
    (layers_tokens,) = [row for row in rows if "`runtime.tokens`" in row and "when name is layers" in row]
    assert layers_tokens.split(" | ")[2] == ""


def test_a_broken_plugin_is_reported_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "BUILTIN", {**registry.BUILTIN, "broken": "no_such_module_xyz:Thing"})
    registry.reset()
    try:
        assert "broken" not in registry.installed()
        assert "No module named 'no_such_module_xyz'" in registry.problems()["broken"]
        assert loads("name: x\nmodel: fake\ndevices: [d1]\ninference: {enabled: false}\n")
    finally:
        monkeypatch.undo()
        registry.reset()


# -- launch -------------------------------------------------------------------------------------


def context(block: dict[str, Any], **overrides: Any) -> LaunchContext:
    hosts = ("edge", "device1", "device2")
    values: dict[str, Any] = {
        "run_id": "r1",
        "block": block,
        "scenario": resolve(doc(runtime=block) if block.get("name") != "layers" else doc()),
        "edge_host": "edge",
        "devices": ("device1", "device2"),
        "addresses": {"edge": "10.0.0.1", "device1": "10.0.0.11", "device2": "10.0.0.12"},
        "node_roots": {h: f"/var/lib/dit/r1/{h}" for h in hosts},
        "pythons": dict.fromkeys(hosts, "/usr/bin/python3"),
        "local": False,
        "model": {"name": "fake", "params": {"profile": "tiny"}},
        "edge_port": 5000,
    }
    values.update(overrides)
    return LaunchContext(**values)


def test_the_fixture_launches_workers_then_a_timed_controller(echo: Any) -> None:
    block = resolve(doc(runtime={"name": "echo", "port": 47000, "rounds": 2}))["runtime"]
    specs = launch_vars(echo, context(block), ("edge", "device1", "device2"))
    assert set(specs) == {"edge", "device1", "device2"}
    worker = specs["device2"]["background"][0]
    assert worker["argv"][3:7] == ["--bind", "10.0.0.12", "--port", "47001"]
    assert worker["ready_file"] == "echo.ready" and specs["device2"]["main"] == []
    (controller,) = specs["edge"]["main"]
    assert "device1=10.0.0.11:47000,device2=10.0.0.12:47001" in controller["argv"]
    assert controller["result_files"] == ["results/echo_done.json"]
    assert "def controller" in controller["files"]["echo_node.py"]


def test_two_local_devices_get_free_ports_of_their_own_in_argv_and_environment(echo: Any) -> None:
    from dit.run.profile import NODE_PORT_BASE, allocate_ports

    hosts = ("edge", "device1", "device2")
    ports = allocate_ports("echo-20261204-abc", hosts, local=True)
    assert set(ports) == set(hosts) and all(len(p) == PORTS_PER_NODE for p in ports.values())
    every = [port for node in ports.values() for port in node]
    assert len(set(every)) == len(every)  # every local node is 127.0.0.1: no two share a port
    for port in every:  # and each is free (the allocation released them)
        with socket.create_server(("127.0.0.1", port)):
            pass
    # on nodes of their own (leased to this run) the range is fixed
    assert allocate_ports("r", ("edge", "device1"), local=False)["device1"] == tuple(
        range(NODE_PORT_BASE, NODE_PORT_BASE + PORTS_PER_NODE)
    )

    block = resolve(doc(runtime={"name": "echo", "rounds": 2}))["runtime"]
    ctx = context(block, ports=ports, local=True)
    specs = launch_vars(echo, ctx, hosts)
    for device in ("device1", "device2"):
        (worker,) = specs[device]["background"]
        assert worker["argv"][5:7] == ["--port", str(ports[device][0])]
        assert worker["env"]["DIT_PORTS"] == ",".join(map(str, ports[device]))
    (controller,) = specs["edge"]["main"]
    assert controller["env"]["DIT_PORTS"] == ",".join(map(str, ports["edge"]))
    with pytest.raises(LookupError, match=r"no port 4 on 'device1': the testbed sets aside 4 per node"):
        ctx.port("device1", 4)


def test_layers_launches_the_device_agent_with_todays_configuration() -> None:
    layers = LayersRuntime()
    scenario = resolve(
        doc(inference={"enabled": True, "partition_points": [[0, 1], [1, 2]], "repetitions": 3})
    )
    ctx = context({"name": "layers"}, scenario=scenario)
    specs = launch_vars(layers, ctx, ("edge", "device1", "device2"))
    assert "edge" not in specs
    (agent,) = specs["device2"]["main"]
    assert agent["name"] == "profile"
    assert agent["argv"] == [
        "/usr/bin/python3",
        "/var/lib/dit/r1/device2/dit-device.pyz",
        "profile",
        "--config",
        "/var/lib/dit/r1/device2/profile.json",
    ]
    config = json.loads(agent["files"]["profile.json"])
    assert config["inference"]["vectors"] == [[0, 1], [1, 2]]
    assert config["inference"]["device_index"] == 1
    # every frame is signed with the run's key, which the apply stage ships beside the device code
    assert config["inference"]["edge"] == {
        "host": "10.0.0.1",
        "port": 5000,
        "key_file": "/var/lib/dit/r1/device2/edge.key",
    }
    assert config["results_dir"] == "/var/lib/dit/r1/device2/results" and config["host"] == "device2"
    assert "start_at_ns" not in config  # the agent takes it from the start-at file
    assert agent["prepared_file"] == "profile.prepared.json"  # the two-phase start
    origin = {"results/origin.json": {"lateness_ns": 1234}}
    assert layers.started([LaunchOutcome("device2", "profile", 0, origin)]) == {"device2": 1234}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (LaunchSpec("nowhere", "x", ("true",)), "no such node"),
        (LaunchSpec("edge", "edge", ("true",)), "not used by the testbed"),
        (LaunchSpec("edge", "x y", ("true",)), "must be a tag"),
        (LaunchSpec("edge", "x", ()), "argv must be a non-empty list"),
        (LaunchSpec("edge", "x", ("true",), files={"/etc/passwd": ""}), "not a path relative"),
        (LaunchSpec("edge", "x", ("true",), result_files=("../out.json",)), "not a path relative"),
        (LaunchSpec("edge", "x", ("true",), prepared_file="/tmp/p.json"), "not a path relative"),
        (LaunchSpec("edge", "x", ("true",), prepared_file="r.json", result_files=("r.json",)), "also a"),
    ],
)
def test_launch_specs_the_testbed_will_not_start(spec: LaunchSpec, message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        check_specs("t", [spec], ("edge", "device1"))


def test_a_launch_needs_a_main_process_and_unique_names() -> None:
    with pytest.raises(LaunchError, match="no main process"):
        check_specs("t", [LaunchSpec("edge", "x", ("true",), main=False)], ("edge",))
    with pytest.raises(LaunchError, match="named twice"):
        check_specs("t", [LaunchSpec("edge", "x", ("true",)), LaunchSpec("edge", "x", ("false",))], ("edge",))
    background = LaunchSpec("edge", "w", ("true",), main=False, prepared_file="p.json")
    with pytest.raises(LaunchError, match="prepared_file is for main processes"):
        check_specs("t", [LaunchSpec("edge", "x", ("true",)), background], ("edge",))


def test_outcomes_come_from_the_main_task_results() -> None:
    outcome = StageOutcome("profile", "successful", 0)
    result = {"processes": {"c": {"returncode": 0, "results": {"results/done.json": {"ok": 1}}}}}
    outcome.results["edge"] = [
        HostEvent("edge", "ansible", "changed", "Run the runtime's main processes from the start instant",
                  "dit_launch", result)
    ]  # fmt: skip
    got = outcomes(outcome, {"edge": {"background": [], "main": [{"name": "c"}]}})
    assert got == [LaunchOutcome("edge", "c", 0, {"results/done.json": {"ok": 1}})]


def test_start_margins_say_how_far_ahead_of_the_instant_the_start_task_reached_each_node() -> None:
    outcome = StageOutcome("profile", "successful", 0)
    task = "Run the runtime's main processes from the start instant"
    for host, entered in (("device1", 9_400_000_000), ("device2", 10_250_000_000)):
        result = {"processes": {}, "entered_ns": entered, "start_at_ns": 10_000_000_000}
        outcome.results[host] = [HostEvent(host, "ansible", "changed", task, "dit_launch", result)]
    outcome.results["edge"] = [HostEvent("edge", "ansible", "changed", task, "dit_launch", {"processes": {}})]
    launched = {h: {"background": [], "main": [{"name": "c"}]} for h in ("device1", "device2", "edge")}
    launched["device3"] = {"background": [{"name": "b"}], "main": []}
    # device2's start task began 250 ms after the instant: its prepared processes started that late
    assert start_margins(outcome, launched) == {"device1": 600_000_000, "device2": -250_000_000}


# -- results ------------------------------------------------------------------------------------


def test_the_fixtures_results_parser_writes_a_table_and_unit_carrying_values(
    echo: Any, tmp_path: Path
) -> None:
    (tmp_path / "scenario.yaml").write_text(
        json.dumps(resolve(doc(runtime={"name": "echo"}))), encoding="utf-8"
    )
    raw = tmp_path / "raw" / "edge"
    raw.mkdir(parents=True)
    rtts = {"device1": [1_000_000, 3_000_000], "device2": [2_000_000, 2_000_000]}
    with (raw / "edge_echo.csv").open("w", encoding="utf-8") as handle:
        handle.write("device,round,bytes,rtt_ns\n")
        for device, values in rtts.items():
            for i, rtt in enumerate(values):
                handle.write(f"{device},{i},64,{rtt}\n")
    results = echo.parse_results(LoadedRun(tmp_path))
    table = tmp_path / "aggregate" / "echo_rtt.csv"
    assert results.tables == (table,)
    with table.open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["device"], r["round_trips"], r["rtt_mean_ns"]) for r in rows] == [
        ("device1", "2", "2000000"),
        ("device2", "2", "2000000"),
    ]
    values = {v.name: (v.value, v.unit, v.type) for v in results.summary}
    assert values["rtt_mean"] == (2.0, "ms", "float")
    assert values["payload"] == (64, "bytes", "int")
    assert values["round_trips"] == (4, "", "int")
    path = write_summary(tmp_path / "aggregate", "echo", results)
    written = json.loads(path.read_text(encoding="utf-8"))
    assert written["runtime"] == "echo" and written["tables"] == ["echo_rtt.csv"]
    assert {
        "name": "rtt_mean",
        "value": 2.0,
        "unit": "ms",
        "type": "float",
        "description": "mean round trip",
    } in (written["values"])


def test_summary_values_are_typed() -> None:
    with pytest.raises(ValueError, match="not of type float"):
        SummaryValue("rtt", "fast", "ms", "float")
    with pytest.raises(ValueError, match="not of type int"):
        SummaryValue("n", True, "", "int")
    with pytest.raises(ValueError, match="finite"):
        SummaryValue("x", float("nan"), "ms", "float")
    twice = Results(summary=(SummaryValue("a", 1, "", "int"), SummaryValue("a", 2, "", "int")))
    with pytest.raises(ValueError, match="named twice: a"):
        write_summary(Path("/nonexistent"), "t", twice)


# -- readiness and actions ----------------------------------------------------------------------


def event(host: str, status: str, task: str, **result: Any) -> HostEvent:
    return HostEvent(host, "ansible", status, task, "command", result)


def test_readiness_per_node_ok_failed_unreachable_with_the_reason() -> None:
    plan = ReadinessPlan(plays=(), checks=("python", "tcp"))
    outcome = StageOutcome("r", "failed", 2)
    outcome.results = {
        "edge": [event("edge", "ok", "check: python", stdout="3.12.1"), event("edge", "ok", "check: tcp")],
        "d1": [
            event("d1", "failed", "check: python", msg="[Errno 2] No such file or directory: b'/nope'"),
            event("d1", "ok", "check: tcp", stdout="listens"),
        ],
        "d2": [event("d2", "unreachable", "check: python", msg="Failed to connect to the host via ssh")],
        "d3": [event("d3", "ok", "check: python", stdout="3.12.1")],
        "d4": [
            event("d4", "failed", "check: python", msg="Error executing command.", rc=2, cmd="/nope -c x")
        ],
    }
    got = {v.host: v for v in ops.readiness_of(plan, outcome, ["edge", "d1", "d2", "d3", "d4"])}
    assert got["d4"].reason == "python: Error executing command. (status 2, /nope)"
    assert got["edge"].ok and got["edge"].checks[0].detail == "3.12.1"
    assert got["d1"].state == "failed"
    assert got["d1"].reason == "python: [Errno 2] No such file or directory: b'/nope'"
    assert got["d2"].state == "unreachable" and "Failed to connect" in got["d2"].reason
    assert (got["d3"].state, got["d3"].reason) == ("failed", "tcp: did not run")


def say_action() -> Action:
    inputs = {
        "type": "object",
        "additionalProperties": False,
        "required": ["message"],
        "properties": {
            "message": {"type": "string"},
            "count": {"type": "integer", "minimum": 1, "default": 1},
        },
    }
    return Action("say", "Say", "", inputs, lambda _i: ActionPlan(plays=()))


def test_action_inputs_are_validated_and_errors_name_the_key() -> None:
    action = say_action()
    assert ops.validate_inputs(action, ops.parse_sets(["message=hi"])) == {"message": "hi", "count": 1}
    assert ops.validate_inputs(action, ops.parse_sets(["message=hi", "count=3"]))["count"] == 3
    with pytest.raises(ops.InputError) as info:
        ops.validate_inputs(action, ops.parse_sets(["count=0", "colour=red"]))
    assert [str(e) for e in info.value.errors] == [
        "colour: unknown field (allowed: message, count)",
        "count: 0 is less than 1",
        "message: is required",
    ]
    with pytest.raises(ops.InputError, match="expected key=value"):
        ops.parse_sets(["count"])


def test_an_unknown_action_lists_the_runtimes_actions() -> None:
    with pytest.raises(ops.UnknownAction, match="its actions: install-runtime, distribute-weights"):
        ops.action_of(LayersRuntime(), "nope")


# -- docs/runtimes.md ---------------------------------------------------------------------------


def docs_example(language: str = "python") -> str:
    """The first ``language`` code block of docs/runtimes.md's "A minimal runtime"."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "runtimes.md").read_text(encoding="utf-8")
    start = text.index("## A minimal runtime")
    fence = f"```{language}\n"
    block = text[text.index(fence, start) + len(fence) :]
    return block[: block.index("```")]


def test_the_minimal_runtime_of_the_docs_works(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import subprocess
    import time
    import types

    module = types.ModuleType("hello_runtime")
    exec(compile(docs_example(), "docs/runtimes.md", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, "hello_runtime", module)
    monkeypatch.setattr(registry, "BUILTIN", {**registry.BUILTIN, "hello": "hello_runtime:HelloRuntime"})
    registry.reset()
    try:
        hello = registry.get("hello")
        assert messages(doc(runtime={"name": "hello", "seconds": -1})) == [
            "runtime.seconds: -1 is less than 0"
        ]
        block = resolve(doc(runtime={"name": "hello"}))["runtime"]
        assert block == {"name": "hello", "seconds": 0.1}
        # the page's scenario for it loads as written: no model, no inference block
        (scenario,) = loads(docs_example("yaml"))
        assert scenario.model is None and scenario.runtime == {"name": "hello", "seconds": 0.5}
        specs = launch_vars(hello, context(block), ("edge", "device1", "device2"))
        (spec,) = specs["device1"]["main"]
        # run the node program as the profile stage would: in the node root, with the start instant
        root = tmp_path / "nodes" / "device1"
        (root / "results").mkdir(parents=True)
        for name, text in spec["files"].items():
            (root / name).write_text(text, encoding="utf-8")
        env = {"DIT_START_AT_NS": str(time.time_ns() + 200_000_000), "PATH": "/usr/bin:/bin"}
        subprocess.run([sys.executable, *spec["argv"][1:]], cwd=root, env=env, check=True, timeout=30)
        late = json.loads((root / "results" / "hello.json").read_text(encoding="utf-8"))["late_ns"]
        assert 0 <= late < 1_000_000_000
        # the results parser, on the collected layout
        run_dir = tmp_path / "run"
        (run_dir / "raw" / "device1").mkdir(parents=True)
        (run_dir / "raw" / "device2").mkdir(parents=True)
        (run_dir / "scenario.yaml").write_text(json.dumps(resolve(doc(runtime=block))), encoding="utf-8")
        written = (root / "results" / "hello.json").read_text(encoding="utf-8")
        (run_dir / "raw" / "device1" / "device1_hello.json").write_text(written, encoding="utf-8")
        (run_dir / "raw" / "device2" / "device2_hello.json").write_text(
            '{"late_ns": 3000000}', encoding="utf-8"
        )
        results = hello.parse_results(LoadedRun(run_dir))
        assert (run_dir / "aggregate" / "hello.csv").read_text(encoding="utf-8").splitlines() == [
            "device,late_ns",
            f"device1,{late}",
            "device2,3000000",
        ]
        (value,) = results.summary
        assert (value.name, value.unit, value.value) == ("worst_late", "ms", max(late, 3_000_000) / 1e6)
    finally:
        monkeypatch.undo()
        registry.reset()


def test_a_block_without_a_name_may_optimise_partitions(echo: Any) -> None:
    # the optimisers need the layers runtime; a nameless block is that runtime
    assert messages(doc(runtime={}, optimisation={"enabled": True})) == []


def test_only_a_runtime_that_uses_the_edge_service_gets_its_profile_at_the_start_instant(echo: Any) -> None:
    """The edge service profiles its capacity again from the start instant only for the built-in
    runtime, whose devices send it their requests: beside a plug-in's own inference on the edge (no
    request would ever end it) it would take the edge's CPU for ``profile_min_s`` or longer."""
    assert uses_edge_service(LayersRuntime()) is True
    assert uses_edge_service(echo) is False  # a plug-in that does not say so brings its own
    for name, runtime in registry.installed().items():
        assert uses_edge_service(runtime) is (name == "layers"), name


def test_only_a_runtime_that_declares_it_sends_from_the_device_s_own_address(echo: Any) -> None:
    """Local mode's link emulator selects a device's packets by its loopback address: the netem condition
    gives it a runtime only when the runtime says its processes send from there. The shipped ones do
    (the layers agents connect from it; HeadSplit and llama.cpp listen on it); the fixture says nothing."""
    from dit.runtime_api.interface import sends_from_source_address

    assert sends_from_source_address(LayersRuntime()) is True
    assert sends_from_source_address(echo) is False
    for name, runtime in registry.installed().items():
        assert sends_from_source_address(runtime) is (name != "echo"), name


def test_passing_readiness_checks_show_their_detail_as_failing_ones_do() -> None:
    from dit.runtime_api.interface import CheckResult
    from dit.runtime_ops.cli import checks_cell

    checks = (
        CheckResult("python", True, "3.11.7"),
        CheckResult("tcp", True, ""),
        CheckResult("gguf", False, "/models/x.gguf: no such file"),
    )
    assert checks_cell(checks) == "python ok (3.11.7), tcp ok, gguf FAILED"


def test_the_edge_service_starts_only_for_a_runtime_that_uses_it(tmp_path: Path) -> None:
    from dit.run.ansible_exec import render_playbook

    def tasks(edge_service: bool) -> list[str]:
        path = render_playbook("apply", tmp_path / str(edge_service), {"edge_service": edge_service})
        plays = yaml.safe_load(path.read_text(encoding="utf-8"))
        return [task["name"] for play in plays for task in play["tasks"]]

    assert "Start the edge inference service" in tasks(True)
    assert "Start the edge inference service" not in tasks(False)


def test_model_is_required_only_by_a_runtime_that_runs_the_testbeds_model(echo: Any) -> None:
    """Issue 33 item 4: a plug-in that brings its own model (the echo fixture declares nothing) may leave
    ``model`` out; the built-in runtime, named or by default, still refuses a scenario without it."""
    from dit.runtime_api.interface import uses_testbed_model

    assert uses_testbed_model(LayersRuntime()) is True
    assert uses_testbed_model(echo) is False
    for name, runtime in registry.installed().items():  # HeadSplit and llama.cpp name theirs in the block
        assert uses_testbed_model(runtime) is (name == "layers"), name
    modelless = {k: v for k, v in BASE.items() if k != "model"}
    assert messages({**modelless, "runtime": {"name": "echo"}}) == []
    (scenario,) = expand({**modelless, "runtime": {"name": "echo"}})
    assert scenario.model is None and "model" not in scenario.data
    (with_model,) = expand(doc(runtime={"name": "echo"}))  # a plug-in scenario may still name one
    assert with_model.model is not None and with_model.model.name == "fake"
    refused = "model: is required for runtime layers, which runs the testbed's model: give a model name such as fake"
    for block in ({}, {"runtime": {}}, {"runtime": {"name": "layers"}}):
        assert messages({**modelless, **block}) == [refused], block
    assert "model" not in load_schema()["required"]
    reference = render_reference(load_schema())
    (row,) = [line for line in reference.splitlines() if line.startswith("| `model` |")]
    assert "Required for runtime layers, which runs the testbed's model" in row and "echo" not in row


def test_a_scenario_without_a_model_reaches_every_reader_as_no_model(echo: Any, tmp_path: Path) -> None:
    """The driver's inputs (apply's edge config, the launch context, metadata.json), the run page and
    NNPM's scenario validation all take a plug-in scenario without ``model``."""
    from dit.run import profile
    from dit.run.provenance import run_metadata
    from dit.web.routes.scenarios import check_document
    from dit.web.services import runpage
    from dit.web.services.benchmark import benchmark_document

    document = {k: v for k, v in BASE.items() if k not in ("model", "inference")}
    document["runtime"] = {"name": "echo", "rounds": 2}
    (scenario,) = expand(document)
    warnings: list[str] = []
    model = profile.scenario_model(scenario, True, True, warnings.append)
    assert model is None and warnings == []
    assert profile.model_spec(model) == {} and profile.model_record(model) is None
    assert profile.edge_config(scenario, "r1", profile.model_spec(model), None, "/r1")["model"] == {}
    metadata = run_metadata(
        "r1", scenario, local=True, inventory="local", model=profile.model_record(model),
        runtime={}, conditions={}, processes={}, nodes={},
    )  # fmt: skip
    assert metadata["model"] is None and "model" not in metadata["scenario"]["document"]
    assert runpage.model_view(metadata["model"]) is None
    # NNPM's form sends the document as the user left it: validated, saved and benchmarked without a model
    checked, errors = check_document({"document": document})
    assert errors == [] and checked == document
    benchmark, errors = benchmark_document(document, None)
    assert errors == [] and validate(benchmark) == []
    _, errors = check_document({"document": {k: v for k, v in document.items() if k != "runtime"}})
    assert errors == [{"path": "model", "message": "is required for runtime layers, which runs the "
                       "testbed's model: give a model name such as fake"}]  # fmt: skip
