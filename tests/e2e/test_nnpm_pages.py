"""NNPM's pages read like the CLI (issue 16 items 4-7), in a real browser, on hand-assembled runs.

No ``dit run`` of its own: the run pages are two copies of tests/fixtures/run_small (aggregated here,
a monitor trace and the run's own optimiser result added; one made a benchmark that ran no inference).
Item 7's dialog starts one benchmark against an inventory without hosts, which fails in seconds.
Screenshots: tests/e2e/artifacts/31-…36-*.png (docs/nnpm.md).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from dit.run.rundir import write_json
from tests.conftest import REPO
from tests.e2e.conftest import HeldRequests, Server, shot

pytestmark = pytest.mark.e2e

RUN_ORDER = ["preflight", "apply", "profile", "collect", "aggregate", "optimise", "teardown"]
DEMO = "pages_demo/20261201T100000Z-aaaaaaaa"
BENCH = "pages_bench/20261201T110000Z-bbbbbbbb"
BAD = "rgb(209, 53, 43)"  # --bad


def _fixture_run(runs: Path, key: str, stages: list[str]) -> Path:
    path = runs / key
    shutil.copytree(REPO / "tests" / "fixtures" / "run_small", path)
    start = time.time_ns() - 60 * 10**9
    stage_ns = {s: 1_234_567 * (i + 3) for i, s in enumerate(stages)}
    write_json(
        path / "driver.json", {"pid": 1, "host": "elsewhere", "local": True, "scenario_hash": "0" * 64}
    )
    write_json(path / "metadata.json", {"model": {"spec": {"name": "fake", "params": {"stages": 3}}}})
    status = {"state": "completed", "label": path.parent.name, "started_wall_ns": start,
              "finished_wall_ns": start + 42_500_000_000, "stage_ns": dict(sorted(stage_ns.items()))}  # fmt: skip
    (path / "status.json").write_text(json.dumps(status, sort_keys=True), "utf-8")  # alphabetical, as on disk
    (path / "run.log").write_text("2026-12-01T10:00:00.000Z device1 stdout ready\n", "utf-8")
    return path


@pytest.fixture(scope="module")
def runs(server: Server) -> dict[str, Path]:
    from dit.analysis.aggregate import aggregate_run
    from dit.analysis.run import LoadedRun
    from dit.optimise.api import optimise_run

    demo = _fixture_run(server.runs, DEMO, RUN_ORDER)
    optimise_run(demo, None, None, None, None)  # aggregates, then the run's own search (greedy, SJF)
    rows = ["node,t_ns,metric,value"]
    for node, base in (("device1", 30.0), ("device2", 55.0), ("edge", 12.0)):
        for i in range(40):
            t = i * 250_000_000
            rows += [
                f"{node},{t},cpu_pct,{base + (i % 7) * 4}",
                f"{node},{t},cpu0_freq_khz,{1_500_000 - (i % 3) * 300_000}",
                f"{node},{t},thermal_zone0_temp_c,{45 + i / 8:.2f}",
            ]
        if node == "device1":  # local mode's fake sensor (issue 36: labelled, never shown as measured)
            rows += [f"{node},{i * 250_000_000},power_w,{2.5 + (i % 5) * 0.1:.2f}" for i in range(40)]
    (demo / "aggregate" / "monitors.csv").write_text("\n".join(rows) + "\n", "utf-8")
    (demo / "aggregate" / "power_summary.csv").write_text(
        "node,sensor,samples,duration_ns,energy_j,mean_power_w\ndevice1,fake,40,9750000000,26.3,2.7\n",
        "utf-8",
    )
    # the runtime's summary: its energy figures come from that fake sensor (issue 49 item 3)
    values = [
        ("tokens_per_s", 3.5, "1/s"),
        ("energy", 2.4, "J"),
        ("energy_per_token", 0.3, "J"),
        ("edp", 0.9, "J*s"),
    ]
    summary = [{"name": n, "value": v, "unit": u, "type": "float"} for n, v, u in values]
    write_json(demo / "aggregate" / "summary.json", {"runtime": "layers", "tables": [], "values": summary})
    # two repetitions of three tokens on device1: the summary's decode token latency spread (issue 49 item 7)
    (demo / "raw" / "device1" / "device1_tokens.csv").write_text(
        "rep,token,start_ns,latency_ns,kv_len\n0,0,0,9000000,4\n0,1,9000000,3000000,5\n0,2,12000000,5000000,6\n"
        "1,0,0,8000000,4\n1,1,8000000,4000000,5\n1,2,12000000,6000000,6\n",
        "utf-8",
    )

    bench = _fixture_run(server.runs, BENCH, [s for s in RUN_ORDER if s != "optimise"])
    scenario = (bench / "scenario.yaml").read_text("utf-8")
    scenario = scenario.replace("inference: {enabled: true,", "inference: {enabled: false,")
    (bench / "scenario.yaml").write_text(
        scenario.replace("optimisation: {enabled: true", "optimisation: {enabled: false"), "utf-8"
    )
    aggregate_run(LoadedRun.of(bench))
    (bench / "aggregate" / "phases_summary.csv").write_text("host,round,partition_point,n\n", "utf-8")
    write_json(bench / "nnpm.json", {"kind": "benchmark", "mode": "local"})
    return {"demo": demo, "bench": bench}


def open_run(page: Any, key: str) -> None:
    page.click("#tab-runs")
    page.click(f"#runs-table tr[data-key='{key}']")
    page.wait_for_selector(f"#run-title:has-text('{key.split('/', maxsplit=1)[0]}')")


def test_the_run_page_reads_like_the_cli(page: Any, runs: dict[str, Path]) -> None:
    """Item 4: stages in run order, phases in ms that fit, the model as text, plot axes with units."""
    open_run(page, DEMO)
    page.wait_for_selector("#run-phases tbody tr")
    assert (
        page.locator("#run-stages tr[data-stage]").evaluate_all("rs => rs.map(r => r.dataset.stage)")
        == RUN_ORDER
    )
    assert page.locator("#run-stages tr[data-stage=preflight] td.num").inner_text() == "3.70 ms"
    assert page.locator("[data-testid=run-model]").inner_text() == "fake · stages=3"  # no JSON quotes
    assert '"' not in page.locator("#run-meta").inner_text()
    headers = page.locator("#run-phases th").evaluate_all("hs => hs.map(h => h.firstChild.textContent)")
    assert headers[:3] == ["device", "round", "p"] and "transmission" in headers and "local_ns" not in headers
    assert page.locator("#run-phases th[data-column=queue_ns]").get_attribute("title")
    cells = page.locator("#run-phases tbody td").all_inner_texts()
    assert "14.0 ms" in cells and "12.0 kB" in cells
    assert not [c for c in cells if c.isdigit() and len(c) > 4], "a raw nanosecond value is shown"
    # the total's spread beside its mean (dit.results.spread): mean ± 95 % CI, then p50 / p95 / p99
    assert "20.2 ± 1.27 ms" in cells and "20.1 / 20.4 / 20.4 ms" in cells
    assert page.locator("#run-phases th[data-column=total_ns] .small").inner_text() == "mean ± 95 % CI"
    tokens = page.locator("#run-summary tr.token-spread[data-host=device1]")
    assert "4.50 ± 2.05 ms" in tokens.inner_text() and "4.00 / 6.00 / 6.00 ms" in tokens.inner_text()
    page.locator("#run-phases").scroll_into_view_if_needed()
    shot(page, "31-run-page-spread")
    # the table fits its pane, or scrolls under a first column that stays put: never cut off
    box = page.locator("#run-phases-box .scroll")
    fits = box.evaluate("b => b.scrollWidth <= b.clientWidth")
    first = page.locator("#run-phases tbody td").first.evaluate("td => getComputedStyle(td).position")
    assert fits or first == "sticky"
    pane = page.locator("#run-page").bounding_box()
    table_box = box.bounding_box()
    assert table_box["x"] + table_box["width"] <= pane["x"] + pane["width"] + 1
    # the monitor plot: every axis labelled with its unit, time from the common origin
    page.wait_for_function(
        "() => (document.querySelector('#run-plots img[data-plot=monitors]') || {}).naturalWidth > 0"
    )
    assert "common origin (s)" in page.locator("#run-plots img[data-plot=monitors]").get_attribute("alt")
    # the monitors plot holds device1's power from the fake sensor: said above it, never plain
    note = page.locator("#run-power-note")
    assert note.is_visible() and "Fake power sensor on device1" in note.inner_text()
    assert "not measured" in note.inner_text()
    page.wait_for_function(
        "() => document.querySelector('#run-plots img[data-plot=layers]').naturalWidth > 0"
    )
    shot(page, "31-run-page-units")
    # every energy figure of the runtime's summary says it is modelled, beside it; tokens/s does not
    modelled = page.locator("#run-summary tr[data-modelled='1']")
    assert modelled.evaluate_all("rs => rs.map(r => r.dataset.name)") == ["energy", "energy_per_token", "edp"]
    assert all("modelled: fake sensor" in t for t in modelled.all_inner_texts())
    assert "modelled" not in page.locator("#run-summary tr[data-name=tokens_per_s]").inner_text()
    assert "Fake power sensor on device1" in page.locator("#run-summary .energy-note").inner_text()
    page.locator("#run-summary").scroll_into_view_if_needed()
    shot(page, "31a-run-summary-modelled")
    page.locator("#run-plots img[data-plot=monitors]").scroll_into_view_if_needed()
    shot(page, "31b-run-page-monitors")


def test_optimise_results_have_units_a_legend_and_mark_predictions(page: Any, runs: dict[str, Path]) -> None:
    """Item 5: one unit throughout, L/T/R/D explained, the dialog on the run's own settings, predictions marked."""
    open_run(page, DEMO)
    own = page.locator(".optimise-table[data-file='greedy-total_delay-SJF.json']")
    own.wait_for()
    caption = own.locator("caption").inner_text()
    assert "total_delay" in caption and " ms" in caption and "e+" not in caption and " ns" not in caption
    assert own.get_attribute("data-measured") == "1" and own.locator(".badge.measured").count() == 1
    terms = own.locator("th[data-term]")
    assert terms.all_inner_texts() == ["local L", "transmission T", "remote R", "delay D"]
    assert "L + T + R" in (own.locator("th[data-term=D]").get_attribute("title") or "")
    assert "transmission" in page.locator("#optimise-legend").inner_text()
    assert all(t.endswith(("ms", "µs", "ns", " s")) for t in own.locator("td.num").all_inner_texts())

    page.click("#open-optimise")
    form = "#optimise-form select"
    # the run's own settings, not the first of each list (exhaustive, RR)
    assert page.locator(f"{form}[name=algorithm]").input_value() == "greedy"
    assert page.locator(f"{form}[name=objective]").input_value() == "total_delay"
    assert page.locator(f"{form}[name=policy]").input_value() == "SJF"
    assert "prediction" in page.locator(f"{form}[name=policy] option[value=RR]").inner_text()
    page.select_option(f"{form}[name=policy]", "RR")
    page.click("#optimise-run")
    other = page.locator(".optimise-table[data-file='greedy-total_delay-RR.json']")
    other.wait_for()
    assert other.get_attribute("data-measured") == "0"
    assert other.locator(".badge.prediction").inner_text() == "prediction"
    assert "ran SJF" in other.locator(".prediction-reason").inner_text()
    other.scroll_into_view_if_needed()
    shot(page, "32-optimise-units-prediction")


