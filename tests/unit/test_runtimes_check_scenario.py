"""``dit runtimes check --scenario`` reads a scenario as ``dit validate`` and ``dit run`` do: one loader,
dit.commands.common.load_scenarios, so a bad file's errors read the same under every command (issue 50)."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from dit.cli import app


@pytest.mark.parametrize("text", ["name: bad\nmodel: fake\ndevices: []\nrepetitions: -1\n", None])
def test_a_bad_scenario_reads_the_same_under_validate_and_runtimes_check(
    tmp_path: Path, text: str | None
) -> None:
    path = tmp_path / "bad.yaml"
    if text is not None:
        path.write_text(text, encoding="utf-8")
    runner = CliRunner()
    validate = runner.invoke(app, ["validate", str(path)])
    check = runner.invoke(app, ["runtimes", "check", "--scenario", str(path)])
    assert (validate.exit_code, check.exit_code) == (2, 2)
    assert str(path) in check.output
    assert check.output == validate.output


def test_runtimes_check_loads_through_the_commands_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dit.commands.common
    import dit.runtime_ops.cli

    # the name dit runtimes calls is the commands' loader itself, not a copy of it
    assert dit.runtime_ops.cli.load_scenarios is dit.commands.common.load_scenarios
    asked: list[Path] = []

    def load_scenarios(path: Path) -> list[object]:
        asked.append(path)
        raise typer.Exit(2)

    monkeypatch.setattr(dit.runtime_ops.cli, "load_scenarios", load_scenarios)
    path = tmp_path / "any.yaml"
    result = CliRunner().invoke(app, ["runtimes", "check", "--scenario", str(path)])
    assert (result.exit_code, asked) == (2, [path])
