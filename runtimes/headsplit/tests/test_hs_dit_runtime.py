"""HeadSplit's dit runtime: the block merged into dit's schema, launch, readiness plays, actions.

No torch: the plug-in is loaded by dit in the controller's venv, which need not have it.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from dit.run.launch import launch_vars  # noqa: E402
from dit.runtime_api import registry  # noqa: E402
from dit.runtime_ops.plays import InputError, action_of, validate_inputs  # noqa: E402
from dit.runtimes import LaunchContext  # noqa: E402
from dit.scenario import expand, resolve, validate  # noqa: E402
from headsplit.config import PRESETS  # noqa: E402
from headsplit.dit_runtime import HeadSplitLaunchError  # noqa: E402

BASE: dict[str, Any] = {
    "name": "hs",
    "model": {"name": "fake", "params": {"profile": "tiny"}},
    "devices": ["device1", "device2", "device3"],
    "inference": {"enabled": False},
}
HOSTS = ("edgeserver", "device1", "device2", "device3")


@pytest.fixture
def headsplit(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The runtime registered in this process (the integration test installs it with pip)."""
    monkeypatch.setattr(
        registry, "BUILTIN", {**registry.BUILTIN, "headsplit": "headsplit.dit_runtime:HeadSplitRuntime"}
    )
    registry.reset()
    yield registry.get("headsplit")
    monkeypatch.undo()
    registry.reset()


def doc(**overrides: Any) -> dict[str, Any]:
    out = copy.deepcopy(BASE)
    out.update(overrides)
    return out


def messages(raw: dict[str, Any]) -> list[str]:
    return [str(e) for e in validate(raw)]


def test_the_module_imports_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"  # `import torch` now raises ImportError
        "import headsplit.dit_runtime as m; print(m.HeadSplitRuntime().name)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": f"{SRC}:{Path(__file__).resolve().parents[3] / 'src'}"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "headsplit"


def test_the_block_is_merged_with_its_defaults(headsplit: Any) -> None:
    assert messages(doc(runtime={"name": "headsplit"})) == []
    block = resolve(doc(runtime={"name": "headsplit", "workers": ["device1", "device2"]}))["runtime"]
    assert block == {
        "name": "headsplit",
        "workers": ["device1", "device2"],
        "model": "gpt2-tiny",
        "controller": "edge",
        "strategy": "greedy",
        "control": "dataflow",
        "speculation": False,
        "tau": 0.05,
        "tokens": 16,
        "prompt": "Heads expose the parallelism that layers hide.",
        "perplexity": False,
        "memory_threshold": 0.85,
        "replacement": True,
        "rpc_timeout_s": 30,
        "rpc_retries": 3,
        "port": 29500,
        "threads": 1,
    }
    assert headsplit.block_schema()["properties"]["model"]["enum"] == sorted(PRESETS)


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"strategy": "gredy"}, "runtime.strategy: 'gredy' is not one of layerwise, roundrobin, greedy"),
        ({"control": "push"}, "runtime.control: 'push' is not one of dataflow, rpc"),
        ({"model": "gpt3"}, "runtime.model: 'gpt3' is not one of"),
        ({"tau": -0.1}, "runtime.tau: -0.1 is less than 0"),
        ({"tokens": 5000}, "runtime.tokens: 5000 is greater than 4096"),
        ({"rpc_retries": 11}, "runtime.rpc_retries: 11 is greater than 10"),
        ({"memory_threshold": 0}, "runtime.memory_threshold: 0 must be greater than 0"),
        ({"workers": []}, "runtime.workers:"),
        (
            {"checkpoint": {"path": "w.safetensors", "sha256": "abc"}},
            "runtime.checkpoint.sha256: 'abc' is not a SHA-256",
        ),
        ({"checkpoint": {"path": "w.safetensors"}}, "runtime.checkpoint.sha256: is required"),
        ({"stratgy": "greedy"}, "runtime.stratgy: unknown field; did you mean 'strategy'?"),
        ({"perplexity": "yes"}, "runtime.perplexity: expected true or false, got string 'yes'"),
        (
            {"memory_pressure": {"replace_at": 4, "full_at": 4}},
            "runtime.memory_pressure.full_at: 4 is not after replace_at (4)",
        ),
        (
            {"memory_pressure": {"replace_at": 16, "full_at": 20}},
            "runtime.memory_pressure.replace_at: 16 is not before the last of the 16 tokens (token 15)",
        ),
        ({"memory_pressure": {"replace_at": 4}}, "runtime.memory_pressure.full_at: is required"),
        ({"replacement": "no"}, "runtime.replacement: expected true or false"),
        (
            {"perplexity_paragraph": "/no/such/paragraph.txt"},
            "runtime.perplexity_paragraph: has no effect without runtime.perplexity: true",
        ),
        (
            {"perplexity": True, "perplexity_paragraph": "/no/such/paragraph.txt"},
            "runtime.perplexity_paragraph: /no/such/paragraph.txt: No such file or directory",
        ),
    ],
)
def test_errors_in_the_block_name_the_path(headsplit: Any, block: dict[str, Any], message: str) -> None:
    (got,) = messages(doc(runtime={"name": "headsplit", **block}))
    assert got.startswith(message), got


