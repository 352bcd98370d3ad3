"""What the prose says of the code, held to the code: command lists, checklist values, module and section names.

Each of these drifted once (issue 30): a docstring that listed 8 of the 11 commands, checklist rows
expecting a CPU quota the code no longer writes, module docs naming a module that moved, a pointer to
a section that was renamed.
"""

from __future__ import annotations

import re

import pytest
import typer.main
import yaml

import dit.cli
from dit.conditions.cpu_share import period_us, quota_us
from tests.conftest import REPO
from tests.names import resolves

README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_cli_docstring_names_every_command_and_group() -> None:
    click_app = typer.main.get_command(dit.cli.app)
    assert isinstance(click_app, typer.main.TyperGroup)
    doc = (dit.cli.__doc__ or "").split("\n\n")[0]
    named = set(re.findall(r"\b[a-z]+\b", doc))
    missing = sorted(set(click_app.commands) - named)
    assert not missing, f"src/dit/cli.py's docstring does not name {missing}"


@pytest.mark.parametrize("row", ["| CPU share: quota |", "| emulated rack on cgroup v2 |"])
def test_the_checklist_expects_the_cpu_quota_the_code_writes(row: str) -> None:
    line = next(line for line in README.splitlines() if line.startswith(row))
    share = int(re.search(r"(?:cpu_share_pct: |--cpu-share )(\d+)", line).group(1))  # type: ignore[union-attr]
    expected = line.split(" | ")[2]
    assert f"`{quota_us(share)} {period_us(share)}`" in expected, (
        f"README row {row!r}: {share} % is cpu.max `{quota_us(share)} {period_us(share)}` "
        f"(dit.conditions.cpu_share), the row expects {expected[:60]!r}"
    )


def test_the_checklist_clones_only_the_sources_the_mirror_serves() -> None:
    sources = yaml.safe_load((REPO / "mirror" / "sources.yaml").read_text(encoding="utf-8"))
    served = {entry["name"] for entry in sources.get("git") or []}
    cloned = set(re.findall(r"/sources/([\w.-]+)\.git", README))
    assert cloned <= served, (
        f"README clones {sorted(cloned - served)}; mirror/sources.yaml git: {sorted(served)}"
    )


FILE_SUFFIXES = {"conf", "json", "yml", "yaml", "log", "csv", "txt", "pyz", "sqlite"}


def _dit_names(text: str) -> set[str]:
    # not a path (/etc/sysctl.d/dit.conf), not a fragment slug of extends_documentation_fragment
    text = re.sub(r"(?m)^\s*- dit(\.\w+)?\s*$", "", text)
    names = {m.group(0) for m in re.finditer(r"(?<![\w/.-])dit(\.[A-Za-z_]\w*)+", text)}
    return {n for n in names if n.rpartition(".")[2] not in FILE_SUFFIXES}  # dit.conf is a file name


NAMED = sorted(
    {
        (str(path.relative_to(REPO)), name)
        for path in [*REPO.glob("library/*.py"), *REPO.glob("roles/*/README.md")]
        for name in _dit_names(path.read_text(encoding="utf-8"))
    }
)


@pytest.mark.parametrize(("where", "name"), NAMED)
def test_module_docs_and_role_readmes_name_modules_that_exist(where: str, name: str) -> None:
    assert resolves(name), f"{where} names {name}, which does not exist"


POINTERS = sorted(
    {
        (str(path.relative_to(REPO)), doc, title)
        for pattern in ("docs/*.md", "README.md", "src/dit/**/*.py", "runtimes/*/src/**/*.py")
        for path in REPO.glob(pattern)
        for doc, title in re.findall(
            r"docs/([\w-]+\.md),\s+\"([^\"]+)\"", re.sub(r"\s+", " ", path.read_text(encoding="utf-8"))
        )
    }
)


@pytest.mark.parametrize(("where", "doc", "title"), POINTERS)
def test_section_pointers_name_a_section_that_exists(where: str, doc: str, title: str) -> None:
    headings = re.findall(r"(?m)^#+ (.+?)\s*$", (REPO / "docs" / doc).read_text(encoding="utf-8"))
    assert title in headings, f'{where} points to docs/{doc}, "{title}", which has no such section'


def test_the_readme_opening_says_what_is_measured_and_how_precisely() -> None:
    opening = README.split("\n\n")[1]
    assert "nanosecond-precise" not in opening
    assert "0.03" in opening and "0.5 ms" in opening and "nanoseconds" in opening


def test_no_stale_path_of_the_old_layout_is_left() -> None:
    """The run engine and the doc tools moved into packages; their old module paths name nothing."""
    old = re.compile(
        r"(?<![\w/.-])dit\.(driver|ansible_exec|journal|rundir|reporter|settle|roledoc|schemadoc)\b"
    )
    hits = [
        f"{path.relative_to(REPO)}: {m.group(0)}"
        for pattern in (
            "docs/*.md",
            "README.md",
            "src/dit/**/*.py",
            "library/*.py",
            "roles/*/README.md",
            "dev",
        )
        for path in REPO.glob(pattern)
        for m in old.finditer(path.read_text(encoding="utf-8"))
    ]
    assert not hits, hits


def test_every_page_of_docs_is_in_the_site_s_nav() -> None:
    """./dev docs builds strictly: a page left out of mkdocs.yml's nav fails CI's last phase (sweeps.md did)."""
    site = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(entries: list[object]) -> set[str]:
        found: set[str] = set()
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            found |= pages(value) if isinstance(value, list) else {str(value)}
        return found

    missing = sorted(p.name for p in (REPO / "docs").glob("*.md") if p.name not in pages(site["nav"]))
    assert not missing, f"docs pages not in mkdocs.yml's nav: {missing}"
