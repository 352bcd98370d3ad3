"""The edge service with the run's key (issue 46, item 3): a frame the key does not verify is refused
(connection dropped, nothing in it used), counted in ``edge_summary.json``, said on stderr with what it
claimed escaped; the devices that hold the key are served as before."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

from dit.device import protocol as P
from dit.device.client import EdgeConnection
from tests.integration.test_edge_output import wait_for_text
from tests.integration.test_edge_service import TINY, edge_config, read_csv, run_devices, wait_ready

KEY = bytes(range(32))
HOSTILE = "device\x1b]2;pwned\x07\x1b[2J"


def write_key(path: Path, key: bytes = KEY, mode: int = 0o600) -> Path:
    path.write_text(key.hex() + "\n", encoding="ascii")
    path.chmod(mode)
    return path


def dropped(sock: socket.socket) -> bool:
    """The service closed the connection without an answer."""
    sock.settimeout(30)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def start_edge(tmp_path: Path, **over: object) -> tuple[subprocess.Popen[bytes], Path, Path]:
    cfg = edge_config(tmp_path, model=TINY, policy="RR", **over)
    (tmp_path / "edge.json").write_text(json.dumps(cfg), encoding="utf-8")
    out, err = tmp_path / "edge.out", tmp_path / "edge.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dit.device", "edge", "--config", str(tmp_path / "edge.json")],
            stdout=stdout,
            stderr=stderr,
        )
    return proc, out, err


def test_forged_frames_are_refused_counted_and_the_devices_still_served(tmp_path: Path) -> None:
    key_file = write_key(tmp_path / "edge.key")
    proc, out, err = start_edge(tmp_path, key_file=str(key_file))
    try:
        port = int(wait_ready(proc, tmp_path / "edge-ready.json")["port"])
        wait_for_text(out, "frames signed with the run's key")
        # 1. what the issue's attacker sent: SKIPs for both devices' first inference, unsigned
        for device in ("device1", HOSTILE):
            with socket.create_connection(("127.0.0.1", port)) as raw:
                raw.sendall(P.encode(P.Skip(device, 0, 0, 4)))
                assert dropped(raw)
        # 2. a HELLO, then a SKIP signed with another run's key
        with socket.create_connection(("127.0.0.1", port)) as raw:
            session = P.device_handshake(raw, bytes(32))
            raw.sendall(P.encode(P.Skip("device2", 0, 0, 4), session=session))
            assert dropped(raw)
        # 3. a frame signed with the run's key, then altered on the way (its round)
        with socket.create_connection(("127.0.0.1", port)) as raw:
            session = P.device_handshake(raw, KEY)
            frame = bytearray(P.encode(P.Skip("device1", 0, 0, 4), session=session))
            frame[P.HEADER_SIZE + 3] ^= 0x01
            raw.sendall(bytes(frame))
            assert dropped(raw)
        # 4. a device of this run without the key
        with EdgeConnection("127.0.0.1", port) as conn:
            conn.send(P.Skip("device1", 0, 0, 4))
            try:
                conn.receive()
                raise AssertionError("an unsigned SKIP was answered")
            except (ConnectionError, P.ProtocolError):
                pass
        # nothing of the above was used: round 0 repetition 0 is still the devices' own
        records = run_devices(port, {"device1": 0, "device2": 2}, 2, TINY, key=KEY)
        assert [r.repetition for r in records["device1"]] == [0, 1]
        wait_for_text(err, "claiming device 'device\\x1b]2;pwned\\x07\\x1b[2J'")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    summary = json.loads((tmp_path / "edge" / "edge_summary.json").read_text())
    assert summary["authenticated"] is True
    assert summary["refused"] == {"bad_mac": 2, "unsigned": 3}
    assert summary["refused_frames"] == 5
    assert summary["completed_requests"] == 4
    rows = read_csv(tmp_path / "edge" / "edge_requests.csv")
    assert sorted((r["device"], r["repetition"]) for r in rows) == [
        ("device1", "0"), ("device1", "1"), ("device2", "0"), ("device2", "1")
    ]  # fmt: skip
    said = err.read_text(encoding="utf-8")
    assert "\x1b" not in said and "\x07" not in said
    assert "a SKIP before the HELLO (unsigned); connection dropped" in said
    assert "SKIP frame: its MAC is not the run's key's" in said
    assert "edge: stopped · 4 requests served, 0 skips, 0 unfinished rounds, 5 frames refused" in (
        out.read_text(encoding="utf-8")
    )
    # the files that name the port are root's alone
    assert (tmp_path / "edge-ready.json").stat().st_mode & 0o077 == 0
    assert (tmp_path / "edge" / "edge_summary.json").stat().st_mode & 0o077 == 0


def test_a_key_others_can_read_is_refused_at_start(tmp_path: Path) -> None:
    key_file = write_key(tmp_path / "edge.key", mode=0o644)
    proc, _out, err = start_edge(tmp_path, key_file=str(key_file))
    assert proc.wait(timeout=60) == 2
    assert f"key_file: {key_file}: the run's key is mode 0644" in err.read_text(encoding="utf-8")


def test_a_local_run_refuses_a_forged_frame_and_completes_with_its_own_measurements(
    scenario_dir: Path, runs_dir: Path, tmp_path: Path
) -> None:
    """The issue's attack on a whole local run: while it runs, frames without the run's key are sent
    to the edge port (SKIPs for both devices' first inference, one claiming a hostile name). They are
    refused and counted (status.json, the console, dit show), the hostile name reaches run.log
    escaped, and the run completes with every measurement of its own devices."""
    import io

    from rich.console import Console
    from typer.testing import CliRunner

    from dit.cli import app
    from dit.run.driver import Driver, RunOptions
    from dit.scenario import load
    from tests.conftest import write_scenario

    forged: list[bool] = []
    keys: list[str] = []

    class Forging(Driver):
        def _profile(self) -> None:  # after apply (the port is known) and the log follower's start
            assert self.edge_port is not None and self.key is not None
            assert self.key.stat().st_mode & 0o777 == 0o600
            keys.append(self.key.read_text(encoding="ascii").strip())
            node_key = Path(self.contexts["device1"].node_root) / P.KEY_FILE  # local mode: a directory
            assert node_key.read_text(encoding="ascii").strip() == keys[0]
            assert node_key.stat().st_mode & 0o777 == 0o600
            for device in ("device1", "device2", HOSTILE):
                with socket.create_connection((self.inv.edge_address, self.edge_port)) as raw:
                    raw.sendall(P.encode(P.Skip(device, 0, 0, 4)))
                    forged.append(dropped(raw))
            super()._profile()

    (scenario,) = load(write_scenario(scenario_dir))
    console = io.StringIO()
    result = Forging(scenario, RunOptions(runs_root=runs_dir, console=Console(file=console))).execute()
    assert result.state == "completed", result.error
    assert forged == [True, True, True]
    run_dir = result.run_dir
    status = json.loads((run_dir / "status.json").read_text())
    assert status["edge_channel"] == {"authenticated": True, "refused_frames": 3, "refused": {"unsigned": 3}}
    # every inference of the run's own devices was measured: 3 vectors x 3 repetitions each
    for device in ("device1", "device2"):
        rows = read_csv(run_dir / "raw" / device / f"{device}_inference.csv")
        assert len(rows) == 9, device
    log = (run_dir / "run.log").read_text(encoding="utf-8")
    assert "claiming device 'device\\x1b]2;pwned\\x07\\x1b[2J'" in log
    assert "\x1b" not in log and "\x07" not in log
    assert "the edge service refused 3 frames (unsigned 3)" in console.getvalue()
    assert "\x1b]2;" not in console.getvalue()
    shown = CliRunner().invoke(app, ["show", str(run_dir)], terminal_width=300)
    assert shown.exit_code == 0, shown.output
    assert "the edge service refused 3 frames (unsigned 3)" in shown.output
    from dit.run.rundir import RunDir
    from dit.web.services.runs import run_detail
    from dit.web.services.store import Store

    detail = run_detail(RunDir(run_dir), runs_dir, Store(tmp_path / "nnpm.sqlite"))
    assert str(detail["edge_channel"]).startswith("the edge service refused 3 frames (unsigned 3)")
    # the run's key: gone from the controller after the run, never on a command line or in a log
    assert not (run_dir / "device" / P.KEY_FILE).exists()
    assert len(keys[0]) == 64
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert keys[0].encode() not in path.read_bytes(), path