def test_a_sweep_of_whole_blocks_and_of_fields(headsplit: Any) -> None:
    raw = doc(
        runtime={"name": "headsplit"},
        sweep=[
            {"path": "runtime", "values": [{"name": "headsplit", "strategy": "layerwise"},
                                           {"name": "headsplit", "strategy": "greedy", "speculation": True}]},
            {"path": "runtime.tau", "values": [0, 0.1]},
        ],
    )  # fmt: skip
    with pytest.raises(Exception, match="overlaps"):
        expand(raw)
    variants = expand(doc(runtime={"name": "headsplit"}, sweep={"path": "runtime.tau", "values": [0, 0.02]}))
    assert [v.runtime["tau"] for v in variants] == [0, 0.02]


def context(block: dict[str, Any], **overrides: Any) -> LaunchContext:
    scenario = resolve(doc(runtime=block, hardware={"device2": {"memory_limit_mb": 512}}))
    values: dict[str, Any] = {
        "run_id": "r1",
        "block": scenario["runtime"],
        "scenario": scenario,
        "edge_host": "edgeserver",
        "devices": ("device1", "device2", "device3"),
        "addresses": {"edgeserver": "10.0.0.1", "device1": "10.0.0.11", "device2": "10.0.0.12", "device3": "10.0.0.13"},
        "node_roots": {h: "/var/lib/dit/r1" for h in HOSTS},
        "pythons": dict.fromkeys(HOSTS, "/usr/bin/python3"),
        "local": False,
        "model": {"name": "fake", "params": {"profile": "tiny"}},
        "edge_port": 5000,
    }  # fmt: skip
    values.update(overrides)
    return LaunchContext(**values)


def test_launch_starts_workers_then_the_controller_with_one_config(headsplit: Any) -> None:
    block = {
        "name": "headsplit",
        "workers": ["device2", "device1"],
        "strategy": "roundrobin",
        "control": "rpc",
        "speculation": True,
        "tau": 0.02,
        "tokens": 8,
        "port": 29600,
        "checkpoint": {"path": "/models/gpt2.safetensors", "sha256": "a" * 64},
        "speculation_profile": "profiles/speculation-gpt2-tiny-tau0.02.json",
    }
    specs = launch_vars(headsplit, context(block), HOSTS)
    assert set(specs) == {"edgeserver", "device1", "device2"}  # device3 is not a worker
    (w1,) = specs["device2"]["background"]
    assert w1["name"] == "hs-worker1" and w1["ready_file"] is None
    assert w1["argv"] == [
        "/usr/bin/python3",
        "-m",
        "headsplit.worker",
        "--config",
        "headsplit.json",
        "--rank",
        "1",
    ]
    assert specs["device1"]["background"][0]["argv"][-1] == "2"
    (controller,) = specs["edgeserver"]["main"]
    assert controller["name"] == "hs-controller" and specs["edgeserver"]["background"] == []
    assert controller["argv"] == [
        "/usr/bin/python3",
        "-m",
        "headsplit.controller",
        "--config",
        "headsplit.json",
    ]
    assert controller["result_files"] == ["results/headsplit.json"]
    config = json.loads(controller["files"]["headsplit.json"])
    assert config == {
        "model": {"preset": "gpt2-tiny"},
        "checkpoint": {"path": f"/var/lib/dit/headsplit/files/{'a' * 64}/gpt2.safetensors", "sha256": "a" * 64},
        "controller": {"host": "edgeserver", "address": "10.0.0.1", "source_address": None, "port": 29600},
        "workers": [
            {"rank": 1, "name": "worker1", "host": "device2", "address": "10.0.0.12", "source_address": None,
             "memory_limit_bytes": 512 * 1024 * 1024, "exit_note": None},
            {"rank": 2, "name": "worker2", "host": "device1", "address": "10.0.0.11", "source_address": None,
             "memory_limit_bytes": 0, "exit_note": None},
        ],
        "strategy": "roundrobin",
        "control": "rpc",
        "speculation": True,
        "tau": 0.02,
        "speculation_profile": "/var/lib/dit/headsplit/profiles/speculation-gpt2-tiny-tau0.02.json",
        "tokens": 8,
        "prompt": "Heads expose the parallelism that layers hide.",
        "prompt_ids": None,
        "perplexity": None,
        "placement_profile": None,
        "memory_threshold": 0.85,
        "replacement": True,
        "memory_pressure": None,
        "rpc_timeout_s": 30.0,
        "rpc_retries": 3,
        "threads": 1,
        "result": "results/headsplit.json",
    }  # fmt: skip
    assert json.loads(w1["files"]["headsplit.json"])["workers"] == config["workers"]
    assert set(controller["files"]) == {"headsplit.json"}  # no placement-costs.json without a profile


