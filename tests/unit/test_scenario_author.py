"""A scenario may only name files its author could read (issue 46, item 5).

dit runs as root: it could read ``perplexity_paragraph: /root/<0600 file>`` for anyone and the run would
copy it to the nodes. A path input (``x-readable`` in the schema) is held to the read permission of the
scenario file's owner. The permission checks run with made-up authors (any user can run them); the
ones through ``dit validate`` give the scenario file to ``nobody`` and need root.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dit.cli import app
from dit.runtime_api import registry
from dit.scenario import author, validate
from dit.scenario.author import Author, problem

ME = os.getuid()
OTHER = Author(ME + 4242, frozenset(), "someone (the owner of the scenario file)")
ROOT = Author(0, frozenset({0}), "root (the owner of the scenario file)")


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A directory every user may enter, parents included (pytest's own is its user's alone, which
    would refuse everything below it for any other author)."""
    made = Path(tempfile.mkdtemp(prefix="dit-author-"))
    made.chmod(0o755)
    if any(not p.stat().st_mode & stat.S_IXOTH for p in made.parents):
        shutil.rmtree(made)
        pytest.skip(f"{made.parent}: not every user may enter it")
    yield made
    for below in (made, *made.rglob("*")):  # the tests take away permissions that rmtree needs
        if below.is_dir() and not below.is_symlink():
            below.chmod(0o755)
    shutil.rmtree(made)


