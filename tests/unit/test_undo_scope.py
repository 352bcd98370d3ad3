"""module_utils/dit_undo_scope and dit_restore's writes: what undoing a journal record may touch on a
node, and a kill in the middle of writing a prior value back."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import REPO
from tests.unit.test_dit_tc import _objects, htb_tree, tcm


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


scope_utils = _load("dit_undo_scope", REPO / "module_utils" / "dit_undo_scope.py")
RUN = "scn-20261201T000000Z-abcdef12-0123"


def _restore_module() -> ModuleType:
    """library/dit_restore.py, its ansible.module_utils imports served from this checkout."""
    for name in ("dit_trusted", "dit_procs"):  # dit_procs imports dit_trusted
        if f"ansible.module_utils.{name}" not in sys.modules:
            sys.modules[f"ansible.module_utils.{name}"] = _load(name, REPO / "module_utils" / f"{name}.py")
    sys.modules.setdefault("ansible.module_utils.dit_undo_scope", scope_utils)
    sys.modules.setdefault(
        "ansible.module_utils.dit_lease_file",
        _load("dit_lease_file", REPO / "module_utils" / "dit_lease_file.py"),
    )
    return _load("dit_restore_module", REPO / "library" / "dit_restore.py")


def _scope(tmp: Path, **kw: Any) -> Any:
    node = tmp / "base" / RUN
    node.mkdir(parents=True, exist_ok=True)
    args: dict[str, Any] = {
        "node_root": str(node),
        "sysfs_root": str(tmp / "sys"),
        "cgroup_root": str(tmp / "cgroup"),
        "interfaces": [{"dev": "wlan0", "netns": "ns1", "log": f"{node}.tc.jsonl"}],
    }
    args.update(kw)
    return scope_utils.Scope(RUN, "device1", **args)


def _refused(scope: Any, op: str, undo: dict[str, Any]) -> str:
    with pytest.raises(scope_utils.Refused) as info:
        scope.check(op, undo)
    return str(info.value)


def test_every_undo_dit_tc_journals_is_allowed_on_the_shaped_interface(tmp_path: Path) -> None:
    scope = _scope(tmp_path)
    log = f"{tmp_path}/base/{RUN}.tc.jsonl"
    netem = tcm.simulated_tree(
        _objects({"delay_ms": 20, "jitter_ms": 5, "loss_pct": 0.001, "rate_mbit": 5}, netns="ns1")
    )
    trees = [htb_tree(), netem, tcm.default_tree()]
    records = [r for tree in trees for r in tcm.undo_records(tree, "tc", "ns1", "wlan0", True, log)]
    assert {r["undo"]["argv"][3] for r in records} == {"qdisc", "class", "filter"}
    for record in records:
        assert scope.check(record["op"], record["undo"]) == record["undo"]
    # Without dry run (a real node): the same argv run for real, no log involved.
    real = _scope(tmp_path, interfaces=[{"dev": "wlan0", "netns": "", "log": ""}])
    for record in tcm.undo_records(htb_tree(), "/usr/sbin/tc", "", "wlan0", False, None):
        real.check(record["op"], record["undo"])


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["touch", "/tmp/pwned"], "the program must be one of"),
        (["/tmp/evil/tc", "qdisc", "del", "dev", "wlan0", "root"], "the program must be one of"),
        (["tc", "-batch", "/tmp/cmds"], "expected <object> <verb>"),
        (["tc", "-n", "ns1", "qdisc", "del", "dev", "eth0", "root"], "eth0 in netns ns1 is not an interface"),
        (["tc", "qdisc", "del", "dev", "wlan0", "root"], "wlan0 is not an interface this run shaped"),
        (["tc", "-n", "ns1", "qdisc", "replace", "dev", "wlan0", "root", "handle", "1:", "netem"], "qdisc replace"),
        (["tc", "-n", "ns1", "qdisc", "add", "dev", "wlan0", "root", "handle", "1:", "cake"], "expected handle"),
        (["tc", "-n", "ns1", "qdisc", "add", "dev", "wlan0", "root", "handle", "1:", "netem", "estimator", "1"],
         "option 'estimator'"),
        (["tc", "-n", "ns1", "filter", "add", "dev", "wlan0", "parent", "1:", "protocol", "ip", "prio", "1",
          "handle", "800::800", "u32", "match", "u32", "0x0", "0x0", "at", "0", "action", "bpf", "obj", "x.o"],
         "ends with flowid"),
        (["tc", "-n", "ns1", "filter", "add", "dev", "wlan0", "parent", "1:", "protocol", "all", "prio", "1",
          "handle", "1:", "matchall"], "expected protocol"),
    ],
)  # fmt: skip
def test_any_other_command_is_refused(tmp_path: Path, argv: list[str], why: str) -> None:
    assert why in _refused(_scope(tmp_path), "command", {"argv": argv, "dry_run": False})


def test_a_dry_run_undo_only_appends_to_the_declared_log(tmp_path: Path) -> None:
    argv = ["tc", "-n", "ns1", "qdisc", "del", "dev", "wlan0", "root"]
    reason = _refused(_scope(tmp_path), "command", {"argv": argv, "dry_run": True, "log": "/etc/passwd"})
    assert "is not the log declared for wlan0" in reason


def test_file_undos_stay_inside_the_run_resolved_through_dotdot_and_symlinks(tmp_path: Path) -> None:
    scope = _scope(tmp_path)
    node = tmp_path / "base" / RUN
    cpu = tmp_path / "sys" / "devices/system/cpu/cpufreq/policy0"
    cpu.mkdir(parents=True)
    cgroup = tmp_path / "cgroup" / f"dit-{RUN}-device1"
    cgroup.mkdir(parents=True)
    (node / "link").symlink_to(tmp_path / "outside")
    allowed = {
        str(node / "results" / "x.csv"): None,
        f"{node}.tc.jsonl.ns1.wlan0.state.json": None,
        str(cpu / "scaling_max_freq"): "1800000\n",
        str(cgroup / "memory.max"): "max\n",
    }
    for path, prior in allowed.items():
        assert scope.check("file", {"path": path, "prior": prior})["path"] == os.path.realpath(path)
    refused = {
        "/etc/passwd": "x",
        f"{node}/../../../outside": "x",
        str(node / "link"): "x",
        str(tmp_path / "sys" / "power" / "state"): "mem",
        str(cpu / "scaling_max_freq"): None,  # kernel attributes are written back, never deleted
        str(tmp_path / "cgroup" / "system.slice" / "memory.max"): "1",
        str(tmp_path / "cgroup" / "dit-another-run-device1" / "memory.max"): "1",
        "relative/path": "x",
    }
    for path, prior in refused.items():
        assert "outside" in _refused(scope, "file", {"path": path, "prior": prior}) or path == "relative/path"


def test_directories_processes_and_cgroups_of_the_run_only(tmp_path: Path) -> None:
    scope = _scope(tmp_path)
    node = tmp_path / "base" / RUN
    assert scope.check("mkdir", {"path": str(node), "run_id": RUN})["path"] == str(node)
    assert "not this run's node directory" in _refused(scope, "mkdir", {"path": str(tmp_path), "run_id": RUN})
    assert "not this run's node directory" in _refused(scope, "mkdir", {"path": str(node), "run_id": "other"})
    assert "outside" in _refused(scope, "rmdir", {"path": "/tmp/x"})
    scope.check("rmdir", {"path": str(node / "sub")})
    scope.check("cgroup", {"path": str(tmp_path / "cgroup" / "memory" / f"dit-{RUN}-device1")})
    assert "not this run's cgroup" in _refused(
        scope, "cgroup", {"path": str(tmp_path / "cgroup" / "user.slice")}
    )
    scope.check("process", {"run_id": RUN, "host": "device1", "tag": "edge"})
    assert "another-run" in _refused(
        scope, "process", {"run_id": "another-run", "host": "device1", "tag": "x"}
    )
    assert "unknown journal op 'exec'" in _refused(scope, "exec", {})
    no_node = scope_utils.Scope(RUN, "device1")
    assert "not this run's node directory" in _refused(no_node, "mkdir", {"path": str(node), "run_id": RUN})


def _killed_while_writing(restore: ModuleType, path: Path, prior: str) -> None:
    """Run ``_undo_file`` in a child that is SIGKILLed right after its first write reaches a file."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child dies by SIGKILL
        real_open, real_fdopen = open, os.fdopen

        class Dying:
            def __init__(self, handle: Any) -> None:
                self.handle = handle

            def __enter__(self) -> Dying:
                return self

            def __exit__(self, *exc: object) -> None:
                self.handle.close()

            def write(self, text: str) -> int:
                written = int(self.handle.write(text[: len(text) // 2]))
                self.handle.flush()
                os.kill(os.getpid(), signal.SIGKILL)  # killed half-way through the write
                return written

            def __getattr__(self, name: str) -> Any:
                return getattr(self.handle, name)

        restore.open = lambda *a, **k: Dying(real_open(*a, **k))  # type: ignore[attr-defined]
        restore.os.fdopen = lambda *a, **k: Dying(real_fdopen(*a, **k))
        restore._undo_file({"path": str(path), "prior": prior}, False)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_a_kill_while_restoring_a_file_leaves_the_old_content_or_the_new_never_a_truncated_file(
    tmp_path: Path,
) -> None:
    restore = _restore_module()
    fake = tmp_path / "sys" / "devices/system/cpu/cpufreq/policy0/scaling_max_freq"
    fake.parent.mkdir(parents=True)
    fake.write_text("1200000\n", encoding="utf-8")
    fake.chmod(0o644)
    _killed_while_writing(restore, fake, "1800000\n")
    assert fake.read_text(encoding="utf-8") in ("1200000\n", "1800000\n")
    # Not killed: the prior content is back, with the file's mode.
    restore._undo_file({"path": str(fake), "prior": "1800000\n"}, False)
    assert fake.read_text(encoding="utf-8") == "1800000\n"
    assert fake.stat().st_mode & 0o777 == 0o644


def test_the_node_lease_of_this_run_only(tmp_path: Path) -> None:
    scope = _scope(tmp_path)
    lease = tmp_path / "base" / "lease.json"
    assert scope.check("lease", {"path": str(lease), "run_id": RUN})["path"] == str(lease)
    assert "not this node's lease" in _refused(scope, "lease", {"path": str(lease), "run_id": "other"})
    assert "not this node's lease" in _refused(scope, "lease", {"path": "/etc/shadow", "run_id": RUN})
    moved = _scope(tmp_path, lease_dir=str(tmp_path / "leases"))
    moved.check("lease", {"path": str(tmp_path / "leases" / "lease.json"), "run_id": RUN})


CHAIN = "DIT-0123456789ab"


def _nfqueue_module() -> ModuleType:
    return _load("dit_nfqueue_module", REPO / "library" / "dit_nfqueue.py")


def test_iptables_undo_only_for_the_chain_the_run_installed(tmp_path: Path) -> None:
    interfaces = [{"dev": "wlan0", "netns": "ns1", "log": "", "chain": CHAIN}]
    scope = _scope(tmp_path, interfaces=interfaces)
    # exactly what dit_nfqueue journals is accepted
    for record in _nfqueue_module().undo_records("ns1", CHAIN, ["-o", "wlan0", "-j", CHAIN]):
        assert scope.check(record["op"], record["undo"])["argv"] == record["undo"]["argv"]
    pre = ["ip", "netns", "exec", "ns1", "iptables", "-w", "-t", "mangle"]
    other = "DIT-ffffffffffff"
    assert "not the chain this run installed" in _refused(scope, "command", {"argv": [*pre, "-X", other]})
    assert "not one this run installed" in _refused(
        scope, "command", {"argv": [*pre, "-D", "POSTROUTING", "-o", "eth0", "-j", CHAIN]}
    )
    assert "not the chain this run installed" in _refused(
        scope,
        "command",
        {"argv": ["iptables", "-w", "-t", "mangle", "-F", CHAIN]},  # another namespace
    )
    for argv in (
        [*pre, "-F"],  # every chain of the table
        [*pre, "-F", "POSTROUTING"],
        ["ip", "netns", "exec", "ns1", "sh", "-c", "iptables -F"],
        ["iptables", "-w", "-t", "filter", "-X", CHAIN],
        [*pre, "-A", "POSTROUTING", "-j", "ACCEPT"],
    ):
        assert "dit_nfqueue journals" in _refused(scope, "command", {"argv": argv})
    # a scope without the userspace backend takes no iptables undo at all
    plain = _scope(tmp_path)
    assert "not the chain this run installed (none)" in _refused(
        plain, "command", {"argv": [*pre, "-X", CHAIN]}
    )


def test_a_reset_empties_a_sweep_variant_s_directory_but_what_the_spared_processes_run_from(
    tmp_path: Path,
) -> None:
    """Between two variants of a sweep the run directory stays with the processes that run on (the
    link emulator here): what collect fetched goes, and so does everything else of the variant (its
    configs, ready files, start instant), never a file collect has not fetched."""
    restore = _restore_module()
    node = tmp_path / RUN
    (node / "results").mkdir(parents=True)
    (node / "logs").mkdir()
    (node / ".dit-run").write_text(RUN)
    keep = ["dit-device.pyz", "link-emulator.json", "link-emulator.ready", "link-emulator.sock",
            "logs/link-emulator.out", "logs/link-emulator.err"]  # fmt: skip
    fetched = ["results/link_emulator.json", "results/edge_requests.csv", "logs/edge.out"]
    gone = ["edge.json", "edge.ready", "start_at.json", *fetched]
    for name in keep + gone:
        (node / name).write_text(name)
    (node / "agent-work").mkdir()
    undo = {"path": str(node), "run_id": RUN}
    removed: list[dict[str, Any]] = []

    # a result collect has not fetched keeps everything in place, and is named
    with pytest.raises(restore.Kept) as kept:
        restore._reset_mkdir(undo, False, removed, set(fetched[:-1]), {"link-emulator"})
    assert [u["path"] for u in kept.value.unfetched] == ["logs/edge.out"]
    assert all((node / name).exists() for name in keep + gone)

    assert restore._reset_mkdir(undo, False, removed, set(fetched), {"link-emulator"})
    left = sorted(str(p.relative_to(node)) for p in node.rglob("*") if p.is_file())
    assert left == sorted([".dit-run", *keep])
    assert not (node / "agent-work").exists()
    assert sorted(r["path"] for r in removed) == sorted(fetched)
    # another run's directory is never touched
    with pytest.raises(ValueError, match="belongs to run"):
        restore._reset_mkdir({"path": str(node), "run_id": "other"}, False, [], None, set())