def test_local_mode_reads_files_where_they_are_and_the_block_may_name_the_interpreter(headsplit: Any) -> None:
    block = {"name": "headsplit", "python": "/opt/dit/runtimes/headsplit/bin/python",
             "checkpoint": {"path": "/models/gpt2.safetensors", "sha256": "b" * 64}}  # fmt: skip
    specs = launch_vars(headsplit, context(block, local=True), HOSTS)
    assert {h: len(s["background"]) for h, s in specs.items()} == {
        "edgeserver": 0,
        "device1": 1,
        "device2": 1,
        "device3": 1,
    }
    (controller,) = specs["edgeserver"]["main"]
    assert controller["argv"][0] == "/opt/dit/runtimes/headsplit/bin/python"
    config = json.loads(controller["files"]["headsplit.json"])
    assert config["checkpoint"]["path"] == "/models/gpt2.safetensors"
    # one machine: the controller reads how a lost worker ended, in that worker's node root
    assert [w["exit_note"] for w in config["workers"]] == [
        f"/var/lib/dit/r1/results/worker{r}.exit.json" for r in (1, 2, 3)
    ]


def test_local_mode_gives_every_process_its_device_s_own_address(headsplit: Any) -> None:
    """Local mode: each device's loopback address (``LaunchContext.source_addresses``) goes to the
    process on that device, which listens there (headsplit.netif.pin): the link emulator selects the
    device's packets by it. The edge has none and stays on its address."""
    loopback = {h: "127.0.0.1" for h in HOSTS}
    sources = {"device1": "127.40.7.2", "device2": "127.40.7.3", "device3": "127.40.7.4"}
    block = {"name": "headsplit", "controller": "device3", "workers": ["device2", "device1"]}
    ctx = context(block, local=True, addresses=loopback, source_addresses=sources)
    assert headsplit.sends_from_source_address is True
    specs = launch_vars(headsplit, ctx, HOSTS)
    (controller,) = specs["device3"]["main"]
    config = json.loads(controller["files"]["headsplit.json"])
    assert config["controller"] == {"host": "device3", "address": "127.0.0.1", "source_address": "127.40.7.4",
                                    "port": 29500}  # fmt: skip
    assert [(w["host"], w["address"], w["source_address"]) for w in config["workers"]] == [
        ("device2", "127.0.0.1", "127.40.7.3"),
        ("device1", "127.0.0.1", "127.40.7.2"),
    ]
    for host in ("device1", "device2"):
        (worker,) = specs[host]["background"]
        assert json.loads(worker["files"]["headsplit.json"])["workers"] == config["workers"]
    # the edge as the controller: no address of its own
    edge = launch_vars(headsplit, context({"name": "headsplit"}, local=True, addresses=loopback,
                                          source_addresses=sources), HOSTS)  # fmt: skip
    (controller,) = edge["edgeserver"]["main"]
    assert json.loads(controller["files"]["headsplit.json"])["controller"]["source_address"] is None


@pytest.mark.parametrize(
    ("block", "message"),
    [
        (
            {"workers": ["device1", "device9"]},
            "runtime.workers[1]: 'device9' is not a device of the scenario",
        ),
        (
            {"controller": "device1", "workers": ["device1", "device2"]},
            "runtime.workers[0]: 'device1' is the controller's node",
        ),
        ({"controller": "board7"}, "runtime.controller: 'board7' is neither the edge server nor a device"),
    ],
)
def test_launch_refuses_workers_that_are_not_devices(
    headsplit: Any, block: dict[str, Any], message: str
) -> None:
    with pytest.raises(HeadSplitLaunchError, match=message.replace("[", r"\[").replace("]", r"\]")):
        headsplit.launch(context({"name": "headsplit", **block}))


@pytest.mark.parametrize(
    ("block", "message"),
    [
        (
            {"workers": ["device1", "device9"]},
            "runtime.workers[1]: 'device9' is not a device of the scenario (devices: device1, device2, device3)",
        ),
        (
            {"controller": "device1", "workers": ["device1", "device2"]},
            "runtime.workers[0]: 'device1' is the controller's node; it cannot also run a worker",
        ),
        (
            {"controller": "board7"},
            "runtime.controller: 'board7' is neither the edge server nor a device of the scenario "
            "(devices: device1, device2, device3)",
        ),
        (
            {"controller": "device3"},
            "runtime.workers: absent, so every device works, and 'device3' is the controller's node; "
            "list the workers without it",
        ),
    ],
)
def test_validate_refuses_workers_and_controllers_that_are_not_nodes(
    headsplit: Any, block: dict[str, Any], message: str
) -> None:
    assert messages(doc(runtime={"name": "headsplit", **block})) == [message]


def test_validate_refuses_a_trained_model_without_its_checkpoint(headsplit: Any) -> None:
    """smollm2-135m has no seeded weights to fall back on: refused at validate with the field's path
    (issue 49, item 6), not by apply's prompt tokenizer 19 s later."""
    assert messages(doc(runtime={"name": "headsplit", "model": "smollm2-135m"})) == [
        "runtime.checkpoint: model smollm2-135m runs its trained weights: give the directory "
        "`python -m dit.models.convert smollm2-135m DIR` writes and the pin it prints"
    ]
    pinned = {"path": "/data/smollm2-135m", "sha256": "0" * 64}
    assert messages(doc(runtime={"name": "headsplit", "model": "smollm2-135m", "checkpoint": pinned})) == []


