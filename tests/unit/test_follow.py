"""dit.run.follow: device stdout/stderr followed live, from local files or through one ssh per host."""

from __future__ import annotations

import shlex
import stat
import threading
import time
from pathlib import Path

from dit.run.follow import (
    FollowTarget,
    LogFollower,
    parse_remote_line,
    remote_command,
    split_line,
    ssh_argv,
    stop_beside,
)


def wait_for(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_split_and_parse() -> None:
    assert split_line("profile.out", "hello") == ("stdout", "[profile] hello")
    assert split_line("edge.err", "boom") == ("stderr", "[edge] boom")
    assert split_line("profile.json", "x") is None
    assert parse_remote_line("monitor.out sample 1") == ("stdout", "[monitor] sample 1")
    assert parse_remote_line("../x.out y") is None


def test_ssh_argv_from_ansible_connection_variables() -> None:
    target = FollowTarget(
        "pi1",
        "/var/lib/dit/run-1",
        {
            "ansible_host": "192.0.2.11",
            "ansible_user": "pi",
            "ansible_port": 2222,
            "ansible_ssh_private_key_file": "/keys/id_ed25519",
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
        },
    )
    argv = ssh_argv(target, "run-1")
    assert argv[0] == "ssh" and "BatchMode=yes" in argv
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-i") + 1] == "/keys/id_ed25519"
    assert "StrictHostKeyChecking=no" in argv and argv[-2] == "pi@192.0.2.11"
    remote = shlex.split(argv[-1])
    assert remote[:4] == ["env", "DIT_RUN_ID=run-1", "DIT_HOST=pi1", "DIT_TAG=follow"]
    assert remote[-1] == "/var/lib/dit/run-1/logs"
    assert FollowTarget("edge", "/x", {"ansible_connection": "local"}).is_local


def local_follower(tmp_path: Path, poll_s: float) -> tuple[Path, list[tuple[str, str, str]], LogFollower]:
    """A follower of one local node under ``tmp_path``: its logs directory, what it delivered, itself."""
    logs = tmp_path / "device1" / "logs"
    logs.mkdir(parents=True)
    got: list[tuple[str, str, str]] = []
    target = FollowTarget("device1", str(tmp_path / "device1"), local=True)
    return logs, got, LogFollower([target], "r", lambda *a: got.append(a), poll_s=poll_s)


def test_local_files_followed_in_order_until_stop(tmp_path: Path) -> None:
    logs, got, follower = local_follower(tmp_path, poll_s=0.05)
    (logs / "edge.out").write_text("before start\n", "utf-8")
    follower.start()
    wait_for(lambda: len(got) == 1)
    with (logs / "profile.out").open("a", encoding="utf-8") as out:  # a file created after start
        out.write("repetition 1/2\nrepetition 2/")
        out.flush()
        wait_for(lambda: len(got) == 2)
        out.write("2\n")
    with (logs / "profile.err").open("w", encoding="utf-8") as err:
        err.write("warning\nno newline at the end")
    follower.stop()
    assert sorted(got) == sorted(
        [
            ("device1", "stdout", "[edge] before start"),
            ("device1", "stdout", "[profile] repetition 1/2"),
            ("device1", "stdout", "[profile] repetition 2/2"),
            ("device1", "stderr", "[profile] warning"),
            ("device1", "stderr", "[profile] no newline at the end"),
        ]
    )
    per_file = [t for _, s, t in got if s == "stdout" and "profile" in t]
    assert per_file == ["[profile] repetition 1/2", "[profile] repetition 2/2"]


def test_a_follower_stopped_beside_the_teardown_still_delivers_its_last_lines(tmp_path: Path) -> None:
    """The driver stops the followers in a thread while the teardown runs: what a node wrote before is
    delivered once the thread is joined, and the caller went on at once (the stop runs elsewhere)."""
    logs, got, follower = local_follower(tmp_path, poll_s=60)
    follower.start()
    (logs / "edge.out").write_text("edge: stopped\n", "utf-8")  # never polled: the poll is a minute away
    thread = stop_beside(follower)
    assert thread is not threading.current_thread()
    thread.join(10)
    assert not thread.is_alive()
    assert got == [("device1", "stdout", "[edge] edge: stopped")]
    stop_beside(None).join(10)  # a run that never followed: nothing to stop


def test_remote_follower_through_ssh(tmp_path: Path) -> None:
    # a stand-in for ssh that runs the remote command here, as the node's login shell would
    fake_ssh = tmp_path / "ssh"
    fake_ssh.write_text('#!/bin/sh\nfor last; do :; done\nexec sh -c "$last"\n', "utf-8")
    fake_ssh.chmod(fake_ssh.stat().st_mode | stat.S_IEXEC)
    root = tmp_path / "pi1"
    (root / "logs").mkdir(parents=True)
    (root / "logs" / "profile.out").write_text("first\n", "utf-8")
    got: list[tuple[str, str, str]] = []
    target = FollowTarget("pi1", str(root), {"ansible_host": "127.0.0.1"})
    follower = LogFollower([target], "run-x", lambda *a: got.append(a), ssh=str(fake_ssh))
    follower.start()
    wait_for(lambda: ("pi1", "stdout", "[profile] first") in got)
    (root / "logs" / "monitor.err").write_text("late file\n", "utf-8")
    wait_for(lambda: ("pi1", "stderr", "[monitor] late file") in got)
    pids = [p.pid for p in follower._procs]
    follower.stop()
    for proc in follower._procs:
        assert proc.poll() is not None and proc.pid in pids  # ssh ended and was waited for
    # the remote loop (and its tails) end by themselves once the session is gone
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _tagged("run-x"):
        time.sleep(0.2)
    assert _tagged("run-x") == []
    assert "DIT_TAG=follow" in remote_command(target, "run-x")


def _tagged(run_id: str) -> list[int]:
    from dit.run.procs import run_processes

    return [p.pid for p in run_processes(run_id)]
