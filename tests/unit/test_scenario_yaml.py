"""Bounded, strict YAML reading."""

from __future__ import annotations

from pathlib import Path

import pytest

from dit.scenario import MAX_YAML_BYTES, ScenarioError, load_yaml, loads


def refused(source: str | bytes | Path) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        load_yaml(source)
    return [str(e) for e in info.value.errors]


def test_reads_text_and_paths(tmp_path: Path) -> None:
    text = "name: t\nmodel: fake\ndevices: [d1]\n"
    f = tmp_path / "s.yaml"
    f.write_text(text, encoding="utf-8")
    assert (
        load_yaml(text)
        == load_yaml(text.encode())
        == load_yaml(f)
        == {
            "name": "t",
            "model": "fake",
            "devices": ["d1"],
        }
    )


def test_billion_laughs_is_refused_quickly() -> None:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i, (prev, cur) in enumerate(zip("abcdefgh", "bcdefghi", strict=True)):
        lines.append(f"{cur}: &{cur} [{', '.join(['*' + prev] * 9)}]")
        assert i < 9
    assert refused("\n".join(lines)) == [
        "the document expands to more than 10000 nodes (aliases included); refusing it (an alias bomb?)"
    ]


def test_moderate_aliases_are_fine() -> None:
    doc = load_yaml("base: &b {mode: light}\nload:\n  d1: *b\n  d2: {<<: *b, cpu_pct: 15}\n")
    assert doc["load"] == {"d1": {"mode": "light"}, "d2": {"mode": "light", "cpu_pct": 15}}


def test_recursive_alias_is_refused() -> None:
    (message,) = refused("a: &x [1, *x]\n")
    assert message.startswith("a[1]: recursive alias at line 1")


def test_more_than_one_mebibyte_is_refused(tmp_path: Path) -> None:
    big = "name: t\n" + "#" * MAX_YAML_BYTES + "\n"
    assert refused(big) == [f"the scenario is {len(big)} bytes; the limit is 1048576 bytes (1 MiB)"]
    f = tmp_path / "big.yaml"
    f.write_text(big, encoding="utf-8")
    assert refused(f) == ["the scenario is more than 1 MiB; the limit is 1048576 bytes (1 MiB)"]


def test_duplicate_keys_are_refused_naming_the_path() -> None:
    assert refused("name: t\nmodel: fake\nname: u\n") == ["name: duplicate key 'name' (lines 1 and 3)"]
    text = "name: t\nload:\n  d1: {mode: light}\n  d2:\n    mode: heavy\n    mode: light\n"
    assert refused(text) == ["load.d2.mode: duplicate key 'mode' (lines 5 and 6)"]
    assert refused("devices: [d1]\nx: [{a: 1, a: 2}]\n") == ["x[0].a: duplicate key 'a' (lines 2 and 2)"]


def test_top_level_must_be_a_mapping() -> None:
    assert refused("- a\n- b\n") == ["the top level must be a mapping, got a list"]
    assert refused("scenarios/quickstart.yaml") == [
        "the top level must be a mapping, got a string (to read a file, pass a pathlib.Path)"
    ]
    assert refused("") == ["the scenario is empty"]
    assert refused("# only a comment\n") == ["the scenario is empty"]


def test_syntax_errors_name_the_line() -> None:
    (message,) = refused("name: t\ndevices: [d1\n")
    assert message.startswith("YAML: line 3, column 1:")


def test_more_than_one_document_is_refused() -> None:
    (message,) = refused("name: a\n---\nname: b\n")
    assert (
        message
        == "YAML: line 2, column 1: expected a single document in the stream, but found another document"
    )


def test_unsafe_tags_are_refused() -> None:
    (message,) = refused("name: !!python/object/apply:os.system ['true']\n")
    assert "could not determine a constructor" in message


def test_exponent_floats_and_timestamps() -> None:
    doc = load_yaml("a: 1e-5\nb: -2E3\nc: 1.5\nd: 10\ne: 2024-01-01\nf: 2024-01-01T10:00:00Z\n")
    assert doc == {"a": 1e-5, "b": -2000.0, "c": 1.5, "d": 10, "e": "2024-01-01", "f": "2024-01-01T10:00:00Z"}


def test_deep_nesting_is_refused() -> None:
    (message,) = refused("a: " + "[" * 100 + "]" * 100 + "\n")
    assert "nested more than 64 levels deep" in message


def test_not_utf8_is_refused() -> None:
    assert refused(b"name: \xff\n") == ["the scenario is not UTF-8 (byte 6)"]


def test_loads_goes_all_the_way() -> None:
    (s,) = loads("name: t\nmodel: fake\ndevices: [d1]\ninference: {partition_points: [0]}\n")
    assert s.inference.vectors == ((0,),)