def test_a_device_may_be_the_controller(headsplit: Any) -> None:
    block = {"name": "headsplit", "controller": "device3", "workers": ["device1", "device2"]}
    specs = launch_vars(headsplit, context(block), HOSTS)
    assert specs["device3"]["main"][0]["name"] == "hs-controller" and "edgeserver" not in specs


def test_readiness_checks_the_interpreter_torch_headsplit_and_the_port(
    headsplit: Any, tmp_path: Path
) -> None:
    plan = headsplit.readiness(resolve(doc(runtime={"name": "headsplit", "port": 29700})), tmp_path)
    assert plan.checks == ("python", "torch", "headsplit", "rpc-port")
    tasks = plan.plays[0]["tasks"]
    assert [t["name"] for t in tasks] == [
        "check: python",
        "check: torch",
        "check: headsplit",
        "check: rpc-port",
    ]
    assert all(t["ignore_errors"] for t in tasks)
    port = tasks[3]["ansible.builtin.command"]["argv"]
    assert port[3:] == ["29700", "{{ 'controller' if 'edge' in group_names else 'worker' }}"]
    assert "dit_headsplit_python" in port[0]
    # the check programs themselves, run here
    free = subprocess.run(
        [sys.executable, "-c", port[2], "0", "controller"], capture_output=True, text=True, check=False
    )
    assert free.returncode == 0 and free.stdout.strip() == "port 0 is free"
    skip = subprocess.run(
        [sys.executable, "-c", port[2], "1", "worker"], capture_output=True, text=True, check=False
    )
    assert skip.returncode == 0 and skip.stdout.strip() == "not the controller"
    versions = tasks[1]["ansible.builtin.command"]["argv"]
    found = subprocess.run(
        [sys.executable, "-c", versions[2], "json"], capture_output=True, text=True, check=False
    )
    assert found.stdout.startswith("json ")
    named = headsplit.readiness(
        {"runtime": {"controller": "device2", "python": "/venv/bin/python"}}, tmp_path
    )
    # the controller's name is data (a variable), never pasted into the plays' template text
    role = named.plays[0]["tasks"][3]["ansible.builtin.command"]["argv"][4]
    assert "inventory_hostname == dit_headsplit_controller" in role and "device2" not in role
    assert named.extravars == {
        "dit_headsplit_controller": "device2",
        "dit_headsplit_check_python": "/venv/bin/python",
    }


def _rendered(plan: Any, text: str, inputs: Any = None) -> str:
    """``text`` of a plan's plays as Ansible would render it with the plan's variables (the inputs and
    what is derived from them travel as variables, never in the plays' text)."""
    env = jinja2.Environment(undefined=jinja2.ChainableUndefined, autoescape=False)  # noqa: S701 - not HTML
    return env.from_string(text).render(**dict(plan.extravars), dit_action_inputs=inputs or {})


def test_distribute_checkpoint_verifies_the_hash_here_and_on_every_node(
    headsplit: Any, tmp_path: Path
) -> None:
    action = action_of(headsplit, "distribute-checkpoint")
    with pytest.raises(InputError, match="sha256: 'xyz' is not a SHA-256"):
        validate_inputs(action, {"path": "w.safetensors", "sha256": "xyz"})
    plan = action.plan(validate_inputs(action, {"path": str(tmp_path / "w.safetensors"), "sha256": "c" * 64}))
    assert not isinstance(plan.plays, Path)  # plays, not a playbook file
    (nodes,) = plan.plays
    assert nodes["hosts"] == "all"
    names = [next(k for k in t if k.startswith(("ansible.", "dit_"))) for t in nodes["tasks"]]
    assert names == [
        "ansible.builtin.stat",
        "ansible.builtin.assert",
        "dit_trusted_dir",  # the directory and every parent root's alone (issue 46)
        "ansible.builtin.copy",
        "ansible.builtin.stat",
        "ansible.builtin.assert",
    ]
    here = nodes["tasks"][0]
    assert (here["delegate_to"], here["run_once"]) == ("localhost", True)
    assert here["ansible.builtin.stat"]["path"] == "{{ hs_checkpoint_path }}"
    assert _rendered(plan, here["ansible.builtin.stat"]["path"]) == str(tmp_path / "w.safetensors")
    stat = nodes["tasks"][4]["ansible.builtin.stat"]
    assert stat["checksum_algorithm"] == "sha256"
    assert _rendered(plan, stat["path"], {"sha256": "c" * 64}).endswith(
        f"/headsplit/files/{'c' * 64}/w.safetensors"
    )
    check = nodes["tasks"][5]["ansible.builtin.assert"]
    assert "hs_copied.stat.checksum" in check["fail_msg"] and "dit_action_inputs.sha256" in check["fail_msg"]


