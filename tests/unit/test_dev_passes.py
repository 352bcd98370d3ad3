"""``./dev test``'s serial pass collects only ``tests/integration`` (collecting the whole suite to select
its few tests cost it 15 s of wall time): a test marked serial anywhere else would never run there."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERIAL = re.compile(r"\bmark\.serial\b")


def test_every_serial_test_of_dev_test_lives_in_tests_integration() -> None:
    marked = sorted(
        path.relative_to(REPO).as_posix()
        for root in (REPO / "tests", *sorted((REPO / "runtimes").glob("*/tests")))
        for path in root.rglob("*.py")
        if SERIAL.search(path.read_text(encoding="utf-8"))
    )
    assert "tests/integration/test_rack.py" in marked  # the scan finds them
    elsewhere = [p for p in marked if not p.startswith(("tests/integration/", "tests/slow/"))]
    assert elsewhere == [], (
        f"serial tests outside tests/integration would be skipped by ./dev test: {elsewhere}"
    )
    dev = (REPO / "dev").read_text(encoding="utf-8")
    assert "serial_paths=(tests/integration)" in dev  # the pass this test keeps honest