def fill(page: Any, path: str, value: str) -> None:
    page.locator(f"#scenario-form [name='{path}']").fill(value)
    page.locator(f"#scenario-form [name='{path}']").dispatch_event("change")


def test_form_errors_are_red_current_and_linked_and_the_diff_reads_old_to_new(page: Any) -> None:
    """Item 6: problems red and all listed with links, the count current, units by inputs, diff older → newer."""
    page.click("#tab-scenarios")
    page.click("#new-scenario")
    fill(page, "name", "pages_form")
    fill(page, "devices", "device1, device2")
    assert page.locator("#scenario-form .field[data-path='timing.start_lead_s'] .unit").inner_text() == "s"
    assert (
        page.locator("#scenario-form .field[data-path='network.device1.delay_ms'] .unit").inner_text() == "ms"
    )
    assert (
        page.locator("#scenario-form .field[data-path='hardware.device1.memory_limit_mb'] .unit").inner_text()
        == "MiB"
    )
    fill(page, "repetitions", "0")
    fill(page, "timing.start_lead_s", "0")
    page.click("#validate-button")
    page.wait_for_selector("#form-errors:not([hidden])")
    assert page.locator("#save-result").is_hidden()  # never in the green box
    assert page.locator("#error-count").inner_text().startswith("2 problems")
    assert page.locator("#form-errors").evaluate("e => getComputedStyle(e).color") == BAD
    links = page.locator("#error-list li a")
    assert links.all_inner_texts() == ["repetitions", "timing.start_lead_s"]
    assert page.locator("#error-count").is_visible()  # nothing scrolled it away
    shot(page, "33-form-errors-listed")
    links.nth(1).click()
    assert page.evaluate("() => document.activeElement.name") == "timing.start_lead_s"

    fill(page, "repetitions", "2")
    page.click("#save-button")  # still one problem: the count follows, nothing saved
    page.wait_for_function(
        "() => document.getElementById('error-count').textContent.startsWith('1 problem:')"
    )
    assert page.locator("#error-list li").count() == 1 and page.locator("#save-result").is_hidden()
    assert page.locator("#run-button").is_disabled()

    fill(page, "timing.start_lead_s", "1")
    page.click("#save-button")
    page.wait_for_selector("#version-hash")
    assert page.locator("#form-errors").is_hidden()
    first = page.locator("#version-hash").inner_text()
    fill(page, "seed", "42")
    fill(page, "description", "a second version with a deliberately long description line " * 3)
    page.click("#save-button")
    page.wait_for_function(f"() => document.getElementById('version-hash').textContent !== '{first}'")

    # the history the Save listed is ticked while opening the scenario refreshes it (held here until the
    # boxes are ticked, as a slow server does): the refresh keeps the ticks (CI once found Diff disabled).
    # The Save's own refresh asks the same URL: it must have landed before the hold, or it is held too
    # (a loaded CI run found the list still at the first Save's one version).
    page.wait_for_function("() => document.querySelectorAll('#history-list input').length === 2")
    held = HeldRequests(page, "**/api/scenarios/pages_form/versions")
    page.click("#stored-list li[data-name=pages_form]")
    page.wait_for_function("() => document.querySelectorAll('#history-list input').length === 2")
    boxes = page.locator("#history-list input")
    boxes.nth(0).check()  # newest first: ticking top to bottom names the newer version first
    boxes.nth(1).check()
    held.release("opening the stored scenario did not ask for its versions")
    page.wait_for_selector("#version-hash")
    assert boxes.nth(0).is_checked() and boxes.nth(1).is_checked()
    page.click("#diff-button")
    page.wait_for_selector("#diff-dialog[open]")
    added = page.locator("#diff-output .line.add").all_inner_texts()
    removed = page.locator("#diff-output .line.del").all_inner_texts()
    assert "+seed: 42" in added and "-seed: 0" in removed
    assert page.locator("#diff-output .line.add").first.is_visible()
    assert page.locator("#diff-title").inner_text().startswith(f"pages_form: {first[:12]}")
    dialog = page.locator("#diff-dialog").bounding_box()
    assert dialog["width"] >= 0.85 * 1400
    assert page.locator("#diff-output .line").first.evaluate("l => getComputedStyle(l).whiteSpace") == "pre"
    shot(page, "34-diff-older-newer")
    page.click("#diff-dialog button[value=close]")


