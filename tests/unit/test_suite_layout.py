"""The test suite's own layout."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_test_modules_have_unique_names() -> None:
    """Test directories are not packages: two test files with one name break collection of the suite."""
    names = [p.name for root in ("tests", "runtimes") for p in (REPO / root).rglob("test_*.py")]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
