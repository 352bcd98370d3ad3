"""Token generation of the built-in runtime (``runtime: {tokens: N}``): the scenario field, the device
agent's configuration, and the results parser on hand-written raw files (no torch)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from dit.analysis.monitors import ENERGY_COLUMNS, aggregate_monitors, generation_energy_rows
from dit.analysis.run import AggregateError, LoadedRun
from dit.analysis.tokens import aggregate_tokens, headwise_ratio
from dit.run.launch import launch_vars
from dit.runtimes import LaunchContext
from dit.runtimes.layers import LayersRuntime, token_results
from dit.scenario import ScenarioError, loads, resolve

HEADS = """rep,token,layer,unit,head,latency_ns,ops,kv_len
0,0,0,head,0,400,10,4
0,0,0,head,1,600,10,4
0,0,0,projection,-1,300,5,4
0,0,0,attention,-1,1000,25,4
0,1,0,head,0,100,10,5
0,1,0,head,1,140,10,5
0,1,0,head_proj,0,20,2,5
0,1,0,head_proj,1,20,2,5
0,1,0,projection,-1,60,5,5
0,1,0,attention,-1,200,25,5
0,1,0,ffn,-1,500,40,5
0,1,0,layer,-1,900,70,5
0,1,1,stage,-1,1200,70,0
"""
# two repetitions of three tokens, device-origin times; the generation runs 1_000_000..1_900_000 and
# 3_000_000..3_600_000 ns
TOKENS = """rep,token,start_ns,latency_ns,kv_len
0,0,1000000,500000,4
0,1,1500000,200000,5
0,2,1700000,200000,6
1,0,3000000,300000,4
1,1,3300000,100000,5
1,2,3400000,200000,6
"""


def write_run(path: Path, devices: tuple[str, ...] = ("device1", "device2")) -> LoadedRun:
    doc = {
        "name": "gen",
        "model": "gpt2",
        "devices": list(devices),
        "runtime": {"name": "layers", "tokens": 3},
    }
    path.mkdir(parents=True)
    (path / "scenario.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    for device in devices:
        raw = path / "raw" / device
        raw.mkdir(parents=True)
        (raw / f"{device}_heads.csv").write_text(HEADS, encoding="utf-8")
        (raw / f"{device}_tokens.csv").write_text(TOKENS, encoding="utf-8")
        origin = {
            "host": device,
            "start_at_ns": 10**18,
            "origin_wall_ns": 10**18,
            "origin_mono_ns": 5_000_000,
        }
        (raw / f"{device}_origin.json").write_text(json.dumps(origin), encoding="utf-8")
    # device1 has a power trace: a constant 2 W from mono 5 ms to 10 ms (device-origin 0..5 ms)
    power = "t_mono_ns,current_a,voltage_v,power_w\n" + "".join(
        f"{5_000_000 + i * 500_000},0.4,5.0,2.0\n" for i in range(11)
    )
    (path / "raw" / "device1" / "device1_power.csv").write_text(power, encoding="utf-8")
    return LoadedRun(path)


def read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_the_parser_writes_heads_and_tokens_with_a_host_column(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    found = aggregate_tokens(run)
    assert found is not None
    heads = read(run.aggregate_dir / "heads.csv")
    assert list(heads[0]) == ["host", "rep", "token", "layer", "unit", "head", "latency_ns", "ops", "kv_len"]
    assert len(heads) == 2 * 13 and {h["host"] for h in heads} == {"device1", "device2"}
    assert heads[4] == {"host": "device1", "rep": "0", "token": "1", "layer": "0", "unit": "head", "head": "0",
                        "latency_ns": "100", "ops": "10", "kv_len": "5"}  # fmt: skip
    tokens = read(run.aggregate_dir / "tokens.csv")
    assert list(tokens[0]) == ["host", "token", "latency_ns", "kv_len"]
    assert [(t["host"], t["token"], t["latency_ns"], t["kv_len"]) for t in tokens[:3]] == [
        ("device1", "0", "400000", "4"),  # mean over the two repetitions
        ("device1", "1", "150000", "5"),
        ("device1", "2", "200000", "6"),
    ]
    assert found.tokens == 3
    assert found.token_latency_mean_ns == pytest.approx(1_500_000 / 6)
    assert found.tokens_per_s == pytest.approx(1e9 / (1_500_000 / 6))
    # decode tokens only: (100 + 140 heads + 60 projection) / 200 attention; the prefill is left out
    assert found.headwise_ratio == pytest.approx(1.5)


def test_summary_values_and_energy_per_token(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    tables, values = token_results(run)
    assert [t.name for t in tables] == ["heads.csv", "tokens.csv"]
    by_name = {v.name: v for v in values}
    assert by_name["tokens"].value == 3 and by_name["tokens"].type == "int"
    assert by_name["token_latency_mean"].unit == "ns"
    assert by_name["tokens_per_s"].unit == "tokens/s"
    # 2 W over 0.9 ms and 0.6 ms for 3 tokens each: 0.6 mJ and 0.4 mJ per token, mean 0.5 mJ
    assert (
        by_name["energy_per_token"].value == pytest.approx(0.5e-3) and by_name["energy_per_token"].unit == "J"
    )
    rows = generation_energy_rows(run.path, "device1")
    assert rows is not None and list(rows.columns) == list(ENERGY_COLUMNS)
    assert rows["total_ns"].tolist() == [900_000, 600_000]
    assert rows["energy_j"].tolist() == pytest.approx([1.8e-3, 1.2e-3])
    assert rows["energy_per_token_j"].tolist() == pytest.approx([0.6e-3, 0.4e-3])
    assert generation_energy_rows(run.path, "device2") is None  # no power trace
    aggregate_monitors(run)
    energy = pd.read_csv(run.aggregate_dir / "energy.csv")
    assert len(energy) == 2 and energy["round"].isna().all() and (energy["tokens"] == 3).all()


def test_a_run_without_token_generation_writes_nothing_new(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    for device in run.devices:
        (run.path / "raw" / device / f"{device}_tokens.csv").unlink()
        (run.path / "raw" / device / f"{device}_heads.csv").unlink()
    assert token_results(run) == ((), ())
    assert not (run.aggregate_dir / "heads.csv").exists() and not (run.aggregate_dir / "tokens.csv").exists()
    assert generation_energy_rows(run.path, "device1") is None


def test_a_malformed_raw_file_names_itself_and_the_field(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", ("device1",))
    (run.path / "raw" / "device1" / "device1_heads.csv").write_text(
        HEADS.replace("0,1,0,ffn,-1,500", "0,1,0,ffn,-1,fast"), encoding="utf-8"
    )
    with pytest.raises(AggregateError, match=r"device1_heads.csv:12: latency_ns 'fast' is not an integer"):
        aggregate_tokens(run)


def test_headwise_ratio_without_decode_attention_is_none() -> None:
    assert headwise_ratio([{"token": 0, "unit": "attention", "latency_ns": 5}]) is None


# -- the scenario field and the agent's configuration ------------------------------------------------

BASE = "name: x\nmodel: {model}\ndevices: [device1]\ninference: {{enabled: false}}\noptimisation: {{enabled: false}}\n"


def test_tokens_is_a_field_of_the_layers_block_without_a_default() -> None:
    (plain,) = loads(BASE.format(model="gpt2") + "runtime: {name: layers}\n")
    assert plain.runtime == {"name": "layers"}  # no default inserted: the hash of today's scenarios stays
    (gen,) = loads(BASE.format(model="gpt2") + "runtime: {name: layers, tokens: 8}\n")
    assert gen.runtime == {"name": "layers", "tokens": 8}
    with pytest.raises(ScenarioError) as bad:
        loads(BASE.format(model="fake") + "runtime: {tokens: 8}\n")
    assert [str(e) for e in bad.value.errors] == [
        "runtime.tokens: token generation needs a decoder model (gpt2, tinyllama, hf_decoder, smollm2-135m), not 'fake'"
    ]
    with pytest.raises(ScenarioError) as negative:
        loads(BASE.format(model="gpt2") + "runtime: {tokens: -1}\n")
    assert negative.value.errors[0].path == "runtime.tokens"


def context(block: dict[str, Any]) -> LaunchContext:
    hosts = ("edge", "device1")
    (scenario,) = loads(BASE.format(model="gpt2"))
    return LaunchContext(
        run_id="r1",
        block=block,
        scenario=resolve(scenario.to_dict()),
        edge_host="edge",
        devices=("device1",),
        addresses={"edge": "10.0.0.1", "device1": "10.0.0.11"},
        node_roots={h: f"/var/lib/dit/r1/{h}" for h in hosts},
        pythons=dict.fromkeys(hosts, "/usr/bin/python3"),
        local=False,
        model={"name": "gpt2"},
        edge_port=5000,
    )


@pytest.mark.parametrize(("block", "expected"), [({"name": "layers"}, None), ({"name": "layers", "tokens": 0}, None),
                                                 ({"name": "layers", "tokens": 8}, 8)])  # fmt: skip
def test_the_agent_gets_tokens_only_when_there_are_some(block: dict[str, Any], expected: int | None) -> None:
    specs = launch_vars(LayersRuntime(), context(block), ("edge", "device1"))
    config = json.loads(specs["device1"]["main"][0]["files"]["profile.json"])
    assert config.get("tokens") == expected