def test_a_number_the_browser_cannot_read_is_an_error_at_its_field(page: Any) -> None:
    """Issue 36 item 4: "2e" in Warm-up is not dropped and saved as the default: the field says why."""
    page.click("#tab-scenarios")
    page.click("#new-scenario")
    fill(page, "name", "pages_badnumber")
    fill(page, "devices", "device1")
    warmup = page.locator("#scenario-form [name='warmup']")
    warmup.press_sequentially("2e")  # a number input takes "e" (an exponent) and reads "" while it is bad
    assert warmup.evaluate("i => i.validity.badInput")
    page.click("#save-button")
    page.wait_for_selector("#form-errors:not([hidden])")
    assert page.locator("#error-list li a").all_inner_texts() == ["warmup"]
    error = page.locator("#scenario-form .field[data-path='warmup'] .field-error").inner_text()
    assert "is not a number" in error
    assert page.locator("#save-result").is_hidden() and page.locator("#run-button").is_disabled()
    shot(page, "36-bad-number-at-field")
    warmup.fill("2")
    page.click("#save-button")
    page.wait_for_selector("#version-hash")
    assert page.locator("#form-errors").is_hidden()


def test_saving_a_file_unchanged_gives_the_cli_hash(page: Any) -> None:
    """Issue 36 item 6: the form writes back only what the file holds, so the version is the CLI run's."""
    from dit.scenario import expand, load_yaml

    cli_hash = expand(load_yaml(REPO / "scenarios" / "quickstart.yaml"))[
        0
    ].hash  # the run's, as `dit run` names it
    page.click("#tab-scenarios")
    page.click("#file-list li:text-is('quickstart.yaml')")
    page.wait_for_function(
        "() => document.querySelector(\"#scenario-form [name='name']\").value === 'quickstart'"
    )
    page.click("#save-button")
    page.wait_for_selector("#version-hash")
    assert page.locator("#version-hash").inner_text() == cli_hash


