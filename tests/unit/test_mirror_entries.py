"""dit.mirror.entries: the one check of a sources list's entry (git sources, sdists, checkpoints)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dit.mirror import checkpoints, sdists, sources
from dit.mirror.entries import NAME, SHA256_FIELD, Field, entry_values

FIELDS = {
    "name": Field("is not a plain name", NAME),
    "sha256": SHA256_FIELD,
    "url": Field("is not a URL ({name})"),
}


class Refused(RuntimeError):
    pass


def test_the_values_come_in_field_order() -> None:
    entry = {"url": "http://x", "sha256": "a" * 64, "name": "x"}
    assert entry_values(entry, "list[0]", FIELDS, Refused) == ("x", "a" * 64, "http://x")


@pytest.mark.parametrize(
    ("entry", "closed", "message"),
    [
        ("x", True, "list[0]: not a mapping"),
        ({"name": "x", "sha256": "a" * 64, "url": "u", "extra": 1}, True, "list[0]: unknown field(s) extra"),
        ({"name": "-x", "sha256": "a" * 64, "url": "u"}, True, "list[0].name: '-x' is not a plain name"),
        (
            {"name": "x", "sha256": "A" * 64, "url": "u"},
            True,
            "list[0].sha256: '" + "A" * 64 + "' is not a SHA-256",
        ),
        ({"name": "x", "sha256": "a" * 64, "url": "", "extra": 1}, False, "list[0].url: '' is not a URL (x)"),
    ],
)
def test_a_refusal_names_the_entry_or_the_field(entry: object, closed: bool, message: str) -> None:
    with pytest.raises(Refused, match="^" + re.escape(message)):
        entry_values(entry, "list[0]", FIELDS, Refused, closed=closed)


def test_every_list_of_the_sources_file_is_checked_by_it(tmp_path: Path) -> None:
    doc = tmp_path / "sources.yaml"
    doc.write_text("git: [[]]\nsdists: [[]]\ncheckpoints: [[]]\n", encoding="utf-8")
    with pytest.raises(sources.SourcesError, match=re.escape(f"{doc}: git[0]: not a mapping")):
        sources.load_sources(doc)
    with pytest.raises(sdists.SdistError, match=re.escape(f"{doc}: sdists[0]: not a mapping")):
        sdists.load_sdists(doc)
    with pytest.raises(
        checkpoints.CheckpointMirrorError, match=re.escape(f"{doc}: checkpoints[0]: not a mapping")
    ):
        checkpoints.load_checkpoints(doc)
