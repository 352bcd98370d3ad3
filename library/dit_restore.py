#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Undo a dit run's changes on one node from its journal records, reap its processes, verify."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dit_restore
version_added: "0.1.0"
short_description: Replay a node's journal backwards and reap every process of the run
description:
  - O(records) are this node's pending journal records, newest first. Each is undone in that order.
    Undoing is idempotent. The record kinds (C(op)) and their C(undo) data follow.
  - C(process) C({run_id, host, tag}) kills the tagged process groups.
  - C(mkdir) C({path, run_id}) removes a run directory carrying this run's marker. With O(keep_results)
    it is kept while a file of its C(results/) or C(logs/) is not in O(fetched); the record is then
    not undone but returned in RV(kept_records), and those files in RV(unfetched), so the play can
    fetch them and call the module again with the kept records.
  - C(mkdir) with C(reset=true) on the record (a sweep's next variant keeps the directory and the
    processes in O(spare)) empties the directory instead. It stays and its record stays pending.
    Every file of its C(results/) and C(logs/) is removed (on the same condition of O(fetched))
    except the logs of the spared processes (C(logs/<tag>.out), C(.err), C(.status.json)), which
    keep writing there, and so is everything else in it but the marker, C(dit-device.pyz) and the
    spared processes' own files (C(<tag>.json), C(<tag>-config.json), C(<tag>.ready),
    C(<tag>.sock)). The spared processes then get SIGHUP, and each starts its own results anew for
    the next variant.
  - C(file) C({path, prior}) writes the prior content back (C(prior=null) removes a file the run created).
  - C(rmdir) C({path}) removes an (empty) directory the run created, such as a cgroup.
  - C(cgroup) C({path}) removes a cgroup the run created. Any process still in it is moved to the
    parent cgroup first (the run's own processes are reaped by their newer C(process) records).
  - C(lease) C({path, run_id}) releases the node's lease (a file named C(lease.json)), only while it
    still names this run; another run's lease is left alone.
  - C(command) C({argv, dry_run, log}) runs an undo command (an argv list); with C(dry_run) it is
    only appended to C(log) as JSON, as local mode does for privileged network commands.
  - Then every process of the run on this node is killed by process group (SIGTERM, then SIGKILL),
    but those tagged one of O(spare), and the module fails loudly if any other process carrying the
    run id survives.
options:
  records:
    description: Pending journal records of this node, newest first.
    type: list
    elements: dict
    default: []
  grace_s:
    description: Seconds between SIGTERM and SIGKILL.
    type: float
    default: 5.0
  node_root:
    description:
      - The node's run directory (the undo scope, see C(docs/journal.md)). Without it nothing under it
        is undone.
    type: path
  sysfs_root:
    description: The directory standing for C(/sys) (undo scope).
    type: path
    default: /sys
  cgroup_root:
    description: The cgroup hierarchy the run's cgroup lives under (undo scope).
    type: path
    default: /sys/fs/cgroup
  interfaces:
    description:
      - "The interfaces the run shaped, each C({dev, netns, log, chain}): tc undos only on these, iptables undos only for C(chain) (undo scope)."
    type: list
    elements: dict
    default: []
  lease_dir:
    description:
      - Where the node's C(lease.json) lives (undo scope). Defaults to the parent of O(node_root).
    type: path
  fetched:
    description:
      - The files of the run directory, relative to it (C(results/<name>), C(logs/<name>)), that the
        controller already holds in C(raw/).
    type: list
    elements: str
    default: []
  spare:
    description:
      - Tags of the run's processes left running (a sweep's next variant keeps their condition in
        force); they are neither reaped nor survivors. The C(process) records naming them must not be
        in O(records).
    type: list
    elements: str
    default: []
  keep_results:
    description:
      - Keep a run directory holding a result or log file not in O(fetched). False deletes such
        files with the directory (C(dit cleanup --discard-results)); RV(removed_results) lists them.
    type: bool
    default: true
extends_documentation_fragment:
  - dit.run
  - dit.node
  - dit.linux
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reports the processes that would be reaped and whether any record would change the node; undoes nothing.
  diff_mode:
    support: none
    details: Undo records restore prior content; the records themselves are the description of the change.
author: The dit developers
"""

EXAMPLES = r"""
- name: Undo the run on this node
  dit_restore:
    run_id: "{{ dit_run_id }}"
    host: "{{ inventory_hostname }}"
    records: "{{ dit_undo[inventory_hostname] | default([]) }}"
