"""Lint what Ansible actually runs: render every stage playbook, then ansible-lint (production).

The stage playbooks are Jinja templates (``playbooks/*.yml.j2``) that ansible-lint cannot read as
they are. This renders each into a temporary project next to the roles, custom modules and
plugins, and runs ``ansible-lint --profile production`` on the result and on ``roles/``.
``python -m dit.devtools.lint_playbooks`` exits with ansible-lint's status.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from dit.conditions import EDGE_SERVICE_ORDER, conditions
from dit.paths import content_root
from dit.run.ansible_exec import ansible_env, render_playbook


def main() -> int:
    root = content_root()
    stages = sorted(p.name.removesuffix(".yml.j2") for p in (root / "playbooks").glob("*.yml.j2"))
    with tempfile.TemporaryDirectory(prefix="dit-lint-") as tmp:
        project = Path(tmp)
        roles = [c for c in conditions() if c.role is not None]
        context = {  # every condition active, so every role include is linted too
            "conditions_before": [c for c in roles if c.order < EDGE_SERVICE_ORDER],
            "conditions_after": [c for c in roles if c.order >= EDGE_SERVICE_ORDER],
        }
        for stage in stages:
            render_playbook(stage, project / "playbooks", context)
        for static in (root / "playbooks").glob("*.yml"):
            shutil.copy(static, project / "playbooks" / static.name)
        targets = [str(project / "playbooks")]
        if any((root / "roles").glob("*/tasks")):
            shutil.copytree(root / "roles", project / "roles")
            targets.append(str(project / "roles"))
        (project / ".ansible-lint").write_text("profile: production\noffline: true\n", encoding="utf-8")
        env = {**os.environ, **ansible_env()}
        lint = str(Path(sys.executable).parent / "ansible-lint")
        proc = subprocess.run(
            [lint, "--profile", "production", "--offline", "--nocolor", *targets],
            cwd=project,
            env=env,
            check=False,
        )
        return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
