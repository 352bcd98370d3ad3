"""Source archives (sdists) that runtimes build native binaries from, pinned by version and SHA-256.

``mirror/sources.yaml`` lists them under ``sdists:`` (``name``: the PyPI project, ``version``,
``sha256``). :func:`fetch_sdist` puts ``sdists/<project>-<version>.tar.gz`` into the mirror: kept when it
is already there with the pinned hash, else copied from a local directory (``--sdists-from``) when a
file there has the pinned hash, else downloaded from the package index's simple page (the link whose
file name is the expected one) and verified. A hash that differs stops the build with both hashes.
The first user is llama.cpp (``runtimes/llamacpp``, docs/llamacpp.md): the llama-cpp-python sdist
vendors it.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from dit.mirror.entries import NAME, SHA256_FIELD, Field, entry_values, read_sources
from dit.mirror.manifest import sha256_file

_FIELDS = {
    "name": Field("is not a project name", NAME),
    "version": Field("is not an exact version (quote it in YAML)", re.compile(r"^[0-9][0-9A-Za-z.+!-]*\Z")),
    "sha256": SHA256_FIELD,
}


class SdistError(RuntimeError):
    """A malformed ``sdists`` entry, or an archive that cannot be fetched or has the wrong hash."""


@dataclass(frozen=True)
class Sdist:
    name: str  # the PyPI project, e.g. llama-cpp-python
    version: str
    sha256: str

    @property
    def filename(self) -> str:
        """The sdist's file name on the index (PEP 625: normalised name with underscores)."""
        return f"{re.sub(r'[-_.]+', '_', self.name).lower()}-{self.version}.tar.gz"

    @property
    def project(self) -> str:
        """The project's normalised name (PEP 503), the simple index's page."""
        return re.sub(r"[-_.]+", "-", self.name).lower()


def load_sdists(path: Path) -> tuple[Sdist, ...]:
    """The ``sdists`` of a sources file (errors name the entry and field)."""
    doc = read_sources(path, SdistError)
    entries = (doc or {}).get("sdists") if isinstance(doc, dict) else None
    if entries is None:
        return ()
    if not isinstance(entries, list):
        raise SdistError(f"{path}: sdists: not a list")
    out: list[Sdist] = []
    for i, entry in enumerate(entries):
        out.append(Sdist(*entry_values(entry, f"{path}: sdists[{i}]", _FIELDS, SdistError)))
    return tuple(out)


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs.extend(v for k, v in attrs if k == "href" and v)


def index_link(page_url: str, html: str, filename: str) -> str:
    """The absolute URL of ``filename`` among the links of a simple-index page (no fragment)."""
    parser = _Links()
    parser.feed(html)
    for href in parser.hrefs:
        url = urllib.parse.urljoin(page_url, href)
        path = urllib.parse.urlsplit(url).path
        if path.rsplit("/", 1)[-1] == filename:
            return url.split("#", 1)[0]
    raise SdistError(f"{page_url}: no link to {filename}")


def _download(url: str, dest: Path) -> None:
    with urllib.request.urlopen(url, timeout=120) as response, dest.open("wb") as out:  # noqa: S310
        shutil.copyfileobj(response, out)


def fetch_sdist(
    sdist: Sdist,
    dest_dir: Path,
    index_url: str,
    local_dirs: Sequence[Path],
    log: Callable[[str], None],
    download: Callable[[str, Path], None] = _download,
) -> Path:
    """``dest_dir/<filename>`` with the pinned SHA-256 (see the module docstring)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / sdist.filename
    if dest.is_file() and sha256_file(dest) == sdist.sha256:
        return dest
    for directory in local_dirs:
        candidate = directory / sdist.filename
        if candidate.is_file():
            found = sha256_file(candidate)
            if found != sdist.sha256:
                raise SdistError(f"{candidate}: SHA-256 {found}, pinned {sdist.sha256} ({sdist.name})")
            log(f"sdists: copy {candidate}")
            shutil.copyfile(candidate, dest)
            return dest
    page = f"{index_url.rstrip('/')}/{sdist.project}/"
    with tempfile.TemporaryDirectory(dir=dest_dir) as tmp:
        page_file = Path(tmp) / "page.html"
        try:
            download(page, page_file)
            url = index_link(page, page_file.read_text(encoding="utf-8", errors="replace"), sdist.filename)
            log(f"sdists: download {url}")
            part = Path(tmp) / sdist.filename
            download(url, part)
        except OSError as exc:
            raise SdistError(f"{sdist.name} {sdist.version}: cannot fetch from {page}: {exc}") from exc
        found = sha256_file(part)
        if found != sdist.sha256:
            raise SdistError(f"{url}: SHA-256 {found}, pinned {sdist.sha256} ({sdist.name})")
        part.replace(dest)
    return dest