def test_benchmarking_is_a_dialog_and_its_run_page_offers_no_optimise(
    page: Any, server: Server, runs: dict[str, Path]
) -> None:
    """Item 7: the profiling options in a dialog, checked by the server; a benchmark's page has no phases."""
    server.inventory.write_text("all:\n  hosts: {}\n", "utf-8")  # the benchmark started below fails at once
    page.click("#tab-scenarios")
    page.click("#stored-list li[data-name=pages_form]")
    page.wait_for_function("() => !document.getElementById('bench-button').disabled")
    page.click("#bench-button")
    page.wait_for_selector("#bench-dialog[open] #bench-fields [name=repetitions]")
    fields = page.locator("#bench-fields [name]").evaluate_all("xs => xs.map(x => x.name)")
    assert {"repetitions", "warmup", "seed", "edge_server.profile_capacity", "monitors.interval_s"} <= set(
        fields
    )
    assert "inference.enabled" not in fields and "model" not in fields
    assert page.locator("#bench-fields [name=repetitions]").input_value() == "2"  # the version's own
    assert page.locator("#bench-fields .field[data-path='monitors.interval_s'] .unit").inner_text() == "s"
    page.fill("#bench-fields [name=repetitions]", "0")
    page.click("#bench-run")
    page.wait_for_selector("#bench-fields .field.invalid[data-path=repetitions]")
    assert "repetitions" in page.locator("#bench-errors").inner_text()
    shot(page, "35-benchmark-dialog")

    page.fill("#bench-fields [name=repetitions]", "4")
    page.fill("#bench-fields [name='monitors.interval_s']", "0.5")
    page.select_option("#bench-mode", "inventory")
    with page.expect_response(
        lambda r: r.url.endswith("/api/runs") and r.request.method == "POST"
    ) as started:
        page.click("#bench-run")
    answer = started.value.json()
    assert started.value.status == 202 and answer["kind"] == "benchmark"
    version = page.request.get(server.url + f"api/versions/{answer['version']['hash']}").json()
    document = version["document"]
    assert document["repetitions"] == 4 and document["monitors"]["interval_s"] == 0.5
    assert document["inference"]["enabled"] is False and document["optimisation"]["enabled"] is False
    page.wait_for_selector("#bench-dialog:not([open])", state="attached")

    open_run(page, BENCH)
    page.wait_for_selector("#run-no-inference:not([hidden])")
    assert page.locator("#open-optimise").is_hidden()
    assert page.locator("#run-phases-box").is_hidden()
    # what profiling measured
    page.wait_for_function(
        "() => (document.querySelector('#run-plots img[data-plot=layers]') || {}).naturalWidth > 0"
    )
    shot(page, "36-benchmark-run-page")