def test_build_speculation_profile_runs_on_the_edge_then_distributes(headsplit: Any, tmp_path: Path) -> None:
    action = action_of(headsplit, "build-speculation-profile")
    inputs = validate_inputs(action, {"tau": 0.1, "corpus": "/data/corpus.txt", "out": str(tmp_path)})
    assert inputs["model"] == "gpt2-tiny"
    plan = action.plan(inputs)
    plays = plan.plays
    assert not isinstance(plays, Path)
    build, distribute = plays
    assert build["hosts"] == "edge" and distribute["hosts"] == "devices"
    argv = [_rendered(plan, a) for a in build["tasks"][1]["ansible.builtin.command"]["argv"]]
    assert argv[1:7] == ["-m", "headsplit.speculation", "--model", "gpt2-tiny", "--tau", "0.1"]
    assert argv[-2:] == ["--corpus", "/data/corpus.txt"]
    assert "/data/corpus.txt" not in str(plays)  # a path is data: a variable, not the plays' text
    fetch = build["tasks"][3]["ansible.builtin.fetch"]
    assert _rendered(plan, fetch["dest"]) == f"{tmp_path}/speculation-gpt2-tiny-tau0.1.json"
    assert fetch["flat"] is True
    assert distribute["tasks"][1]["ansible.builtin.copy"]["src"] == fetch["dest"]


def test_build_speculation_profile_of_a_trained_model_sends_its_tokens(
    headsplit: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """smollm2-135m (issue 32, item 5): the corpus tokenized here with the model's own tokenizer goes to
    the edge as data, the profile reads the distributed checkpoint; without one it is refused."""
    from headsplit.plugin import actions

    seen: list[str] = []
    monkeypatch.setattr(actions, "model_tokens", lambda model, text: seen.append(text) or (7, 8, 9))
    action = action_of(headsplit, "build-speculation-profile")
    sha = "ab" * 32
    inputs = validate_inputs(action, {"model": "smollm2-135m", "checkpoint": str(tmp_path / "smollm2-135m"),
                                      "sha256": sha, "out": str(tmp_path)})  # fmt: skip
    plan = action.plan(inputs)
    build = plan.plays[0]  # type: ignore[index]
    assert seen == [actions.DEFAULT_CORPUS.read_text(encoding="utf-8")]
    assert plan.extravars["hs_corpus_ids"] == [7, 8, 9]
    copy_ids = build["tasks"][1]["ansible.builtin.copy"]
    assert copy_ids["content"] == "{{ hs_corpus_ids | to_json }}"  # Ansible's filter: JSON, as data
    argv = [_rendered(plan, a) for a in build["tasks"][2]["ansible.builtin.command"]["argv"]]
    i = argv.index("--checkpoint")
    assert argv[i : i + 4] == [
        "--checkpoint",
        f"/var/lib/dit/headsplit/files/{sha}/smollm2-135m",
        "--sha256",
        sha,
    ]
    assert argv[argv.index("--ids") + 1] == _rendered(plan, copy_ids["dest"])
    assert 'smollm2-135m"' not in json.dumps(build)  # the paths are data (variables), not the plays' text
    with pytest.raises(
        HeadSplitLaunchError, match="checkpoint: model smollm2-135m is measured on its trained"
    ):
        action.plan(validate_inputs(action, {"model": "smollm2-135m"}))
    with pytest.raises(HeadSplitLaunchError, match="sha256: checkpoint and sha256 go together"):
        action.plan(validate_inputs(action, {"model": "gpt2-tiny", "checkpoint": "x"}))


# -- real checkpoints: a Hugging Face directory, per-worker shards (issue 13, item 2) ----------------

LLAMA_CONFIG = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
                "num_hidden_layers": 2, "intermediate_size": 48, "vocab_size": 64,
                "max_position_embeddings": 64, "hidden_act": "silu"}  # fmt: skip