"""

RETURN = r"""
undone:
  description: Ids of the journal records undone (or found already undone).
  returned: always
  type: list
reaped:
  description: Processes of the run found and killed.
  returned: always
  type: list
survivors:
  description: Processes carrying the run id still alive after SIGKILL (in check mode, those that would be reaped).
  returned: always
  type: list
refused:
  description: Records outside the undo scope, not undone, each {id, op, source, reason}.
  returned: always
  type: list
removed_results:
  description: Files of the run directory's results/ and logs/ deleted with it, each {path, bytes}.
  returned: always
  type: list
unfetched:
  description:
    - Files that kept a run directory (O(keep_results)), each {path, bytes, src} (C(src) the absolute
      path on the node).
  returned: always
  type: list
kept:
  description: Run directories kept because of RV(unfetched).
  returned: always
  type: list
kept_records:
  description: The C(mkdir) records not undone because their directory was kept.
  returned: always
  type: list
reset:
  description: The run directories emptied for a sweep's next variant (C(mkdir) records with C(reset)).
  returned: always
  type: list
handed_over:
  description: The spared processes sent SIGHUP after their directory was emptied, each {pid, pgid, tag, host}.
  returned: always
  type: list
"""

import contextlib
import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dit_lease_file import release as release_lease
from ansible.module_utils.dit_procs import find_tagged, reap
from ansible.module_utils.dit_undo_scope import Refused, Scope

MARKER = ".dit-run"
RESULT_DIRS = ("results", "logs")  # what the collect stage fetches from a run directory
SPARED_LOG_SUFFIXES = (".out", ".err", ".status.json")  # a process's own files in logs/ (dit_proc)
# a process's own files in the run directory (the roles name them after its tag) and what every
# variant of a sweep shares (the device code, which a spared process runs from)
SPARED_FILE_SUFFIXES = (".json", "-config.json", ".ready", ".sock")
KEPT_FILES = ("dit-device.pyz",)
# Kernel attribute files (sysfs, cgroupfs, procfs) cannot be replaced by a rename: they are
# written in place, which the kernel applies as one store.
KERNEL_FS = ("/sys/", "/proc/")


def _results_in(path: str) -> list[dict[str, Any]]:
    """The files the collect stage would have fetched from run directory ``path``."""
    found: list[dict[str, Any]] = []
    for sub in RESULT_DIRS:
        base = os.path.join(path, sub)
        try:
            names = sorted(os.listdir(base))
        except OSError:
            continue
        for name in names:
            full = os.path.join(base, name)
            if os.path.isfile(full) and not os.path.islink(full):
                found.append({"path": f"{sub}/{name}", "bytes": os.path.getsize(full)})
    return found


class Kept(Exception):
    """A run directory holding results the controller does not have yet: not removed."""

    def __init__(self, path: str, unfetched: list[dict[str, Any]]) -> None:
        super().__init__(path)
        self.path = path
        self.unfetched = unfetched


def _undo_mkdir(
    undo: dict[str, Any],
    check: bool,
    removed: list[dict[str, Any]] | None = None,
    keep_unless_in: set[str] | None = None,
) -> bool:
    path = undo["path"]
    if not os.path.exists(path):
        return False
    _check_marker(path, undo["run_id"])
    results = _results_in(path)
    _keep_unfetched(path, results, keep_unless_in)
    if not check:
        if removed is not None:
            removed.extend(results)
        shutil.rmtree(path)
    return True


def _reset_mkdir(
    undo: dict[str, Any],
    check: bool,
    removed: list[dict[str, Any]],
    keep_unless_in: set[str] | None,
    spare: set[str],
) -> bool:
    """Empty run directory ``undo['path']`` for a sweep's next variant, leaving the logs of the
    processes tagged one of ``spare`` (which go on running there); :class:`Kept` while a file to remove
    is not fetched yet."""
    path = undo["path"]
    _check_marker(path, undo["run_id"])
    spared_logs = {f"logs/{tag}{suffix}" for tag in spare for suffix in SPARED_LOG_SUFFIXES}
    results = [r for r in _results_in(path) if r["path"] not in spared_logs]
    _keep_unfetched(path, results, keep_unless_in)
    # the variant's own files beside them (configs, ready files, start instants) go too: the next
    # variant's tasks must find nothing of this one's
    spared_files = {MARKER, *KEPT_FILES} | {
        f"{tag}{suffix}" for tag in spare for suffix in SPARED_FILE_SUFFIXES
    }
    others = sorted(set(os.listdir(path)) - spared_files - set(RESULT_DIRS))
    if check:
        return bool(results or others)
    for result in results:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(path, result["path"]))
    for name in others:
        full = os.path.join(path, name)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(full)
    removed.extend(results)
    return bool(results or others)


def _keep_unfetched(path: str, results: list[dict[str, Any]], keep_unless_in: set[str] | None) -> None:
    """:class:`Kept` when one of ``results`` (files of run directory ``path``) is not in
    ``keep_unless_in`` (what the controller holds; None: remove them all the same)."""
    if keep_unless_in is None:
        return
    unfetched = [
        dict(r, src=os.path.join(path, r["path"])) for r in results if r["path"] not in keep_unless_in
    ]
    if unfetched:
        raise Kept(path, unfetched)


def _check_marker(path: str, run_id: str) -> None:
    marker = os.path.join(path, MARKER)
    try:
        with open(marker, encoding="utf-8") as handle:
            owner = handle.read().strip()
    except OSError as exc:
        raise ValueError(f"{path} has no {MARKER} marker; not removing it") from exc
    if owner != run_id:
        raise ValueError(f"{path} belongs to run {owner}, not {run_id}; not removing it")


def _write_atomically(path: str, text: str) -> None:
    """Replace ``path`` by a complete new file: a kill leaves the old content or the new, never a
    truncated file (a local-mode fake sysfs file, a tc dry-run state file)."""
    mode = stat.S_IMODE(os.stat(path).st_mode) if os.path.exists(path) else 0o644
    fd, tmp = tempfile.mkstemp(
        prefix=f".{os.path.basename(path)}.", suffix=".dit-restore", dir=os.path.dirname(path)
    )
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _write_prior(path: str, text: str) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    owned_regular = info is not None and stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()
    if (info is None or owned_regular) and not path.startswith(KERNEL_FS):
        _write_atomically(path, text)
        return
    # A kernel attribute (or a file that is not ours to replace): it can only be written in place.
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _undo_file(undo: dict[str, Any], check: bool) -> bool:
    path = undo["path"]
    prior = undo.get("prior")
    if prior is None:
        if os.path.exists(path):
            if not check:
                os.unlink(path)
            return True
        return False
    try:
        with open(path, encoding="utf-8") as handle:
            current = handle.read()
    except OSError:
        current = None
    if current == prior:
        return False
    if not check:
        _write_prior(path, prior)
    return True


def _undo_rmdir(undo: dict[str, Any], check: bool) -> bool:
    path = undo["path"]
    if not os.path.isdir(path):
        return False
    if not check:
        os.rmdir(path)
    return True


def _undo_command(undo: dict[str, Any], check: bool) -> bool:
    argv = [str(a) for a in undo["argv"]]
    if check:
        return True
    if undo.get("dry_run"):
        with open(undo["log"], "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"argv": argv, "undo": True}) + "\n")
        return True
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if proc.returncode != 0 and not undo.get("ignore_errors"):
        detail = (proc.stderr or proc.stdout).strip()
        raise ValueError(f"undo command {argv} failed: {detail}")
    return True


def _undo_cgroup(undo: dict[str, Any], check: bool, timeout_s: float = 5.0) -> bool:
    path = undo["path"].rstrip("/")
    if not os.path.isdir(path):
        return False
    if check:
        return True
    parent_procs = os.path.join(os.path.dirname(path), "cgroup.procs")
    deadline = time.monotonic() + timeout_s
    while True:
        with open(os.path.join(path, "cgroup.procs"), encoding="ascii") as handle:
            pids = handle.read().split()
        for pid in pids:  # a process left in the cgroup moves out (it is not killed: not ours)
            try:
                with open(parent_procs, "w", encoding="ascii") as handle:
                    handle.write(pid)
            except ProcessLookupError:
                pass
        try:
            os.rmdir(path)
            return True
        except OSError as exc:  # EBUSY while an exiting task still holds the cgroup
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
        time.sleep(0.05)


UNDO: dict[str, Callable[[dict[str, Any], bool], bool]] = {
    "mkdir": _undo_mkdir,
    "file": _undo_file,
    "rmdir": _undo_rmdir,
    "cgroup": _undo_cgroup,
    "command": _undo_command,
    "lease": lambda undo, check: release_lease(undo["path"], undo["run_id"], check),
}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "run_id": {"type": "str", "required": True},
            "host": {"type": "str", "required": True},
            "records": {"type": "list", "elements": "dict", "default": []},
            "grace_s": {"type": "float", "default": 5.0},
            "node_root": {"type": "path"},
            "sysfs_root": {"type": "path", "default": "/sys"},
            "cgroup_root": {"type": "path", "default": "/sys/fs/cgroup"},
            "interfaces": {"type": "list", "elements": "dict", "default": []},
            "lease_dir": {"type": "path"},
            "fetched": {"type": "list", "elements": "str", "default": []},
            "keep_results": {"type": "bool", "default": True},
            "spare": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    check = module.check_mode
    scope = Scope(
        p["run_id"],
        p["host"],
        p["node_root"],
        p["sysfs_root"],
        p["cgroup_root"],
        p["interfaces"],
        p["lease_dir"],
    )
    undone: list[Any] = []
    reaped: list[dict[str, Any]] = []
    errors: list[str] = []
    refused: list[dict[str, Any]] = []
    removed: list[dict[str, Any]] = []
    unfetched: list[dict[str, Any]] = []
    kept: list[str] = []
    kept_records: list[dict[str, Any]] = []
    keep_unless_in = set(p["fetched"]) if p["keep_results"] else None
    spare = set(p["spare"])
    resets: list[str] = []
    changed = False
    for record in p["records"]:
        op, undo = record.get("op"), record.get("undo") or {}
        try:
            undo = scope.check(op, undo)
        except Refused as exc:
            # Not undone, so it stays pending: every later cleanup reports it again.
            refused.append(
                {"id": record.get("id"), "op": op, "source": record.get("source"), "reason": str(exc)}
            )
            continue
        try:
            if op == "process":
                if check:
                    found = find_tagged(undo["run_id"], undo.get("host"), undo.get("tag"))
                else:
                    found, left = reap(undo["run_id"], undo.get("host"), undo.get("tag"), p["grace_s"])
                    if left:
                        raise ValueError(f"processes survived SIGKILL: {left}")
                reaped.extend(found)
                changed = changed or bool(found)
            elif op == "mkdir":
                try:
                    if record.get("reset"):
                        changed = _reset_mkdir(undo, check, removed, keep_unless_in, spare) or changed
                    else:
                        changed = _undo_mkdir(undo, check, removed, keep_unless_in) or changed
                except Kept as exc:  # not undone: it stays pending until its results are fetched
                    kept.append(exc.path)
                    unfetched.extend(exc.unfetched)
                    kept_records.append(record)
                    continue
                if record.get("reset"):
                    resets.append(undo["path"])
                    continue  # the directory stays with the spared processes: its record stays pending
            elif op in UNDO:
                changed = UNDO[op](undo, check) or changed
            else:
                raise ValueError(f"unknown journal op {op!r}")
            undone.append(record["id"])
        except (OSError, ValueError, KeyError) as exc:
            errors.append("{} {}: {}".format(op, record.get("id"), exc))
    if check:
        survivors = find_tagged(p["run_id"], p["host"], None, spare)
    else:
        found, survivors = reap(p["run_id"], p["host"], None, p["grace_s"], spare)
        reaped.extend(found)
        changed = changed or bool(found)
    handed_over: list[dict[str, Any]] = []
    if resets and not check:  # the spared processes start their results anew, in the emptied directory
        for tag in sorted(spare):
            procs = find_tagged(p["run_id"], p["host"], tag)
            if not procs:  # its condition is not in force any more: the next variant must not run on it
                errors.append(f"the spared process {tag!r} of run {p['run_id']} is not running")
            for proc in procs:
                with contextlib.suppress(OSError):
                    os.kill(proc["pid"], signal.SIGHUP)
                    handed_over.append(proc)
    result = {
        "changed": changed,
        "undone": [] if check else undone,
        "reaped": reaped,
        "survivors": survivors,
        "refused": refused,
        "removed_results": removed,
        "unfetched": unfetched,
        "kept": kept,
        "kept_records": kept_records,
        "reset": resets,
        "handed_over": handed_over,
    }
    if refused:
        errors.append(
            "{} journal record(s) refused, outside what the run could have changed here: {}".format(
                len(refused), ", ".join(str(r["id"]) for r in refused)
            )
        )
    if errors or (survivors and not check):
        msg = "; ".join(errors)
        if survivors:
            msg = ("processes of run {} survive on {}: {}. ".format(p["run_id"], p["host"], survivors)) + msg
        module.fail_json(msg=msg.strip(), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