def test_a_benchmarks_derived_version_is_listed_marked_but_never_opened(page: Any, server: Server) -> None:
    """Issue 49 item 2: after the benchmark above, pages_form opens on the version the researcher saved,
    with Run on it; the benchmark's derived version (inference and optimisation off) is listed, marked."""
    history = page.request.get(server.url + "api/scenarios/pages_form/versions").json()
    derived = [v for v in history["versions"] if v["derived"]]
    assert len(derived) == 1 and history["versions"][0] == derived[0]  # the newest of the name
    page.reload()
    page.wait_for_selector("body[data-ready='1']")
    page.click("#tab-scenarios")
    page.click("#stored-list li[data-name=pages_form]")
    page.wait_for_function("() => !document.getElementById('run-button').disabled")
    opened = page.locator("#version-hash").inner_text()
    assert opened == history["opens"] == derived[0]["derived_from"]
    item = page.locator(f"#history-list li[data-hash='{derived[0]['hash']}']")
    assert "benchmark, derived from " + opened[:12] in item.inner_text()
    assert item.locator("a:not([data-runs-of])").count() == 0  # no link opens it in the editor
    assert opened[:12] in page.locator("#stored-list li[data-name=pages_form]").inner_text()
    shot(page, "37-derived-version-listed-not-opened")


