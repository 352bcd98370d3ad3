"""mkdocs hook: the README is the site's home page (index.md), its links into docs/ made site-relative.

Links from the README to files outside docs/ (scenarios, sources) point at the repository tree and are
left out of the site's link check: they are checked by tests/unit/test_doc_citations.py instead.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]


def on_files(files: Files, config: Any) -> Files:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    text = re.sub(r"\]\(docs/", "](", text)
    files.append(File.generated(config, "index.md", content=text))
    return files