def put(path: Path, mode: int, text: str = "A paragraph, long enough to score.\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)
    return path


def test_a_file_only_its_owner_may_read_is_refused_naming_it_and_its_mode(tmp_path: Path) -> None:
    secret = put(tmp_path / "secret.txt", 0o600)
    found = problem(str(secret), ["."], OTHER)
    assert found is not None
    assert found.startswith(
        f"{secret}: someone (the owner of the scenario file) cannot read it ({secret} is -rw-------"
    )
    assert found.endswith("name a file the scenario's author can read")
    secret.chmod(0o644)
    assert problem(str(secret), ["."], OTHER) is None


def test_root_reads_everything_and_a_missing_file_is_left_to_what_reads_it(tmp_path: Path) -> None:
    secret = put(tmp_path / "secret.txt", 0o600)
    assert problem(str(secret), ["."], ROOT) is None
    assert problem(str(tmp_path / "no-such.txt"), ["."], OTHER) is None


def test_a_readable_file_in_a_directory_its_author_cannot_enter_is_refused_naming_the_directory(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    inside = put(home / "paragraph.txt", 0o644)
    home.chmod(0o700)
    try:
        found = problem(str(inside), ["."], OTHER)
        assert found is not None and f"({home} is drwx------" in found, found
        # a link from an open directory leads there all the same
        link = tmp_path / "open" / "link.txt"
        link.parent.mkdir()
        link.symlink_to(inside)
        found = problem(str(link), ["."], OTHER)
        assert found is not None and f"({home} is drwx------" in found, found
    finally:
        home.chmod(0o755)


def test_group_read_counts_for_the_author_s_groups(tmp_path: Path) -> None:
    shared = put(tmp_path / "shared.txt", 0o640)
    member = Author(ME + 4242, frozenset({shared.stat().st_gid}), "a member")
    assert problem(str(shared), ["."], member) is None
    assert problem(str(shared), ["."], OTHER) is not None


def test_a_tree_is_read_whole_and_a_named_file_alone(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    put(checkpoint / "config.json", 0o644)
    put(checkpoint / "sub" / "model.safetensors", 0o644)
    assert problem(str(checkpoint), ["**"], OTHER) is None
    (checkpoint / "sub" / "model.safetensors").chmod(0o600)
    found = problem(str(checkpoint), ["**"], OTHER)
    assert found is not None and f"({checkpoint / 'sub' / 'model.safetensors'} is -rw-------" in found, found
    # a profile run: only its heads.csv is read, whatever else its directory holds
    run = tmp_path / "run"
    put(run / "aggregate" / "heads.csv", 0o644)
    put(run / "ansible" / "env" / "extravars", 0o600)
    assert problem(str(run), ["aggregate/heads.csv"], OTHER) is None
    (run / "aggregate" / "heads.csv").chmod(0o600)
    assert problem(str(run), ["aggregate/heads.csv"], OTHER) is not None


def status(mode: int, uid: int = 1000, gid: int = 1000) -> os.stat_result:
    return os.stat_result((stat.S_IFREG | mode, 1, 1, 1, uid, gid, 0, 0, 0, 0))


def test_the_author_of_a_file_others_may_write_is_anyone_who_may(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert Author.of_stat(status(0o644)).uid == 1000
    monkeypatch.setattr(author, "_members", lambda gid: {1000})  # a user-private group adds no writer
    assert Author.of_stat(status(0o664)).uid == 1000
    monkeypatch.setattr(author, "_members", lambda gid: {1000, 1001})
    group = Author.of_stat(status(0o664))
    assert group.uid is None and group.gids == {1000}
    anyone = Author.of_stat(status(0o646))
    assert anyone.uid is None and not anyone.gids and "writable by others" in anyone.who
    mine = put(tmp_path / "mine.txt", 0o600)
    found = problem(str(mine), ["."], anyone)
    assert found is not None and found.endswith("let only its owner write the scenario file"), found


# -- through validation: every path input of HeadSplit's block --------------------------------------


@pytest.fixture
def headsplit() -> Any:
    if "headsplit" not in registry.installed():
        pytest.skip("headsplit is not installed (./dev setup installs runtimes/headsplit)")
    return registry.get("headsplit")


def doc(**block: Any) -> dict[str, Any]:
    return {
        "name": "hs",
        "devices": ["device1", "device2"],
        "inference": {"enabled": False},
        "runtime": {"name": "headsplit", **block},
    }


def messages(raw: dict[str, Any], author: Author) -> list[str]:
    return [str(e) for e in validate(raw, author)]


def test_every_path_input_of_headsplit_is_held_to_its_author(headsplit: Any, tmp_path: Path) -> None:
    secret = put(tmp_path / "secret.txt", 0o600)
    profile = tmp_path / "profile-run"
    put(profile / "aggregate" / "heads.csv", 0o600, "host,unit,token,latency_ns,ops\n")
    checkpoint = tmp_path / "ck"
    put(checkpoint / "model.safetensors", 0o600)
    cases = [
        ({"perplexity": True, "perplexity_paragraph": str(secret)}, "runtime.perplexity_paragraph"),
        ({"speculation_profile": str(secret)}, "runtime.speculation_profile"),
        ({"placement_profile": str(profile)}, "runtime.placement_profile"),
        ({"checkpoint": {"path": str(checkpoint), "sha256": "a" * 64}}, "runtime.checkpoint.path"),
        (
            {"checkpoint": {"path": str(tmp_path), "sha256": "a" * 64, "shards": str(checkpoint)}},
            "runtime.checkpoint.shards",
        ),
    ]
    for block, field in cases:
        found = messages(doc(**block), OTHER)
        assert any(m.startswith(f"{field}: ") and "cannot read it" in m for m in found), (field, found)
    # the same scenario of root's is valid (its paragraph stays root's: shipped 0600, test_shipped_modes)
    assert messages(doc(perplexity=True, perplexity_paragraph=str(secret)), ROOT) == []


def test_a_refused_file_is_not_read_by_the_runtime_s_own_check(headsplit: Any, tmp_path: Path) -> None:
    # the runtime's check reads the paragraph as root and would quote what is wrong with it
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"\xff\xfe root's bytes")
    secret.chmod(0o600)
    (found,) = messages(doc(perplexity=True, perplexity_paragraph=str(secret)), OTHER)
    assert "cannot read it" in found and "UTF-8" not in found


def test_a_sweep_value_naming_a_file_its_author_cannot_read_is_named(headsplit: Any, tmp_path: Path) -> None:
    open_file = put(tmp_path / "open.txt", 0o644)
    secret = put(tmp_path / "secret.txt", 0o600)
    raw = {
        **doc(perplexity=True),
        "sweep": {"path": "runtime.perplexity_paragraph", "values": [str(open_file), str(secret)]},
    }
    (found,) = messages(raw, OTHER)
    assert found.startswith(f"sweep.values[1]: runtime.perplexity_paragraph='{secret}': {secret}: someone"), (
        found
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="gives the scenario file to nobody: needs root")
def test_dit_validate_refuses_nobody_s_scenario_naming_root_s_file(headsplit: Any, tmp_path: Path) -> None:
    """The issue's reproduction: root runs a scenario file another user wrote."""
    secret = put(tmp_path / "secret.txt", 0o600)
    scenario = tmp_path / "hs.yaml"
    scenario.write_text(
        "name: hs\ndevices: [device1, device2]\ninference: {enabled: false}\n"
        f"runtime: {{name: headsplit, perplexity: true, perplexity_paragraph: '{secret}'}}\n",
        encoding="utf-8",
    )
    scenario.chmod(0o644)
    os.chown(scenario, 65534, 65534)
    result = CliRunner().invoke(app, ["validate", str(scenario)])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert (
        f"{scenario}: runtime.perplexity_paragraph: {secret}: nobody (the owner of the scenario file) cannot "
        f"read it ({secret} is -rw------- root:" in said
    ), said
    assert "Traceback" not in result.output
    # root's own scenario may name root's file
    os.chown(scenario, 0, 0)
    assert CliRunner().invoke(app, ["validate", str(scenario)]).exit_code == 0
    # ... unless anyone may have written it
    scenario.chmod(0o666)
    assert stat.S_IMODE(scenario.stat().st_mode) == 0o666
    refused = CliRunner().invoke(app, ["validate", str(scenario)])
    assert refused.exit_code == 2 and "any user (the scenario file is writable by others)" in refused.output
