"""Wall time of the apply and teardown stages in local mode (five devices and the edge server), against
Ansible's own floor on the same hosts.

DESIGN.md's target: apply + teardown <= 4 s. Each repetition is a real ``dit run`` of a scenario with no
conditions (the fake model, inference off): the stages' times are the driver's own (status.json
``stage_ns``), so the benchmark follows whatever the stages do. Preflight to collect share one
``ansible-playbook`` start (dit.run.ansible_exec.StageSession) and teardown has its own: apply's time holds
no start of its own, so preflight + apply + teardown is printed too, and the starts the run made (its
ansible-runner artifact directories). The floor is two bare ansible-runner
launches (apply and teardown are two playbooks) of one trivial task (``ansible.builtin.ping``, one module
call per host) over the same hosts, with the driver's Ansible configuration and forks: no stage can cost
less. Prints each repetition, the medians and the ratio.

    .venv/bin/python benchmarks/bench_stages.py [--repetitions 3] [--devices 5]
    .venv/bin/python benchmarks/bench_stages.py --smoke      # one repetition, one device: the same path
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ansible_runner
import yaml

from dit.run.ansible_exec import ansible_env
from dit.run.inventory import local_inventory

FLOOR_PLAY = [
    {
        "name": "floor",
        "hosts": "all",
        "gather_facts": False,
        "tasks": [{"name": "one trivial task", "ansible.builtin.ping": {}}],
    }
]


def scenario(directory: Path, devices: tuple[str, ...]) -> Path:
    doc = {
        "name": "bench_stages",
        "model": {"name": "fake", "params": {"profile": "tiny"}},
        "devices": list(devices),
        "repetitions": 1,
        "warmup": 0,
        "inference": {"enabled": False},
        "optimisation": {"enabled": False},
        "edge_server": {"profile_min_s": 0.2},
        "timing": {"start_lead_s": 1.0},
    }
    path = directory / "bench_stages.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def stages(devices: tuple[str, ...]) -> tuple[dict[str, float], int]:
    """One real run: the wall time of each stage in seconds, as the driver recorded it, and its
    ansible-playbook starts."""
    with tempfile.TemporaryDirectory(prefix="dit-bench-") as tmp:
        runs = Path(tmp) / "runs"
        done = subprocess.run(
            [sys.executable, "-m", "dit", "run", str(scenario(Path(tmp), devices)), "--runs-dir", str(runs)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(
                f"bench_stages: dit run failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
            )
        (status_path,) = runs.glob("*/*/status.json")
        status = json.loads(status_path.read_text(encoding="utf-8"))
        if status.get("state") != "completed":
            raise SystemExit(f"bench_stages: the run ended {status.get('state')!r}: {status_path}")
        starts = len(list(status_path.parent.glob("ansible/*/artifacts/*")))
        return {stage: ns / 1e9 for stage, ns in status["stage_ns"].items()}, starts


def floor(devices: tuple[str, ...]) -> float:
    """Two bare ansible-runner launches of one trivial task over the run's hosts, in seconds."""
    with tempfile.TemporaryDirectory(prefix="dit-bench-floor-") as tmp:
        inv = local_inventory(Path(tmp), devices)
        project = Path(tmp) / "project"
        project.mkdir()
        (project / "floor.yml").write_text(yaml.safe_dump(FLOOR_PLAY, sort_keys=False), encoding="utf-8")
        private = [Path(tmp) / f"launch{launch}" for launch in range(2)]
        for directory in private:
            directory.mkdir()
        start = time.monotonic()
        for directory in private:
            runner = ansible_runner.run(
                private_data_dir=str(directory),
                project_dir=str(project),
                playbook="floor.yml",
                inventory=inv.source,
                limit=inv.limit,
                envvars=ansible_env(),
                quiet=True,
                forks=max(5, len(inv.hosts)),
            )
            if runner.status != "successful":
                raise SystemExit(f"bench_stages: the floor playbook ended {runner.status}")
        return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--devices", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="one repetition with one device (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.repetitions, args.devices = 1, 1
    devices = tuple(f"device{i}" for i in range(1, args.devices + 1))
    rows, withs, floors = [], [], []
    for rep in range(args.repetitions):
        times, starts = stages(devices)
        floors.append(floor(devices))
        rows.append(times["apply"] + times["teardown"])
        withs.append(times["preflight"] + rows[-1])
        print(
            f"rep {rep}: preflight {times['preflight']:.2f} s  apply {times['apply']:.2f} s  "
            f"teardown {times['teardown']:.2f} s  apply+teardown {rows[-1]:.2f} s  "
            f"preflight+apply+teardown {withs[-1]:.2f} s  ansible-playbook starts {starts}  "
            f"Ansible floor (2 launches x 1 task) {floors[-1]:.2f} s"
        )
    total, whole, base = statistics.median(rows), statistics.median(withs), statistics.median(floors)
    print(
        f"median apply+teardown with {args.devices} devices + edge: {total:.2f} s (target <= 4 s); "
        f"Ansible's floor on the same hosts {base:.2f} s; ratio {total / base:.1f}x; "
        f"preflight+apply+teardown {whole:.2f} s, ratio {whole / base:.1f}x"
    )


if __name__ == "__main__":
    main()
