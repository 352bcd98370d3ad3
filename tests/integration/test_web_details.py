"""NNPM's smaller behaviours over its API (issue 49 item 6), on a server with no run of its own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from dit.web.app import WebConfig
from dit.web.security import REPORT_CSP
from tests.conftest import REPO
from tests.integration.conftest import StartNnpm


@pytest.fixture
def client(tmp_path: Path, nnpm: StartNnpm) -> TestClient:
    config = WebConfig(inventory=tmp_path / "inv.yml", runs_dir=tmp_path / "runs",
                       scenarios_dir=REPO / "scenarios", probe="off")  # fmt: skip
    return nnpm(config)


def save(client: TestClient, document: dict[str, object]) -> str:
    saved = client.post("/api/scenarios", json={"document": document})
    assert saved.status_code in (200, 201), saved.text
    return str(saved.json()["version"]["hash"])


DOC = {"name": "details", "model": "fake", "devices": ["device1"]}


def test_which_dry_runs_a_version_kept_is_asked_without_a_404(client: TestClient, tmp_path: Path) -> None:
    """Every version the page opened asked for its last dry run and got a 404 (a console error) when it
    had none: the page now asks which modes have one, always answered."""
    version = save(client, DOC)
    kept = client.get(f"/api/versions/{version}/dry-runs")
    assert kept.status_code == 200 and kept.json() == {"local": None, "inventory": None}
    folder = tmp_path / "runs" / ".nnpm" / "dry-runs"
    folder.mkdir(parents=True)
    (folder / f"{version}.local.json").write_text(json.dumps({"ok": True, "finished_ns": 7}), "utf-8")
    assert client.get(f"/api/versions/{version}/dry-runs").json() == {"local": {"finished_ns": 7, "ok": True},
                                                                    "inventory": None}  # fmt: skip
    assert client.get(f"/api/versions/{version}/dry-run", params={"mode": "local"}).json()["finished_ns"] == 7
    assert client.get(f"/api/versions/{'0' * 64}/dry-runs").status_code == 404


def fixture_runs(runs: Path, count: int = 2) -> list[str]:
    """``count`` copies of tests/fixtures/run_small under ``runs``, completed; their keys."""
    keys = []
    for i in range(count):
        key = f"details_{i}/20261201T10000{i}Z-0000000{i}"
        shutil.copytree(REPO / "tests" / "fixtures" / "run_small", runs / key)
        status = {"state": "completed", "label": f"details_{i}", "stage_ns": {"profile": 10**9}}
        (runs / key / "status.json").write_text(json.dumps(status), "utf-8")
        keys.append(key)
    return keys


def test_a_comparison_is_viewed_in_the_browser_as_wide_as_the_window(
    client: TestClient, tmp_path: Path
) -> None:
    """Compare only downloaded a file, whose 60 rem page showed one run column at 1400 px."""
    keys = fixture_runs(tmp_path / "runs", 3)
    query = [("runs", k) for k in keys]
    viewed = client.get("/api/compare/report", params=[*query, ("view", "true")])
    assert viewed.status_code == 200, viewed.text
    assert "content-disposition" not in viewed.headers  # read in the browser, not downloaded
    assert viewed.headers.get_list("content-security-policy") == [REPORT_CSP]  # its own, sandboxed, alone
    assert '<body class="wide">' in viewed.text and "body.wide { max-width: none; }" in viewed.text
    download = client.get("/api/compare/report", params=query)
    assert download.headers["content-disposition"] == 'attachment; filename="compare.html"'
    assert "style-src 'self'" in download.headers["content-security-policy"]  # NNPM's own policy
