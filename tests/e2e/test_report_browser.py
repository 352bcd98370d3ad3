"""The report of the quickstart and of a two-variant sweep, opened from disk in Chromium: every section renders.

Screenshots go to tests/e2e/artifacts/report-*.png (docs/report.md shows them).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from dit.report.build import write_report
from tests.conftest import DIT, REPO, dit_env
from tests.e2e.conftest import ARTIFACTS
from tests.report_fixtures import report_run

pytestmark = pytest.mark.e2e
SECTIONS = ("facts", "stages", "runtime", "phases", "layers", "feasibility", "monitors", "power",
            "validation", "optimise", "netem")  # fmt: skip


def open_offline(browser_context: Any, html: Path) -> tuple[Any, list[str]]:
    page = browser_context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    page.on("requestfailed", lambda request: problems.append(f"request failed: {request.url}"))
    page.on("request", lambda r: None if r.url.startswith(("file:", "data:")) else problems.append(r.url))
    page.goto(html.as_uri())
    return page, problems


def test_quickstart_report_renders_every_section(browser_context: Any, tmp_path: Path) -> None:
    """The README's quickstart, run for real in local mode, then its report opened from disk."""
    runs = tmp_path / "runs"
    done = subprocess.run(
        [*DIT, "run", str(REPO / "scenarios" / "quickstart.yaml"), "--runs-dir", str(runs)],
        env=dit_env(), capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = runs.glob("quickstart/*")
    html = write_report(run)
    text = html.read_text()
    assert "No power trace" not in text and "No monitor traces" not in text  # the quickstart has both
    page, problems = open_offline(browser_context, html)
    for anchor in SECTIONS:
        assert page.locator(f"section#{anchor} h2").is_visible(), anchor
    images = page.locator("img")
    assert images.count() >= 3
    for i in range(images.count()):  # every inlined figure decoded
        assert page.evaluate("(img) => img.naturalWidth > 0", images.nth(i).element_handle())
    page.screenshot(path=str(ARTIFACTS / "report-run.png"), full_page=True)
    assert problems == []
    page.close()


def test_sweep_report_renders(browser_context: Any, tmp_path: Path) -> None:
    runs = tmp_path / "small"
    runs.mkdir()
    for rtt, speed in ((0, 4.0), (25, 2.0)):
        report_run(runs / f"run-{rtt}", [["network.device1.delay_ms", rtt]], speed)
    page, problems = open_offline(browser_context, write_report(runs))
    assert page.locator("section#variants tbody tr").count() == 2
    assert page.locator("section#along img").count() >= 2
    page.screenshot(path=str(ARTIFACTS / "report-sweep.png"), full_page=True)
    assert problems == []
    page.close()


def test_a_reproduce_report_opens_offline_with_every_section(browser_context: Any, tmp_path: Path) -> None:
    """`dit reproduce`'s report (Chapter 5's: no run needed to render it) is as self-contained as a run's."""
    from rich.console import Console

    from dit.reproduce.report import reproduce

    def not_run(*_: Any) -> tuple[None, str, str]:  # renders the report without running the chapter
        return None, "failed", "not run by this test"

    html = reproduce("ch5", "quick", tmp_path / "ch5", None, "local mode", Console(quiet=True), not_run)
    page, problems = open_offline(browser_context, html)
    for anchor in ("overview", "profiles"):
        assert page.locator(f"section#{anchor} h2").is_visible(), anchor
    cells = page.locator("section#profiles td").all_inner_texts()
    assert "one attention head 2.4 to 6.5 ms per token on a board" in cells
    assert "not measured" in cells
    assert problems == []
    page.close()
