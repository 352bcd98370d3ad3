"""dit.device.tags: one spelling of the run's process tags, the node-side modules' included."""

from __future__ import annotations

import re

from dit.device import tags
from tests.ansible_modules import module_util
from tests.conftest import REPO


def test_module_utils_spells_the_tags_like_dit() -> None:
    node_side = module_util("dit_procs")
    names = ("RUN_ENV", "HOST_ENV", "TAG_ENV", "START_AT_ENV", "START_AT_FILE_ENV", "PREPARED_FILE_ENV")
    for name in (*names, "START_WAIT_TIMEOUT_ENV"):
        assert getattr(node_side, name) == getattr(tags, name), name


def test_no_other_module_of_dit_spells_the_run_tag_out() -> None:
    literal = re.compile(r"""["']DIT_RUN_ID|b["']DIT_RUN_ID|f["']DIT_RUN_ID""")
    spelled = [
        str(path.relative_to(REPO))
        for path in sorted((REPO / "src" / "dit").rglob("*.py"))
        if path.name != "tags.py" and literal.search(path.read_text(encoding="utf-8"))
    ]
    assert spelled == []