def _hf_dir(tmp_path: Path, **change: Any) -> Path:
    d = tmp_path / "tiny-llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**LLAMA_CONFIG, **change}))
    (d / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    return d


def test_a_directory_checkpoint_gives_the_model_from_its_config_json(headsplit: Any, tmp_path: Path) -> None:
    d = _hf_dir(tmp_path)
    block = {
        "name": "headsplit",
        "workers": ["device1", "device2"],
        "checkpoint": {"path": str(d), "sha256": "d" * 64},
    }
    config = json.loads(
        launch_vars(headsplit, context(block), HOSTS)["edgeserver"]["main"][0]["files"]["headsplit.json"]
    )
    assert config["model"]["config"]["family"] == "llama" and config["model"]["config"]["n_kv_heads"] == 2
    assert config["checkpoint"]["path"] == f"/var/lib/dit/headsplit/files/{'d' * 64}/tiny-llama"
    assert "placement" not in config


def test_a_directory_config_headsplit_cannot_run_is_refused_at_launch(headsplit: Any, tmp_path: Path) -> None:
    d = _hf_dir(tmp_path, rope_scaling={"type": "dynamic", "factor": 2.0})
    block = {"name": "headsplit", "checkpoint": {"path": str(d), "sha256": "d" * 64}}
    with pytest.raises(
        HeadSplitLaunchError, match=r"runtime\.checkpoint\.path: .*config\.json: rope_scaling"
    ):
        launch_vars(headsplit, context(block), HOSTS)


def _shards(tmp_path: Path, pin: str, workers: int = 2) -> Path:
    out = tmp_path / "shards"
    out.mkdir()
    files = {"controller": {"file": "controller.safetensors", "sha256": "0" * 64, "units": []}}
    for r in range(1, workers + 1):
        files[f"worker{r}"] = {
            "file": f"worker{r}.safetensors",
            "sha256": f"{r}" * 64,
            "units": [f"L0.head{r}"],
        }
    doc = {"checkpoint_sha256": pin, "model": {**PRESETS["gpt2-tiny"].to_json(), "name": "hf-x"},
           "placement": {"L0.head1": "worker1", "L0.head2": "worker2"}, "files": files}  # fmt: skip
    (out / "shards.json").write_text(json.dumps(doc))
    return out


def test_shards_give_each_worker_its_own_file_and_the_run_their_placement(
    headsplit: Any, tmp_path: Path
) -> None:
    pin = "e" * 64
    out = _shards(tmp_path, pin)
    block = {"name": "headsplit", "workers": ["device2", "device1"],
             "checkpoint": {"path": "/models/x", "sha256": pin, "shards": str(out)}}  # fmt: skip
    specs = launch_vars(headsplit, context(block), HOSTS)
    config = json.loads(specs["edgeserver"]["main"][0]["files"]["headsplit.json"])
    base = f"/var/lib/dit/headsplit/files/{pin}/shards"
    assert config["checkpoint"] == {
        "path": f"{base}/controller.safetensors", "sha256": "0" * 64,
        "shards": {"worker1": {"path": f"{base}/worker1.safetensors", "sha256": "1" * 64},
                   "worker2": {"path": f"{base}/worker2.safetensors", "sha256": "2" * 64}},
    }  # fmt: skip
    assert config["placement"] == {"L0.head1": "worker1", "L0.head2": "worker2"}
    assert config["model"]["config"]["name"] == "hf-x"
    # shards cut from another checkpoint, or for another number of workers, are refused naming the field
    block["checkpoint"]["sha256"] = "f" * 64  # type: ignore[index]
    with pytest.raises(
        HeadSplitLaunchError, match=r"runtime\.checkpoint\.shards: .* was cut from checkpoint e"
    ):
        launch_vars(headsplit, context(block), HOSTS)
    block["checkpoint"]["sha256"] = pin  # type: ignore[index]
    block["workers"] = ["device1"]
    with pytest.raises(HeadSplitLaunchError, match="holds shards for 2 workers, the run has 1"):
        launch_vars(headsplit, context(block), HOSTS)
    pytest.importorskip("torch")  # the controller's side: each worker is sent its own shard
    from headsplit.controller import parse_config, worker_checkpoint

    rc = parse_config(config)
    assert worker_checkpoint(rc.checkpoint, "worker2") == {
        "path": f"{base}/worker2.safetensors",
        "sha256": "2" * 64,
    }


def test_distribute_checkpoint_placement_mode_cuts_here_and_verifies_each_shard_on_its_node(
    headsplit: Any, tmp_path: Path
) -> None:
    action = action_of(headsplit, "distribute-checkpoint")
    d = _hf_dir(tmp_path)
    inputs = validate_inputs(action, {"path": str(d), "sha256": "a" * 64, "mode": "placement",
                                      "workers": ["device2", "device1"], "strategy": "roundrobin",
                                      "out": str(tmp_path / "out")})  # fmt: skip
    plan = action.plan(inputs)
    (play,) = plan.plays  # type: ignore[misc]
    here, cut, mkdir, copy_, verify = play["tasks"]
    assert here["delegate_to"] == cut["delegate_to"] == "localhost"
    assert [_rendered(plan, a, inputs) for a in here["ansible.builtin.command"]["argv"][1:]] == [
        "-m", "headsplit.checkpoint", str(d), "--sha256", "a" * 64]  # fmt: skip
    argv = cut["ansible.builtin.command"]["argv"]
    assert argv[1:3] == ["-m", "headsplit.shard"] and argv[argv.index("--workers") + 1] == "2"
    assert argv[argv.index("--strategy") + 1] == "roundrobin"
    assert _rendered(plan, argv[argv.index("--out") + 1]) == str(tmp_path / "out")
    assert plan.extravars["hs_workers"] == ["device2", "device1"]
    assert "hs_workers.index(inventory_hostname) + 1" in copy_["ansible.builtin.copy"]["src"]
    assert "shards.json" in copy_["ansible.builtin.copy"]["src"] and copy_["when"] == mkdir["when"]
    node = verify["ansible.builtin.command"]["argv"]
    assert node[1:3] == ["-m", "headsplit.checkpoint"] and ".sha256 }}" in node[-1]
    with pytest.raises(HeadSplitLaunchError, match="workers: mode placement needs"):
        action.plan(validate_inputs(action, {"path": str(d), "sha256": "a" * 64, "mode": "placement"}))


def test_distribute_checkpoint_sends_a_directory_with_its_manifest(headsplit: Any, tmp_path: Path) -> None:
    from headsplit import checkpoint

    action = action_of(headsplit, "distribute-checkpoint")
    d = _hf_dir(tmp_path)
    plan = action.plan(validate_inputs(action, {"path": str(d), "sha256": "a" * 64}))
    (play,) = plan.plays  # type: ignore[misc]
    sums = next(t for t in play["tasks"] if "SHA256SUMS" in t["name"])["ansible.builtin.copy"]
    assert _rendered(plan, sums["content"]) == checkpoint.manifest_text(checkpoint.manifest(d))
    assert _rendered(plan, sums["dest"]).endswith("/tiny-llama/SHA256SUMS")
    verify = play["tasks"][-1]["ansible.builtin.command"]["argv"][-3:-1]
    assert [_rendered(plan, a, {"sha256": "a" * 64}) for a in verify] == [
        f"/var/lib/dit/headsplit/files/{'a' * 64}/tiny-llama", "--sha256"]  # fmt: skip


def test_the_trained_smollm2_preset_needs_its_converted_checkpoint(headsplit: Any) -> None:
    """(issue 32) model: smollm2-135m is the trained model: without a checkpoint its weights would be
    seeded noise, so the launch refuses, saying which directory to give."""
    assert PRESETS["smollm2-135m"].rope_theta == 100000.0 and PRESETS["smollm2-135m"].n_kv_heads == 3
    block = {"name": "headsplit", "model": "smollm2-135m", "workers": ["device1", "device2"]}
    with pytest.raises(
        HeadSplitLaunchError,
        match=r"runtime\.checkpoint: model smollm2-135m .*dit\.models\.convert smollm2-135m",
    ):
        launch_vars(headsplit, context(block), HOSTS)


def test_the_controller_takes_the_prompt_in_the_models_own_tokens() -> None:
    pytest.importorskip("torch")
    from headsplit.controller import ConfigError, parse_config

    config: dict[str, Any] = {
        "model": {"preset": "gpt2-tiny"}, "checkpoint": None,
        "controller": {"host": "edgeserver", "address": "10.0.0.1", "port": 29600},
        "workers": [{"rank": 1, "name": "worker1", "host": "device1", "address": "10.0.0.11",
                     "memory_limit_bytes": 0}],
        "strategy": "greedy", "speculation": False, "tau": 0.0, "speculation_profile": None, "tokens": 4,
        "prompt": "ignored when prompt_ids are given", "prompt_ids": [1, 2, 511],
    }  # fmt: skip
    assert parse_config(config).prompt_ids == (1, 2, 511)
    config["prompt_ids"] = None
    assert parse_config(config).prompt_ids is None
    for bad in ([], [512], [-1], ["a"], [True]):
        config["prompt_ids"] = bad
        with pytest.raises(ConfigError, match=r"prompt_ids: .* token ids in 0\.\.511"):
            parse_config(config)


# -- perplexity of a held-out paragraph (issue 32, item 6) --------------------------------------------


def _controller_config(headsplit: Any, block: dict[str, Any]) -> dict[str, Any]:
    specs = launch_vars(headsplit, context({"name": "headsplit", "workers": ["device1"], **block}), HOSTS)
    config: dict[str, Any] = json.loads(specs["edgeserver"]["main"][0]["files"]["headsplit.json"])
    return config


def test_perplexity_sends_the_held_out_paragraph_or_the_one_named(
    headsplit: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``perplexity: true``: the held-out paragraph (not in the speculation corpus) goes to the
    controller as text, byte-level for the seeded presets, in the model's own tokens (tokenized here)
    for the trained one; ``perplexity_paragraph`` names another file; a bad one is named at validate."""
    from headsplit.plugin import common, launch

    held_out = common.HELD_OUT.read_text(encoding="utf-8").strip()
    assert held_out not in (SRC / "headsplit" / "data" / "corpus.txt").read_text(encoding="utf-8")
    assert _controller_config(headsplit, {"perplexity": True})["perplexity"] == {
        "text": held_out,
        "ids": None,
    }
    own = tmp_path / "paragraph.txt"
    own.write_text("  Another paragraph.\n", encoding="utf-8")
    config = _controller_config(headsplit, {"perplexity": True, "perplexity_paragraph": str(own)})
    assert config["perplexity"] == {"text": "Another paragraph.", "ids": None}
    assert (
        messages(doc(runtime={"name": "headsplit", "perplexity": True, "perplexity_paragraph": str(own)}))
        == []
    )
    own.write_bytes(b"\xff\xfe not text")
    (got,) = messages(
        doc(runtime={"name": "headsplit", "perplexity": True, "perplexity_paragraph": str(own)})
    )
    assert got.startswith(f"runtime.perplexity_paragraph: {own}: not UTF-8 text"), got
    with pytest.raises(HeadSplitLaunchError, match=r"runtime\.perplexity_paragraph: .*not UTF-8 text"):
        _controller_config(headsplit, {"perplexity": True, "perplexity_paragraph": str(own)})
    # the trained model: its own tokens (the tokenizer stubbed; the real one is the slow test's)
    seen: list[str] = []
    monkeypatch.setattr(launch, "model_tokens", lambda model, text: seen.append(text) or (4, 5, 6))
    block = {
        "model": "smollm2-135m",
        "perplexity": True,
        "checkpoint": {"path": "/m/smollm2", "sha256": "a" * 64},
    }
    monkeypatch.setattr(launch, "model_doc", lambda block, n: {"preset": "smollm2-135m"})
    assert _controller_config(headsplit, block)["perplexity"] == {"text": held_out, "ids": [4, 5, 6]}
    assert held_out in seen


# -- placement costs from a profile run (issue 35, item 3) ------------------------------------------


def test_placement_profile_is_checked_at_validate_naming_the_path(headsplit: Any, tmp_path: Path) -> None:
    """The profile run must hold costs of every worker's device and of no other device; a directory
    that is no profile run is named with the file it lacks."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from profile_run import write_profile_run

    run = write_profile_run(tmp_path / "profile", {"device1": 3.0, "device2": 1.0})
    good = {"name": "headsplit", "workers": ["device1", "device2"], "placement_profile": str(run)}
    assert messages(doc(runtime=good)) == []
    assert messages(doc(runtime={**good, "workers": ["device1"]})) == [
        f"runtime.placement_profile: {run} profiles device2, not a worker of this run (workers: device1); "
        "profile the run's workers"
    ]
    # absent workers: every device, and device3 was not profiled
    assert messages(doc(runtime={"name": "headsplit", "placement_profile": str(run)})) == [
        f"runtime.placement_profile: {run} has no profile of device3 (profiled: device1, device2)"
    ]
    assert messages(doc(runtime={**good, "placement_profile": str(tmp_path)})) == [
        f"runtime.placement_profile: {tmp_path / 'aggregate' / 'heads.csv'}: missing; a profile run is a run "
        "of the layers runtime with runtime.tokens on a decoder model (its per-head, projection and FFN "
        "times per device)"
    ]
    with pytest.raises(
        HeadSplitLaunchError, match=r"runtime\.placement_profile: .* profiles device2, not a worker"
    ):
        headsplit.launch(context({**good, "workers": ["device1"]}))


def test_placement_profile_reaches_the_controller_as_a_file(headsplit: Any, tmp_path: Path) -> None:
    """The profile run is read here and its costs travel as placement-costs.json beside the controller's
    config, which names it; the workers are not sent it. A path that looks like a template stays data."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from profile_run import write_profile_run

    from headsplit.profile_costs import costs_document, read_profile

    run = write_profile_run(tmp_path / "{{ lookup('pipe', 'id') }}", {"device1": 3.0, "device2": 1.0})
    block = {"name": "headsplit", "workers": ["device2", "device1"], "placement_profile": str(run)}
    specs = launch_vars(headsplit, context(block), HOSTS)
    (controller,) = specs["edgeserver"]["main"]
    assert set(controller["files"]) == {"headsplit.json", "placement-costs.json"}
    assert json.loads(controller["files"]["headsplit.json"])["placement_profile"] == "placement-costs.json"
    shipped = json.loads(controller["files"]["placement-costs.json"])
    assert shipped == costs_document(read_profile(run), ["device2", "device1"])
    assert shipped["source"]["path"] == str(run)
    for device in ("device1", "device2"):
        (worker,) = specs[device]["background"]
        assert set(worker["files"]) == {"headsplit.json"}
        assert json.loads(worker["files"]["headsplit.json"])["placement_profile"] is None


def test_validate_refuses_a_worker_whose_peak_passes_its_memory_limit(headsplit: Any) -> None:
    """TinyLlama layer-wise on 4 devices of 1024 MiB: 6 layers (1060 MB of units) fit the placement's
    count, but not with the worker process and its set-up margin; the message names worker, need, limit."""
    block = {"name": "headsplit", "model": "tinyllama", "strategy": "layerwise", "tokens": 16}
    devices = ["device1", "device2", "device3", "device4"]
    tight = doc(devices=devices, runtime=block, hardware={d: {"memory_limit_mb": 1024} for d in devices})
    got = messages(tight)
    assert got[0] == (
        "runtime.model: tinyllama layerwise on 4 workers: worker1 (device1) needs 1443 MB at its peak "
        "(units 1060 MB + set-up margin 63 MB + process 320 MB), hardware.device1.memory_limit_mb is 1024: "
        "raise it to at least 1377 or place the model on more workers"
    )
    assert [m.split(" needs")[0].rsplit(": ", 1)[1] for m in got] == [
        f"worker{r} (device{r})" for r in (1, 2, 3, 4)
    ]
    roomy = doc(devices=devices, runtime=block, hardware={d: {"memory_limit_mb": 1536} for d in devices})
    assert messages(roomy) == []
