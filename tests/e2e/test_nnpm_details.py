"""NNPM's smaller behaviours in a real browser (issue 49 item 6): no console error on a version load, the
node name's format said, the dry-run dialog modal above the toolbar, a refused run's error inside the page."""

from __future__ import annotations

import json
import shutil
import time
from typing import Any

import pytest

from dit.run.rundir import write_json
from tests.conftest import REPO
from tests.e2e.conftest import ARTIFACTS, Server, shot

pytestmark = pytest.mark.e2e

REFUSED = "details_refused/20261201T120000Z-dddddddd"
HELD = (
    "preflight: device1: node device1 is leased by run 20261201T100000Z-aaaaaaaa (controller lab-controller-"
    "with-a-long-name, pid 712345, since 2026-12-01 10:00 UTC, run directory /var/lib/dit/runs/"
    "a_scenario_with_a_long_name/20261201T100000Z-aaaaaaaa), which is still running: wait for it or "
    "'dit stop /var/lib/dit/runs/a_scenario_with_a_long_name/20261201T100000Z-aaaaaaaa'"
)

KEPT = "device1: kept /var/lib/dit/nodes/device1/" + "x" * 150  # a path without a space to break at


def console_errors(page: Any) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    return errors


def test_a_version_loads_without_a_console_error(page: Any) -> None:
    """Every version load asked for its last dry run and logged a 404 when it had none."""
    errors = console_errors(page)
    page.click("#tab-scenarios")
    page.click("#new-scenario")
    page.fill("#scenario-form [name='name']", "details_quiet")
    page.click("#save-button")
    page.wait_for_selector("#version-hash")
    page.click("#stored-list li[data-name=details_quiet]")
    page.wait_for_function("() => !document.getElementById('run-button').disabled")
    page.wait_for_timeout(500)  # the dry-run look-up's answer
    assert page.locator("#dry-last").is_hidden()
    assert errors == []


def test_a_bad_node_name_says_the_format(page: Any) -> None:
    """The browser said only "Please match the requested format"; the field now says the format."""
    page.click("#tab-map")
    page.click("#add-node-toggle")
    box = page.locator("#map").bounding_box()
    page.mouse.click(box["x"] + 300, box["y"] + 200)
    page.wait_for_selector("#node-dialog[open]")
    page.fill("#node-form input[name=name]", "9 lab pi")
    page.fill("#node-form input[name=address]", "127.0.0.9")
    page.click("#node-save")
    slot = page.locator("#node-form .err[data-for=name]")
    slot.wait_for()
    page.wait_for_function(
        "() => document.querySelector('#node-form .err[data-for=name]').textContent !== ''"
    )
    assert slot.inner_text() == "letters, digits, '_' and '-', starting with a letter (at most 63)"
    shot(page, "61-node-name-format")
    page.click("#node-form button[value=cancel]")
    page.click("#add-node-toggle")


def test_the_dry_run_dialog_is_modal_above_the_toolbar(page: Any, server: Server) -> None:
    page.click("#tab-scenarios")
    page.click("#stored-list li[data-name=details_quiet]")
    page.wait_for_function("() => !document.getElementById('run-button').disabled")
    version = page.locator("#version-hash").inner_text()
    kept = {"version": {"name": "details_quiet", "hash": version}, "mode": "local", "ok": True,
            "finished_ns": time.time_ns(), "dry_runs": [], "log_tail": ""}  # fmt: skip
    (server.runs / ".nnpm" / "dry-runs").mkdir(parents=True, exist_ok=True)
    write_json(server.runs / ".nnpm" / "dry-runs" / f"{version}.local.json", kept)
    page.select_option("#run-mode", "local")
    page.dispatch_event("#run-mode", "change")
    page.wait_for_selector("#dry-last:not([hidden])")
    page.click("#dry-last")
    page.wait_for_selector("#dry-run-dialog[open]")
    assert page.evaluate("document.getElementById('dry-run-dialog').matches(':modal')")
    on_top = page.evaluate(
        "() => { const r = document.getElementById('dry-run-title').getBoundingClientRect();"
        " return document.elementFromPoint(r.left + 5, r.top + r.height / 2).id; }"
    )
    assert on_top == "dry-run-title"  # not under the sticky toolbar
    shot(page, "62-dry-run-modal")
    page.click("#dry-run-dialog button[value=close]")
    page.wait_for_selector("#dry-run-dialog:not([open])", state="attached")


def test_a_refused_runs_error_stays_inside_the_page(page: Any, server: Server) -> None:
    path = server.runs / REFUSED
    shutil.copytree(REPO / "tests" / "fixtures" / "run_small", path)
    start = time.time_ns() - 60 * 10**9
    write_json(
        path / "driver.json", {"pid": 1, "host": "elsewhere", "local": True, "scenario_hash": "0" * 64}
    )
    status = {"state": "failed", "label": "details_refused", "error": HELD, "ended_stage": "preflight",
              "started_wall_ns": start, "finished_wall_ns": start + 10**9, "stage_ns": {"teardown": 10**8},
              "teardown": {"ok": False, "errors": [KEPT]}}  # fmt: skip
    (path / "status.json").write_text(json.dumps(status), "utf-8")
    page.click("#tab-runs")
    page.click("#refresh-runs")
    page.click(f"#runs-table tr[data-key='{REFUSED}']")
    page.wait_for_selector("#run-title:has-text('details_refused')")
    error = page.locator("#run-no-inference")
    assert error.inner_text().startswith(
        "Refused by a node's lease during the preflight stage: preflight: device1"
    )
    assert page.locator("#run-meta tr", has_text="is leased by run").count() == 0  # said once, not twice
    right = page.evaluate("document.getElementById('run-page').getBoundingClientRect().right")
    teardown = page.locator("#run-meta tr", has_text="device1: kept").locator("td").last
    for cell in (error, teardown):  # a sentence, and a path without a space: both wrap inside the page
        assert cell.bounding_box()["x"] + cell.bounding_box()["width"] <= right
    assert page.evaluate(
        "() => { const p = document.getElementById('run-page'); return p.scrollWidth <= p.clientWidth; }"
    )
    shot(page, "63-refused-run-error-wraps")


def test_compare_opens_a_tab_with_every_run_in_view(page: Any, server: Server) -> None:
    """Compare only downloaded a file, which showed one run column at 1400 px."""
    keys = []
    for i in range(3):
        key = f"details_cmp{i}/20261201T13000{i}Z-0000000{i}"
        shutil.copytree(REPO / "tests" / "fixtures" / "run_small", server.runs / key)
        status = {"state": "completed", "label": f"details_cmp{i}", "stage_ns": {"profile": 10**9}}
        (server.runs / key / "status.json").write_text(json.dumps(status), "utf-8")
        keys.append(key)
    page.click("#tab-runs")
    page.click("#refresh-runs")
    for key in keys:
        page.check(f"#runs-table input[data-compare='{key}']")
    assert page.get_attribute("#compare-download", "download") == "compare.html"
    with page.context.expect_page() as opened:
        page.click("#compare-runs")
    view = opened.value
    view.wait_for_selector("#side-by-side table")
    assert view.viewport_size["width"] == 1400
    header = view.locator("#side-by-side table tr").first.locator("th, td")
    assert header.count() == 4  # the row name and one column per run
    right = max(b["x"] + b["width"] for b in (header.nth(i).bounding_box() for i in range(4)))
    assert right <= 1400, right  # every run's column in view, none scrolled away
    view.screenshot(path=str(ARTIFACTS / "64-compare-view-1400px.png"))
    view.close()
