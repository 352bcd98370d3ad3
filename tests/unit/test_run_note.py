"""A note on each run (issue 36 item 11): a lab notebook entry in note.md, shown by dit show, dit note,
the report, the comparison and NNPM."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dit.cli import app
from dit.report.build import build_report
from dit.report.compare import load, side_by_side
from dit.run.rundir import NOTE_MAX_CHARS, RunDir
from dit.units import MISSING
from tests.report_fixtures import report_run


def test_a_note_is_written_read_and_removed(tmp_path: Path) -> None:
    run = RunDir(report_run(tmp_path / "run"))
    assert run.note() == ""
    run.set_note("thermal throttling from round 3: fan unplugged")
    assert run.note() == "thermal throttling from round 3: fan unplugged\n"
    run.set_note("  \n")  # blank: removed, not kept as whitespace
    assert not (run.path / "note.md").exists() and run.note() == ""
    with pytest.raises(ValueError, match=f"at most {NOTE_MAX_CHARS}"):
        run.set_note("x" * (NOTE_MAX_CHARS + 1))
    with pytest.raises(ValueError, match="NUL"):
        run.set_note("a\x00b")
    assert not list(run.path.glob("note.md*"))  # nothing half-written left behind


def test_dit_note_sets_prints_and_dit_show_and_the_report_show_it(tmp_path: Path) -> None:
    path = report_run(tmp_path / "run")
    cli = CliRunner()
    assert cli.invoke(app, ["note", str(path), "<b>fan</b> unplugged"]).exit_code == 0
    printed = cli.invoke(app, ["note", str(path)])
    assert printed.exit_code == 0 and printed.output.strip() == "<b>fan</b> unplugged"
    assert "note: <b>fan</b> unplugged" in cli.invoke(app, ["show", str(path)]).output
    html = build_report(path)
    assert "<td>note</td><td>&lt;b&gt;fan&lt;/b&gt; unplugged</td>" in html  # text, never markup
    assert cli.invoke(app, ["note", str(path), "-"], input="from stdin\n").exit_code == 0
    assert RunDir(path).note() == "from stdin\n"
    refused = cli.invoke(app, ["note", str(tmp_path), "x"])
    assert refused.exit_code != 0 and "is not a dit run directory" in refused.output


def test_the_comparison_shows_each_runs_note(tmp_path: Path) -> None:
    a, b = report_run(tmp_path / "a"), report_run(tmp_path / "b")
    RunDir(a).set_note("baseline")
    rows = {row[0]: row[1:] for row in side_by_side(load([a, b]))}
    assert rows["note"] == ("baseline", MISSING)
