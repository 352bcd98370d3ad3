"""dit.runtimes.helpers: the controller and workers of a runtime block, memory limits, the results file, a table."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from dit.analysis.run import LoadedRun
from dit.runtimes.helpers import (
    RuntimeBlockError,
    controller_host,
    find_results,
    memory_limit_bytes,
    memory_limits,
    worker_hosts,
    write_csv,
)

DEVICES = ("device1", "device2", "device3")


class MyError(ValueError):
    pass


def test_the_controller_is_the_edge_server_by_default_or_a_device() -> None:
    assert controller_host({}, "edgeserver", DEVICES) == "edgeserver"
    assert controller_host({"controller": "edge"}, "edgeserver", DEVICES) == "edgeserver"
    assert controller_host({"controller": "edgeserver"}, "edgeserver", DEVICES) == "edgeserver"
    assert controller_host({"controller": "device2"}, "edgeserver", DEVICES) == "device2"
    with pytest.raises(
        MyError, match=r"runtime.controller: 'board7' is neither the edge server nor a device"
    ):
        controller_host({"controller": "board7"}, "edgeserver", DEVICES, error=MyError)


def test_default_workers_exclude_the_controller_only_when_asked() -> None:
    # llama.cpp: every other device works; HeadSplit: every device, so a device controller needs a list
    assert worker_hosts({}, DEVICES, "device1", default_excludes_controller=True) == ["device2", "device3"]
    assert worker_hosts({}, DEVICES, "edgeserver", default_excludes_controller=False) == list(DEVICES)
    with pytest.raises(RuntimeBlockError, match=r"runtime.workers: absent, .* 'device1' is the controller's"):
        worker_hosts({}, DEVICES, "device1", default_excludes_controller=False)


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"workers": []}, r"runtime.workers: needs at least 1 worker"),
        ({"workers": ["device2", "device9"]}, r"runtime.workers\[1\]: 'device9' is not a device"),
        ({"workers": ["device2", "device1"]}, r"runtime.workers\[1\]: 'device1' is the controller's node"),
        ({"workers": ["device2", "device2"]}, r"runtime.workers\[1\]: 'device2' is listed twice"),
    ],
)
def test_listed_workers_are_checked_with_the_offending_index(block: dict[str, Any], message: str) -> None:
    for excludes in (True, False):
        with pytest.raises(MyError, match=message):
            worker_hosts(block, DEVICES, "device1", default_excludes_controller=excludes, error=MyError)


def test_memory_limits_are_bytes_of_the_devices_that_have_one() -> None:
    scenario = {"hardware": {"device1": {"memory_limit_mb": 512}, "device2": {"memory_limit_mb": True}}}
    assert memory_limit_bytes(scenario, "device1") == 512 * 1024 * 1024
    assert memory_limit_bytes(scenario, "device2") == 0 and memory_limit_bytes({}, "device1") == 0
    assert memory_limits(scenario, DEVICES) == {"device1": 512 * 1024 * 1024}


def test_the_results_file_is_found_once_and_tables_are_written(tmp_path: Path) -> None:
    with pytest.raises(MyError, match=r"found no raw/<host>/<host>_x\.json"):
        find_results(LoadedRun(tmp_path), "x.json", error=MyError)
    (tmp_path / "raw" / "edge").mkdir(parents=True)
    (tmp_path / "raw" / "edge" / "edge_x.json").write_text("{}", encoding="utf-8")
    assert find_results(LoadedRun(tmp_path), "x.json") == ("edge", tmp_path / "raw" / "edge" / "edge_x.json")
    (tmp_path / "raw" / "device1").mkdir()
    (tmp_path / "raw" / "device1" / "device1_x.json").write_text("{}", encoding="utf-8")
    with pytest.raises(MyError, match="expected the controller's results file once"):
        find_results(LoadedRun(tmp_path), "x.json", error=MyError)
    table = write_csv(tmp_path / "aggregate" / "t.csv", ["a", "b"], [[1, "x"], [2, ""]])
    with table.open(encoding="utf-8") as handle:
        assert list(csv.reader(handle)) == [["a", "b"], ["1", "x"], ["2", ""]]
