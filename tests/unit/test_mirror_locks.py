"""Every lock under requirements/ is consistent with pyproject.toml and fully hashed (issue 6, part 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.version import Version

from dit.mirror import locks

REPO = Path(__file__).resolve().parents[2]
REQ = REPO / "requirements"
PYPROJECT = locks.read_pyproject(REPO / "pyproject.toml")
SPECS = [pytest.param(spec, id=spec.name) for spec in locks.LOCKS]


def _environment(spec: locks.LockSpec) -> dict[str, str]:
    return {
        "python_version": locks.PYTHON_VERSION,
        "python_full_version": locks.PYTHON_VERSION + ".0",
        "platform_machine": spec.arch,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }


def _applies(req: Requirement, spec: locks.LockSpec) -> bool:
    return req.marker is None or Marker(str(req.marker)).evaluate(_environment(spec))


@pytest.mark.parametrize("spec", SPECS)
def test_lock_is_fully_pinned_and_hashed(spec: locks.LockSpec) -> None:
    lock = locks.read_lock(REQ / f"{spec.name}.txt")
    assert lock.pins, f"{spec.name}.txt pins nothing"
    assert lock.unhashed == (), f"{spec.name}.txt: lines without --hash=sha256: {lock.unhashed}"
    assert lock.options == (), f"{spec.name}.txt carries options: {lock.options}"
    for pin in lock.pins.values():
        assert "--hash=sha256:" in pin.line
        assert all(len(h) == 64 for h in pin.hashes)
        Version(pin.version)  # a real version, not a range
    text = (REQ / f"{spec.name}.txt").read_text(encoding="utf-8")
    requirement_lines = [ln for ln in text.splitlines() if ln and not ln.startswith((" ", "#"))]
    assert all("==" in ln for ln in requirement_lines)


@pytest.mark.parametrize("spec", SPECS)
def test_lock_header_names_its_target(spec: locks.LockSpec) -> None:
    lock = locks.read_lock(REQ / f"{spec.name}.txt")
    assert lock.header["name"] == spec.name
    assert lock.header["arch"] == spec.arch
    assert lock.header["platform"] == spec.platform.uv_platform
    assert lock.header["python"] == locks.PYTHON_VERSION
    assert lock.header["tool"] == f"uv-{locks.UV_VERSION}"
    assert lock.sources == spec.sources


@pytest.mark.parametrize("spec", SPECS)
def test_every_dependency_of_its_groups_is_pinned_within_its_specifier(spec: locks.LockSpec) -> None:
    lock = locks.read_lock(REQ / f"{spec.name}.txt")
    problems: list[str] = []
    for raw in locks.group_requirements(spec, PYPROJECT):
        req = Requirement(raw)
        if not _applies(req, spec):
            continue
        name = locks.canonical(req.name)
        wanted = [req]
        if name in spec.replace:  # a declared platform replacement: its own specifier must hold
            replacement, reason = spec.replace[name]
            assert reason, f"{spec.name}: replacement of {name} gives no reason"
            wanted = [Requirement(replacement)]
        for want in wanted:
            pin = lock.pins.get(locks.canonical(want.name))
            if pin is None:
                problems.append(f"{want.name} ({raw}) is not pinned")
            elif not want.specifier.contains(pin.version, prereleases=True):
                problems.append(f"{want.name}=={pin.version} does not satisfy {want} ({raw})")
    assert not problems, f"requirements/{spec.name}.txt vs pyproject.toml: " + "; ".join(problems)


@pytest.mark.parametrize("spec", SPECS)
def test_input_file_is_generated_from_the_current_pyproject(spec: locks.LockSpec) -> None:
    current = (REQ / f"{spec.name}.in").read_text(encoding="utf-8")
    assert current == locks.input_text(spec, PYPROJECT), (
        f"requirements/{spec.name}.in is stale: run `python -m dit.mirror lock {spec.name}`"
    )


@pytest.mark.parametrize("spec", [pytest.param(s, id=s.name) for s in locks.LOCKS if s.constrain])
def test_constrained_locks_agree_with_their_constraints(spec: locks.LockSpec) -> None:
    lock = locks.read_lock(REQ / f"{spec.name}.txt")
    for other_name in spec.constrain:
        other = locks.read_lock(REQ / f"{other_name}.txt")
        for name in set(lock.pins) & set(other.pins):
            assert lock.pins[name].version == other.pins[name].version, (
                f"{name}: {spec.name} pins {lock.pins[name].version}, {other_name} pins {other.pins[name].version}"
            )


def test_platform_replacements_are_the_documented_ones() -> None:
    edge, device_llm = locks.LOCKS_BY_NAME["edge"], locks.LOCKS_BY_NAME["device-llm"]
    assert locks.read_lock(REQ / "edge.txt").pins["torch"].version.endswith("+cpu")
    assert "tensorflow-cpu" in locks.read_lock(REQ / "edge.txt").pins
    for name in ("device", "device-llm"):
        pins = locks.read_lock(REQ / f"{name}.txt").pins
        assert "tensorflow" in pins and "tensorflow-cpu" not in pins
        assert not [p for p in pins if p.startswith(("nvidia-", "cuda-")) or p == "triton"], name
    assert "torch" in edge.replace and "torch" in device_llm.replace
    assert "torch" not in locks.read_lock(REQ / "dev.txt").pins  # optional extras stay out of the dev lock
    assert "tensorflow-cpu" not in locks.read_lock(REQ / "dev.txt").pins


def test_dev_lock_holds_the_build_backend_for_the_editable_install() -> None:
    pins = locks.read_lock(REQ / "dev.txt").pins
    for raw in PYPROJECT["build-system"]:
        req = Requirement(raw)
        assert req.specifier.contains(pins[locks.canonical(req.name)].version)
    assert "editables" in pins and "pip" in pins


def test_read_lock_parses_uv_output(tmp_path: Path) -> None:
    path = tmp_path / "x.txt"
    path.write_text(
        "# This file was autogenerated by uv via the following command:\n"
        "#    python -m dit.mirror lock\n"
        "# dit-lock: name=x arch=aarch64 platform=aarch64-manylinux_2_28 python=3.11 tool=uv-1 sources=a,b\n"
        "Foo_Bar==1.0 \\\n"
        f"    --hash=sha256:{'a' * 64} \\\n"
        f"    --hash=sha256:{'B' * 64}\n"
        "    # via\n"
        "    #   baz\n"
        "plain==2.0  # comment\n",
        encoding="utf-8",
    )
    lock = locks.read_lock(path)
    assert lock.name == "x" and lock.arch == "aarch64" and lock.sources == ("a", "b")
    assert lock.pins["foo-bar"].version == "1.0"
    assert lock.pins["foo-bar"].hashes == {"a" * 64, "b" * 64}
    assert lock.unhashed == ("plain==2.0",)
    assert lock.owner_of("b" * 64) == lock.pins["foo-bar"] and lock.owner_of("c" * 64) is None
    path.write_text("foo>=1\n", encoding="utf-8")
    with pytest.raises(locks.LockError, match="not a pinned requirement"):
        locks.read_lock(path)


def test_compile_command_targets_the_lock_platform_with_hashes() -> None:
    spec = locks.LOCKS_BY_NAME["device-llm"]
    argv = locks.compile_command(spec, "uv", REQ, {})
    assert argv[:4] == ["uv", "pip", "compile", "requirements/device-llm.in"]
    assert "--generate-hashes" in argv
    assert argv[argv.index("--python-platform") + 1] == "aarch64-manylinux_2_28"
    assert argv[argv.index("--python-version") + 1] == "3.11"
    assert argv[argv.index("--constraint") + 1] == "requirements/device.txt"
    assert argv[argv.index("--only-binary") + 1] == ":all:"
    with pytest.raises(locks.LockError, match="torch-cpu"):
        locks.compile_command(locks.LOCKS_BY_NAME["edge"], "uv", REQ, {})
    edge = locks.compile_command(locks.LOCKS_BY_NAME["edge"], "uv", REQ, {"torch-cpu": "/w"}, upgrade=True)
    assert edge[edge.index("--find-links") + 1] == "/w" and edge[-1] == "--upgrade"


def test_pip_platform_tags_cover_older_manylinux() -> None:
    tags = locks.PLATFORMS["aarch64"].pip_platforms()
    assert tags[0] == "manylinux_2_28_aarch64" and "manylinux_2_17_aarch64" in tags
    assert "manylinux2014_aarch64" in tags and not any("x86_64" in t for t in tags)
    assert "manylinux1_x86_64" in locks.PLATFORMS["x86_64"].pip_platforms()


def test_device_locks_hold_the_ina260_reader() -> None:
    """The boards read their INA260 through smbus2, installed from the mirror with the device lock."""
    assert [r for r in PYPROJECT["power"] if locks.requirement_name(r) == "smbus2"]
    for name in ("device", "device-llm"):
        assert "power" in locks.LOCKS_BY_NAME[name].groups, name
        pin = locks.read_lock(REQ / f"{name}.txt").pins["smbus2"]
        assert pin.hashes, name
    assert "smbus2" not in locks.read_lock(REQ / "dev.txt").pins  # the controller never opens an I2C bus
