"""Every line from a node is shown with its control characters escaped (issue 46, item 4): the sanitiser,
and the console, ``run.log``, NNPM's terminal and the edge service's own output through it."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from dit.device.printable import printable, printable_lines
from dit.run.console import Reporter
from dit.web.services.terminal import read_lines

TITLE = "\x1b]2;pwned\x07"
CLEAR = "\x1b[2J"
HOSTILE = f"device{TITLE}{CLEAR}1"
SHOWN = "device\\x1b]2;pwned\\x07\\x1b[2J1"


def test_printable_escapes_every_control_but_tab() -> None:
    assert printable(HOSTILE) == SHOWN
    assert printable("a\tb") == "a\tb"  # tab kept: it only moves to the next tab stop
    assert printable("over\rwrite\n") == "over\\x0dwrite\\x0a"
    assert printable("\x00\x7f\x9b2J") == "\\x00\\x7f\\x9b2J"  # NUL, DEL, the one-byte C1 CSI
    # printable text, non-ASCII included, is unchanged, and escaping twice changes nothing more
    assert printable("ß ünïcode → 5 ms [bold]") == "ß ünïcode → 5 ms [bold]"
    assert printable(printable(HOSTILE)) == SHOWN


@pytest.mark.parametrize("code", [c for c in range(0x00, 0xA0) if c < 0x20 or c >= 0x7F])
def test_no_control_character_survives(code: int) -> None:
    out = printable(f"x{chr(code)}y")
    if code == 0x09:
        assert out == "x\ty"
    else:
        assert out == f"x\\x{code:02x}y"


def test_printable_lines_splits_then_escapes() -> None:
    assert printable_lines(f"one\n{HOSTILE}\n") == ["one", SHOWN]
    assert printable_lines("") == [""]


def _reporter(tmp_path: Path) -> tuple[Reporter, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)  # a terminal: the escapes would act
    return Reporter(tmp_path / "run.log", console, "label"), out


def test_console_and_run_log_show_a_hostile_device_name_escaped(tmp_path: Path) -> None:
    reporter, out = _reporter(tmp_path)
    reporter.line("edge", "stderr", f"edge: refused a frame claiming device '{HOSTILE}'\nsecond line")
    reporter.line(f"node{CLEAR}", "stdout", "x", "red")
    reporter.close()
    log = (tmp_path / "run.log").read_text(encoding="utf-8")
    assert f"edge stderr edge: refused a frame claiming device '{SHOWN}'\n" in log
    assert " edge stderr second line\n" in log
    assert "node\\x1b[2J stdout x" in log
    console = out.getvalue()
    assert SHOWN in console
    # the console's own styling is ANSI too: none of the hostile sequences is among it
    assert TITLE not in console and CLEAR not in console and "\x07" not in console


def test_nnpm_terminal_escapes_lines_it_reads(tmp_path: Path) -> None:
    log = tmp_path / "action.log"
    log.write_text(f"2026-01-01T00:00:00.000Z edge stderr {HOSTILE}\n", encoding="utf-8")
    lines, _end = read_lines(log, 0)
    assert lines[0]["x"] == SHOWN


def test_the_edge_service_says_what_a_peer_sent_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    from dit.device.edge import say

    say(f"refused a frame claiming device '{HOSTILE}'", error=True)
    assert capsys.readouterr().err == f"edge: refused a frame claiming device '{SHOWN}'\n"


def test_run_log_is_root_s_alone_and_not_written_through_a_link(tmp_path: Path) -> None:
    """run.log names the edge service's port: 0600 (issue 46)."""
    reporter, _out = _reporter(tmp_path)
    reporter.info("edge service listening on 127.0.0.1:40123")
    reporter.close()
    assert (tmp_path / "run.log").stat().st_mode & 0o777 == 0o600
    elsewhere = tmp_path / "elsewhere"
    (elsewhere).mkdir()
    (elsewhere / "run.log").symlink_to(tmp_path / "victim")
    reporter, out = _reporter(elsewhere)
    reporter.info("x")
    reporter.close()
    assert not (tmp_path / "victim").exists()
    assert "cannot write the run log" in out.getvalue()
