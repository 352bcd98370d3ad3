"""NNPM and the runtime plug-ins in a real browser (issue 12 item 7, issue 16 item 2): the scenario form
renders the chosen runtime's block from its schema, the Runtimes page shows every installed runtime per
node with the real check's verdict (a node that does not answer is red with its reason), a maintenance
action's output streams to the terminal, and the run page shows the runtime's summary values with units.

The server runs with the fixture runtime ``echo`` installed (offline, into a throwaway directory on its
PYTHONPATH) and an inventory whose ``ghost`` is reached over ssh on a port nothing listens on, and whose
``lonely`` is a node of the map at a loopback address with nothing said of how to reach it (a local-mode
node); its mirror holds the echo runtime's build, which the Install button installs (issue 35 item 4)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from dit.mirror.build import host_arch
from dit.runtime_api.interface import Results, SummaryValue, write_summary
from tests.conftest import REPO, dit_env, free_port, install_fixture_package
from tests.e2e.conftest import HeldRequests, Server, shot, web_server
from tests.integration.test_web_api import finished_run

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("nnpm-runtimes")
    site = install_fixture_package("runtime_pkg", tmp_path_factory.mktemp("runtime"))
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    ghost = {  # ssh to a port nothing listens on: a node that does not answer
        "ansible_connection": "ssh",
        "ansible_host": "127.0.0.1",
        "ansible_port": free_port(),
        "ansible_user": "nobody",
        "ansible_ssh_common_args": "-o ConnectTimeout=3 -o BatchMode=yes",
    }
    hosts = {
        "edge": {**local, "ansible_host": "127.0.0.1"},
        "device1": {**local, "ansible_host": "127.0.0.2"},
        "ghost": ghost,
        "lonely": {"ansible_host": "127.0.0.3"},
    }
    for i, host in enumerate(hosts.values()):
        host.update({"dit_lat": 38.0 + i / 100, "dit_lon": 23.7 + i / 100})
    inventory = root / "inventory.yml"
    doc = {
        "all": {
            "vars": {"dit_python": sys.executable},
            "children": {
                "edge": {"hosts": {"edge": hosts["edge"]}},
                "devices": {"hosts": {h: hosts[h] for h in ("device1", "ghost", "lonely")}},
            },
        }
    }
    inventory.write_text(yaml.safe_dump(doc), "utf-8")
    runs = root / "runs"
    run = finished_run(runs)
    write_summary(
        run.path / "aggregate",
        "layers",
        Results(
            summary=(
                SummaryValue("tokens", 8, "", "int", "tokens generated after the prompt"),
                SummaryValue("token_latency_mean", 1234567.0, "ns", "float", "mean per-token latency"),
                SummaryValue("energy_per_token", 0.0042, "J", "float", "mean energy per generated token"),
            )
        ),
    )
    sources = REPO / "tests" / "fixtures" / "runtime_sources.yaml"  # declares the echo fixture runtime
    subprocess.run(
        [sys.executable, "-m", "dit.mirror", "build", "--out", str(root / "mirror"), "--skip-wheels",
         "--skip-debs", "--skip-sources", "--skip-weights", "--arch", host_arch(), "--sources", str(sources)],
        check=True, capture_output=True, env={**dit_env(), "PYTHONPATH": str(REPO / "src")},
    )  # fmt: skip
    env = dit_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    env |= {"DIT_MIRROR_DIR": str(root / "mirror"), "DIT_MIRROR_SOURCES": str(sources),
            "DIT_RUNTIMES_DIR": str(root / "runtimes")}  # fmt: skip
    with web_server(root, "--probe", "off", inventory=inventory, runs=runs, env=env) as running:
        yield running


def test_the_form_renders_the_chosen_runtimes_block(page: Any) -> None:
    page.click("#tab-scenarios")
    page.click("#new-scenario")
    name = "#scenario-form [name='runtime.name']"
    assert page.locator(f"{name} option[value=echo]").count() == 1  # the plug-in, from the registry
    page.select_option(name, "echo")
    page.wait_for_selector("#scenario-form [name='runtime.rounds']")
    # the fixture's schema: enum -> select, integers with their bounds and default as the placeholder
    placement = page.locator("#scenario-form select[name='runtime.placement'] option")
    assert {placement.nth(i).get_attribute("value") for i in range(placement.count())} >= {
        "round_robin",
        "greedy",
    }
    assert page.locator("#scenario-form [name='runtime.port']").get_attribute("min") == "1024"
    assert page.locator("#scenario-form [name='runtime.rounds']").get_attribute("placeholder") == "10"
    assert page.locator("#scenario-form [name='runtime.tokens']").count() == 0
    page.fill("#scenario-form [name='runtime.rounds']", "3")
    page.select_option("#scenario-form select[name='runtime.placement']", "greedy")
    value = page.evaluate("() => window.nnpm.state.form.read().value.runtime")
    assert value == {"name": "echo", "rounds": 3, "placement": "greedy"}
    shot(page, "21-form-runtime-echo")
    page.select_option(name, "layers")  # another runtime: its own block replaces echo's
    page.wait_for_selector("#scenario-form [name='runtime.tokens']")
    assert page.locator("#scenario-form [name='runtime.rounds']").count() == 0


def test_the_runtimes_page_shows_a_node_that_does_not_answer_as_unreachable(page: Any) -> None:
    page.click("#tab-runtimes")
    page.wait_for_selector("#runtime-results th:has-text('echo')")
    assert page.locator("#runtime-results th:has-text('layers')").count() == 1
    # nothing checked yet: no verdict, and no green dot
    assert page.locator("#runtime-results .dot.ok").count() == 0
    page.select_option("#runtime-which", "layers")
    page.check("#runtime-hosts input[value=ghost]")
    page.click("#runtime-check")
    ghost = "#runtime-results td[data-runtime=layers][data-host=ghost]"
    page.wait_for_selector(f"{ghost}[data-state=unreachable]", timeout=120_000)
    cell = page.locator(ghost)
    assert cell.locator(".dot.bad").count() == 1 and cell.locator(".dot.ok").count() == 0
    assert "unreachable" in cell.inner_text() and "ssh" in cell.locator(".reason").inner_text().lower()
    colour = cell.locator(".dot").evaluate("(d) => getComputedStyle(d).backgroundColor")
    assert colour == "rgb(209, 53, 43)"  # --bad
    page.wait_for_selector(
        "#runtime-results td[data-runtime=layers][data-host=device1][data-state=ok] .dot.ok"
    )
    # the local-mode node is checked on this machine: green, like its marker, not "ssh … refused"
    lonely = page.locator("#runtime-results td[data-runtime=layers][data-host=lonely]")
    page.wait_for_selector(
        "#runtime-results td[data-runtime=layers][data-host=lonely][data-state=ok] .dot.ok"
    )
    assert "ssh" not in lonely.inner_text().lower()
    # the terminal streamed the check's Ansible output
    page.wait_for_selector(".term .l:has-text('check: python')")
    shot(page, "22-runtimes-unreachable")


def test_a_maintenance_action_streams_to_the_terminal(page: Any) -> None:
    page.click("#tab-runtimes")
    page.wait_for_selector("#maintenance-action option[value='echo/say']", state="attached")
    page.select_option("#maintenance-action", "echo/say")
    page.wait_for_selector("#maintenance-inputs [name=message]")
    # the page's refresh (here held until the user has typed, as a slow server does) keeps the form
    # of the action still chosen and what was typed into it, and the hosts the user left out
    held = HeldRequests(page, "**/api/runtimes")
    page.click("#tab-scenarios")
    with page.expect_request("**/api/runtimes"):
        page.click("#tab-runtimes")
    page.uncheck("#runtime-hosts input[value=ghost]")
    page.fill("#maintenance-inputs [name=message]", "hello-from-nnpm")
    held.release("the runtimes tab did not ask the server again")
    page.wait_for_function("() => document.querySelector('#runtime-hosts input[value=ghost]') !== null")
    assert page.input_value("#maintenance-inputs [name=message]") == "hello-from-nnpm"
    assert not page.is_checked("#runtime-hosts input[value=ghost]")
    page.click("#maintenance-run")
    page.wait_for_selector(".term .l:has-text('hello-from-nnpm')", timeout=120_000)
    page.wait_for_selector("#maintenance-state:has-text('done')", timeout=120_000)
    shot(page, "23-runtimes-action-terminal")


def test_the_install_button_installs_the_runtime_then_checks_the_nodes(page: Any) -> None:
    page.click("#tab-runtimes")
    page.wait_for_selector("#install-runtime option[value=echo]", state="attached")
    assert page.locator("#install-runtime option[value=layers]").count() == 0  # built in: nothing to install
    page.select_option("#install-runtime", "echo")
    for host in ("ghost", "device1"):
        page.uncheck(f"#runtime-hosts input[value={host}]")
    page.check("#runtime-hosts input[value=lonely]")
    page.click("#install-run")
    # the role's output streams live, then the readiness check of the same node
    page.wait_for_selector(".term .l:has-text('Install the runtime and its requirements')", timeout=240_000)
    page.wait_for_selector("#install-state.completed", timeout=240_000)
    assert "ready 1 of 1" in page.inner_text("#install-state")
    page.wait_for_selector("#runtime-results td[data-runtime=echo][data-host=lonely][data-state=ok] .dot.ok")
    shot(page, "25-runtimes-install")


def test_the_run_page_shows_the_summary_values_with_units(page: Any) -> None:
    page.click("#tab-runs")
    page.click("#runs-table tr[data-key^='fixture_small/']")
    page.wait_for_selector("#run-summary-box:not([hidden])")
    rows = page.locator("#run-summary tr[data-name]")
    assert rows.count() == 3
    # written by dit.units, as dit show and the report write them (issue 49 item 6: 13.59 % vs 13.6 %)
    assert page.locator("#run-summary tr[data-name=token_latency_mean] td.num").inner_text() == "1.23 ms"
    assert page.locator("#run-summary tr[data-name=energy_per_token] td.num").inner_text() == "4.20 mJ"
    assert page.locator("#run-summary tr[data-name=tokens] td.num").inner_text() == "8"
    assert page.locator("#run-summary-runtime").inner_text() == "layers"
    shot(page, "24-run-summary-values")