def test_a_second_run_waits_its_turn_then_starts_after_the_first(page: Any, server: Server) -> None:
    """Issue 49 item 1: with one run going and nothing waiting, Run queues at position 1 behind it (the
    header keeps the going run), and the queue starts it once that run ends."""
    import os

    deadline = time.monotonic() + 60  # the benchmark above (an inventory without hosts) ends in seconds
    while page.request.get(server.url + "api/queue").json()["holder"] and time.monotonic() < deadline:
        time.sleep(0.5)
    going = server.runs / "pages_going" / "20261201T120000Z-cccccccc"
    going.mkdir(parents=True)
    (going / "status.json").write_text(
        json.dumps({"state": "running", "stage": "profile", "label": "pages_going"})
    )
    write_json(going / "driver.json", {"pid": os.getpid(), "host": os.uname().nodename, "local": True})
    holder = "pages_going/20261201T120000Z-cccccccc"
    page.click("#tab-scenarios")
    page.click("#stored-list li[data-name=pages_form]")
    page.wait_for_function("() => !document.getElementById('run-button').disabled")
    version = page.locator("#version-hash").inner_text()
    page.select_option("#run-mode", "inventory")  # no hosts: the run, once started, fails in seconds
    before = page.evaluate("JSON.stringify(window.nnpm.state.run)")
    with page.expect_response(lambda r: r.url.endswith("/api/runs") and r.request.method == "POST") as asked:
        page.click("#run-button")
    assert asked.value.status == 202 and "launch" not in asked.value.json()
    page.wait_for_selector(f"#queued-note:has-text('queued at position 1, waiting for {holder}')")
    assert page.evaluate("JSON.stringify(window.nnpm.state.run)") == before  # no second driver followed
    page.click("#tab-runs")
    page.wait_for_function("() => document.querySelectorAll('#queue-list li').length === 1")
    assert holder in page.locator("#queue-holder").inner_text()
    page.wait_for_selector(f"#runs-table tr[data-key='{holder}'] .state.running")
    shot(page, "38-second-run-queued")
    ended_ns = time.time_ns()
    (going / "status.json").write_text(json.dumps({"state": "completed", "label": "pages_going"}))
    mine: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while not mine and time.monotonic() < deadline:
        time.sleep(0.5)
        mine = [
            r for r in page.request.get(server.url + "api/runs").json()["runs"] if r["version"] == version
        ]
    assert len(mine) == 1 and mine[0]["started_wall_ns"] > ended_ns, mine
    assert page.request.get(server.url + "api/queue").json()["entries"] == []
    page.click("#refresh-runs")
    page.wait_for_selector(f"#runs-table tr[data-key='{mine[0]['key']}']")
    page.wait_for_selector("#queue-box", state="hidden")
