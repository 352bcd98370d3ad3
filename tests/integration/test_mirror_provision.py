"""The offline mirror end to end (issue 6): a small mirror is built for this machine's architecture from a
small test lock (pure-Python wheels from PyPI), a few Debian packages and a local bare git repository,
verified, served on loopback with ``python -m http.server``, and a node directory's venv is provisioned
from it by ``roles/provision_venv`` with no index and hashes required. A corrupted mirror file is refused
by ``mirror/verify`` (exit 1, naming the file), by ``roles/mirror_serve`` and by the install, which then
leaves nothing installed. ``playbooks/provision.yml`` runs in check mode against the rack example
inventory with every node a directory under a temporary root.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from dit.mirror.build import host_arch

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ARCH = host_arch()
DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}[ARCH]
HAVE_TF = importlib.util.find_spec("tensorflow") is not None
PACKAGES = ("six", "idna", "packaging")

# A small lock as `uv pip compile --generate-hashes` writes it (wheel and sdist hashes of each pin).
TEST_LOCK = """\
# dit-lock: name=smalltest python=3.11
idna==3.10 \\
    --hash=sha256:12f65c9b470abda6dc35cf8e63cc574b1c52b11df2c86030af0ac09b01b13ea9 \\
    --hash=sha256:946d195a0d259cbba61165e88e65941f16e9b36ea6ddb97f00452bae8b1287d3
packaging==24.2 \\
    --hash=sha256:09abb1bccd265c01f4a3aa3f7a7db064b36514d2cba19a2f694fe6150451a759 \\
    --hash=sha256:c228a6dc5e932d346bc5739379109d49e8853dd8223571c7c5b55260edc0b97f
six==1.17.0 \\
    --hash=sha256:4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274 \\
    --hash=sha256:ff70335d468e7eb6ec65b95b99d3a2836546063f63acc5171de367e834932a81
"""
VERSIONS = {"idna": "3.10", "packaging": "24.2", "six": "1.17.0"}
PI_CMDLINE = (
    "console=serial0,115200 console=tty1 root=PARTUUID=4e639091-02 rootfstype=ext4 fsck.repair=yes rootwait\n"
)
# The part of Raspberry Pi OS bookworm's stock config.txt that matters here (I2C commented out).
PI_CONFIG = (
    "# Uncomment some or all of these to enable the optional hardware interfaces\n"
    "#dtparam=i2c_arm=on\n#dtparam=spi=on\n\ndtparam=audio=on\narm_64bit=1\n\n[cm4]\notg_mode=1\n\n[all]\n"
)


def _git(*args: str, cwd: Path | None = None) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env, check=True)
    return proc.stdout.strip()


def _origin_repo(root: Path) -> tuple[Path, str]:
    """A bare 'upstream' whose pinned commit is only reachable from refs/pull/1/head (as on GitHub),
    so the builder's clone does not hold it and must fetch it by id."""
    work = root / "work"
    _git("init", "-q", "-b", "main", str(work))
    (work / "runtime.py").write_text("VERSION = 'main'\n")
    _git("add", ".", cwd=work)
    _git("commit", "-q", "-m", "main", cwd=work)
    _git("checkout", "-q", "-b", "pr", cwd=work)
    (work / "runtime.py").write_text("VERSION = 'pinned'\n")
    _git("commit", "-q", "-am", "pinned", cwd=work)
    pinned = _git("rev-parse", "HEAD", cwd=work)
    origin = root / "upstream.git"
    _git("clone", "-q", "--bare", str(work), str(origin))
    _git("-C", str(origin), "update-ref", "refs/pull/1/head", pinned)
    _git("-C", str(origin), "branch", "-D", "pr")
    return origin, pinned


def _run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DIT_VENV": sys.prefix, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCALHOST_WARNING": "0"}
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env.update(kwargs.pop("env", {}))
    return subprocess.run(argv, capture_output=True, text=True, env=env, check=False, **kwargs)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("mirror")
    lock = root / "locks" / "smalltest.txt"
    lock.parent.mkdir()
    lock.write_text(TEST_LOCK)
    origin, pinned = _origin_repo(root / "git")
    sources = root / "sources.yaml"
    sources.write_text(
        yaml.safe_dump(
            {
                "debian": {
                    "archive": ["http://deb.debian.org/debian bookworm main"],
                    "architectures": [DEB_ARCH],
                    "packages": ["iperf3"],
                },
                "git": [{"name": "runtime", "url": f"file://{origin}", "commit": pinned}],
            }
        )
    )
    mirror = root / "site"
    weights = ["--model", "gru_vqp"] if HAVE_TF else ["--skip-weights"]
    started = time.monotonic()
    proc = _run(
        [
            str(REPO / "mirror/build"),
            "--out",
            str(mirror),
            "--lock",
            str(lock),
            "--sources",
            str(sources),
            *weights,
        ]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {
        "root": root,
        "mirror": mirror,
        "lock": lock,
        "pinned": pinned,
        "origin": origin,
        "seconds": time.monotonic() - started,
        "stdout": proc.stdout,
    }


@contextmanager
def serve(directory: Path) -> Iterator[str]:
    """``python -m http.server`` on a free loopback port; yields the base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "http.server",
            "--bind",
            "127.0.0.1",
            "--directory",
            str(directory),
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/manifest.json", timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def _role_play(tmp: Path, role: str, variables: dict[str, Any]) -> Path:
    """A one-role playbook against localhost (a node directory under a temporary root)."""
    play = [
        {
            "name": f"Run {role} on a node directory",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars": {"ansible_python_interpreter": sys.executable, **variables},
            "roles": [{"role": role}],
        }
    ]
    path = tmp / f"{role}.yml"
    path.write_text(yaml.safe_dump(play, sort_keys=False))
    return path


def _playbook(playbook: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return _run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(playbook), *extra])


def _installed(venv: Path) -> dict[str, str]:
    proc = subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "list", "--format=json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {p["name"].lower(): p["version"] for p in json.loads(proc.stdout)}


def _venv_vars(built: dict[str, Any], url: str, node: Path) -> dict[str, Any]:
    return {
        "dit_provision_root": str(node),
        "provision_venv_lock": "smalltest",
        "provision_venv_lock_dir": str(built["lock"].parent),
        "provision_venv_arch": ARCH,
        "provision_venv_mirror_url": url,
        "provision_venv_python": sys.executable,
    }


# ------------------------------------------------------------------------------------------------


def test_small_mirror_is_built_with_a_complete_manifest_and_verifies(built: dict[str, Any]) -> None:
    mirror: Path = built["mirror"]
    manifest = json.loads((mirror / "manifest.json").read_text())
    files = {f["path"]: f for f in manifest["files"]}
    wheels = {p: f for p, f in files.items() if f["kind"] == "wheel"}
    assert {f["package"] for f in wheels.values()} == set(PACKAGES)
    assert all(p.startswith(f"wheels/{ARCH}/") and f["locks"] == ["smalltest"] for p, f in wheels.items())
    assert files["locks/smalltest.txt"]["kind"] == "lock"
    debs = [f for f in files.values() if f["kind"] == "deb"]
    assert any(f["package"] == "iperf3" and f["requested"] for f in debs)
    assert {f"debs/{DEB_ARCH}/{n}" for n in ("Packages", "Packages.gz", "Release")} <= set(files)
    sources = [f for f in files.values() if f["kind"] == "source"]
    assert sources and all(f["commit"] == built["pinned"] for f in sources)
    if HAVE_TF:
        (weights,) = [f for f in files.values() if f["kind"] == "weights"]
        from dit.models.catalogue import entry

        assert weights["model"] == "gru_vqp" and weights["sha256"] == entry("gru_vqp").sha256
    on_disk = sorted(str(p.relative_to(mirror)) for p in mirror.rglob("*") if p.is_file())
    assert sorted(files) == [p for p in on_disk if p != "manifest.json"]  # every file, nothing else
    for path, entry_ in files.items():
        assert entry_["size"] == (mirror / path).stat().st_size and len(entry_["sha256"]) == 64
    proc = _run([str(REPO / "mirror/verify"), str(mirror)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ok, {len(files)} files" in proc.stdout


def test_node_venv_is_provisioned_from_the_served_mirror_with_no_index(
    built: dict[str, Any], tmp_path: Path
) -> None:
    node = tmp_path / "node"
    with serve(built["mirror"]) as url:
        play = _role_play(tmp_path, "provision_venv", _venv_vars(built, url, node))
        first = _playbook(play)
        assert first.returncode == 0, first.stdout + first.stderr
        venv = node / "opt/dit/venv"
        installed = _installed(venv)
        assert {name: installed.get(name) for name in PACKAGES} == VERSIONS
        assert (node / "opt/dit/requirements/smalltest.txt").read_text() == TEST_LOCK
        again = _playbook(play)  # idempotent: the lock did not change, nothing is installed again
        assert again.returncode == 0, again.stdout + again.stderr
        assert "changed=0" in again.stdout, again.stdout
    proc = subprocess.run([str(venv / "bin/python"), "-c", "import six, idna, packaging"], check=False)
    assert proc.returncode == 0


def test_corrupted_mirror_file_is_refused_and_nothing_is_installed(
    built: dict[str, Any], tmp_path: Path
) -> None:
    bad = tmp_path / "bad-mirror"
    shutil.copytree(built["mirror"], bad)
    (wheel,) = (bad / "wheels" / ARCH).glob("six-*.whl")
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different content
    wheel.write_bytes(bytes(data))
    rel = wheel.relative_to(bad).as_posix()

    proc = _run([str(REPO / "mirror/verify"), str(bad)])
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [next(ln for ln in proc.stdout.splitlines() if ln.startswith("HASH"))]
    assert proc.stdout.startswith(f"HASH {rel}: sha256 ")

    serve_play = _role_play(
        tmp_path,
        "mirror_serve",
        {
            "dit_provision_root": str(tmp_path / "edge"),
            "mirror_serve_root": str(bad),
            "dit_manage_services": False,
        },
    )
    refused = _playbook(serve_play)
    assert refused.returncode != 0 and f"HASH {rel}" in refused.stdout + refused.stderr

    node = tmp_path / "node"
    with serve(bad) as url:
        install = _playbook(_role_play(tmp_path, "provision_venv", _venv_vars(built, url, node)))
    assert install.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in install.stdout + install.stderr
    installed = _installed(node / "opt/dit/venv")
    assert not set(PACKAGES) & set(installed), installed  # nothing of the lock was installed
    assert not (node / "opt/dit/venv/.dit-lock").exists()


def test_verify_reports_missing_extra_and_size(built: dict[str, Any], tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(built["mirror"], bad)
    (idna,) = (bad / "wheels" / ARCH).glob("idna-*.whl")
    idna.unlink()
    (bad / "wheels" / ARCH / "evil-1.0-py3-none-any.whl").write_bytes(b"x")
    with (bad / "locks/smalltest.txt").open("a") as fh:
        fh.write("# appended\n")
    proc = _run([str(REPO / "mirror/verify"), str(bad)])
    assert proc.returncode == 1
    kinds = sorted(line.split()[0] + " " + line.split()[1].rstrip(":") for line in proc.stdout.splitlines())
    assert kinds == [
        f"EXTRA wheels/{ARCH}/evil-1.0-py3-none-any.whl",
        f"MISSING {idna.relative_to(bad).as_posix()}",
        "SIZE locks/smalltest.txt",
    ]


def test_mirror_serve_verifies_and_writes_the_unit(built: dict[str, Any], tmp_path: Path) -> None:
    edge = tmp_path / "edge"
    variables = {
        "dit_provision_root": str(edge),
        "mirror_serve_root": str(built["mirror"]),
        "mirror_serve_address": "10.42.0.1",
        "dit_manage_services": False,
    }
    proc = _playbook(_role_play(tmp_path, "mirror_serve", variables))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    unit = (edge / "etc/systemd/system/dit-mirror.service").read_text()
    assert f"--bind 10.42.0.1 --directory {built['mirror']} 8080" in unit
    assert "DynamicUser=yes" in unit and f"ReadOnlyPaths={built['mirror']}" in unit


def test_pinned_git_source_clones_from_the_served_mirror(built: dict[str, Any], tmp_path: Path) -> None:
    with serve(built["mirror"]) as url:
        proc = _run(["git", "clone", "-q", f"{url}/sources/runtime.git", str(tmp_path / "clone")])
    assert proc.returncode == 0, proc.stderr
    assert _git("-C", str(tmp_path / "clone"), "rev-parse", "HEAD") == built["pinned"]
    assert (tmp_path / "clone/runtime.py").read_text() == "VERSION = 'pinned'\n"


def test_apt_takes_the_packages_from_the_mirror(built: dict[str, Any], tmp_path: Path) -> None:
    """roles/provision_packages writes the source and the pin; apt (private state) sees the mirror's
    iperf3 at priority 990 with origin dit-mirror."""
    node, state = tmp_path / "node", tmp_path / "apt-state"
    (state / "lists/partial").mkdir(parents=True)
    private = [
        f"Dir::State={state}",
        f"Dir::State::Lists={state}/lists",
        f"Dir::Cache={tmp_path}/apt-cache",
        f"Dir::Etc::PreferencesParts={node}/etc/apt/preferences.d",
        "Debug::NoLocking=true",
    ]
    with serve(built["mirror"]) as url:
        variables = {
            "dit_provision_root": str(node),
            "provision_packages_mirror_url": url,
            "provision_packages_arch": DEB_ARCH,
            "provision_packages_install": False,
            "provision_packages_apt_options": private,
        }
        proc = _playbook(_role_play(tmp_path, "provision_packages", variables))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        source = (node / "etc/apt/sources.list.d/dit-mirror.list").read_text()
        assert f"deb [trusted=yes] {url}/debs/{DEB_ARCH}/ ./" in source
        options = [f"-o{o}" for o in private] + [
            f"-oDir::Etc::SourceList={node}/etc/apt/sources.list.d/dit-mirror.list"
        ]
        policy, sources = (
            subprocess.run(
                ["apt-cache", *options, "-oDir::Etc::SourceParts=-", "policy", *package],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            for package in (["iperf3"], [])
        )
    assert f"990 {url}/debs/{DEB_ARCH} ./ Packages" in policy, policy
    assert "release o=dit-mirror,a=dit,n=dit,l=dit-mirror" in sources, sources  # the pin's origin


def test_provision_playbook_check_mode_against_the_rack_example(
    built: dict[str, Any], tmp_path: Path
) -> None:
    nodes = tmp_path / "nodes"
    inventory = yaml.safe_load((REPO / "inventories/rack.example/hosts.yml").read_text())
    boards = sorted(inventory["all"]["children"]["devices"]["children"]["pi4_8gb"]["hosts"]) + sorted(
        inventory["all"]["children"]["devices"]["children"]["pi4_4gb"]["hosts"]
    )
    assert boards == ["device1", "device2", "device3", "device4", "device5"]
    # One board of each group: the boards of a group differ only in their addresses and map position,
    # so the other three take the same paths through the playbook (and would cost CI a minute).
    limit = ["edgeserver", "device1", "device3"]
    for board in boards:
        cmdline = nodes / board / "boot/firmware/cmdline.txt"
        cmdline.parent.mkdir(parents=True)
        cmdline.write_text(PI_CMDLINE)
        (cmdline.parent / "config.txt").write_text(PI_CONFIG)
    before = sorted(p for p in tmp_path.rglob("*"))
    key = tmp_path / "id_ed25519.pub"
    key.write_text(
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ6l8gUDd0dM7SSDzcLYf9zrzNbdXd4gAsDjtVl2mhm0 ctl@test\n"
    )
    with serve(built["mirror"]) as url:
        local = {
            "ansible_connection": "local",
            "ansible_become": False,
            "ansible_python_interpreter": "/usr/bin/python3",  # python3-apt for the apt module's check mode
            "dit_provision_root": str(nodes) + "/{{ inventory_hostname }}",
            "dit_manage_services": False,
            "dit_mirror_url": url,
            "mirror_serve_root": str(built["mirror"]),
            "ntp_config_path": str(nodes) + "/{{ inventory_hostname }}/etc/chrony/conf.d",
            "ntp_manage_service": False,
            "provision_access_key_files": [str(key)],
            # the example reads it from DIT_AP_PASSPHRASE; the check must not print it (no_log)
            "access_point_passphrase": "check-mode secret 35",
        }
        written = [key]  # by the test itself; check mode must write nothing else
        if HAVE_TF:
            local["provision_weights_models"] = ["gru_vqp"]
        else:  # the small mirror has no weights without TensorFlow to generate them
            empty = tmp_path / "catalogue.json"
            empty.write_text('{"models": {}}')
            local["provision_weights_catalogue"] = str(empty)
            written.append(empty)
        overlay = tmp_path / "local.yml"
        written.append(overlay)
        overlay.write_text(yaml.safe_dump(local))
        proc = _run(
            [
                str(BIN / "ansible-playbook"),
                "--check",
                "--diff",
                "-i",
                str(REPO / "inventories/rack.example"),
                str(REPO / "playbooks/provision.yml"),
                "-e",
                f"@{overlay}",
                "--limit",
                ",".join(limit),
            ],
            cwd=REPO,
        )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    recap = out[out.index("PLAY RECAP") :]
    assert sorted(re.findall(r"^(\S+)\s+: ok=", recap, re.MULTILINE)) == sorted(limit), recap
    for host in limit:
        line = next(ln for ln in recap.splitlines() if ln.startswith(host))
        assert "failed=0" in line and "unreachable=0" in line, line
    assert f"+{PI_CMDLINE.strip()} cgroup_enable=memory cgroup_memory=1\n" in out  # each board's diff
    assert "-#dtparam=i2c_arm=on\n+dtparam=i2c_arm=on\n" in out  # config.txt: I2C for the INA260
    # the edge server's inference network: a static lease per board by MAC, no router handed out
    assert "+dhcp-host=dc:a6:32:00:00:11,device1,10.43.0.11,12h\n" in out
    assert "+dhcp-host=dc:a6:32:00:00:15,device5,10.43.0.15,12h\n" in out
    assert "+dhcp-option=3\n" in out
    assert "check-mode secret 35" not in out  # hostapd.conf and the boards' connection hold it
    assert sorted(p for p in tmp_path.rglob("*") if p not in written) == before  # check mode wrote nothing


@pytest.mark.skipif(not HAVE_TF, reason="the small mirror's weights (gru_vqp) are generated with TensorFlow")
def test_weights_are_distributed_verified_and_a_corrupt_file_is_not_kept(
    built: dict[str, Any], tmp_path: Path
) -> None:
    from dit.models.catalogue import entry

    want = entry("gru_vqp")
    assert want.weights_file is not None
    node = tmp_path / "node"
    variables = {
        "dit_provision_root": str(node),
        "provision_weights_models": ["gru_vqp"],
        "provision_weights_owner": "root",
        "provision_weights_dir": "/var/lib/dit/weights",
    }
    with serve(built["mirror"]) as url:
        proc = _playbook(
            _role_play(tmp_path, "provision_weights", {**variables, "provision_weights_mirror_url": url})
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = node / "var/lib/dit/weights" / want.weights_file
    assert hashlib.sha256(got.read_bytes()).hexdigest() == want.sha256
    bad = tmp_path / "bad"
    shutil.copytree(built["mirror"], bad)
    (bad / "weights" / want.weights_file).write_bytes(b"\0" * (want.weights_bytes or 1))
    other = tmp_path / "other"
    with serve(bad) as url:
        proc = _playbook(
            _role_play(
                tmp_path,
                "provision_weights",
                {**variables, "provision_weights_mirror_url": url, "dit_provision_root": str(other)},
            )
        )
    assert proc.returncode != 0 and "checksum" in (proc.stdout + proc.stderr).lower()
    assert not (other / "var/lib/dit/weights" / want.weights_file).exists()


def test_cmdline_is_changed_once_and_never_reboots_unless_allowed(tmp_path: Path) -> None:
    node = tmp_path / "board"
    cmdline = node / "boot/firmware/cmdline.txt"
    cmdline.parent.mkdir(parents=True)
    cmdline.write_text(PI_CMDLINE.replace("rootwait", "cgroup_memory=0 rootwait"))
    (cmdline.parent / "config.txt").write_text("dtparam=i2c_arm=on\n")  # already enabled: not changed
    play = _role_play(tmp_path, "provision_cmdline", {"dit_provision_root": str(node)})
    first = _playbook(play)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "changed=1" in first.stdout and "not rebooting" in first.stdout
    words = cmdline.read_text().split()
    assert cmdline.read_text().count("\n") == 1 and cmdline.read_text().endswith("\n")
    assert words.count("cgroup_enable=memory") == 1 and words.count("cgroup_memory=1") == 1
    assert "cgroup_memory=0" not in words and words[:2] == ["console=serial0,115200", "console=tty1"]
    assert len(list(cmdline.parent.glob("cmdline.txt.*"))) == 1  # the backup of the previous line
    second = _playbook(play)
    assert second.returncode == 0 and "changed=0" in second.stdout, second.stdout
    assert len(list(cmdline.parent.glob("cmdline.txt.*"))) == 1


def test_config_txt_enables_i2c_once_and_never_reboots_unless_allowed(tmp_path: Path) -> None:
    node = tmp_path / "board"
    boot = node / "boot/firmware"
    boot.mkdir(parents=True)
    (boot / "cmdline.txt").write_text(
        PI_CMDLINE.replace("rootwait", "cgroup_enable=memory cgroup_memory=1 rootwait")
    )
    config = boot / "config.txt"
    config.write_text(PI_CONFIG)
    play = _role_play(tmp_path, "provision_cmdline", {"dit_provision_root": str(node)})
    first = _playbook(play)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "changed=1" in first.stdout and "not rebooting" in first.stdout
    assert "/boot/firmware/config.txt changed" in first.stdout
    assert config.read_text() == PI_CONFIG.replace("#dtparam=i2c_arm=on", "dtparam=i2c_arm=on")
    assert len(list(boot.glob("config.txt.*"))) == 1  # the backup of the previous file
    assert not list(boot.glob("cmdline.txt.*"))  # the command line already had its arguments
    second = _playbook(play)
    assert second.returncode == 0 and "changed=0" in second.stdout, second.stdout
    assert "not rebooting" not in second.stdout
    assert len(list(boot.glob("config.txt.*"))) == 1
    older = tmp_path / "older"  # Raspberry Pi OS before bookworm: /boot/config.txt
    (older / "boot").mkdir(parents=True)
    (older / "boot/cmdline.txt").write_text(PI_CMDLINE)
    (older / "boot/config.txt").write_text("[pi4]\notg_mode=1\n")
    variables = {
        "dit_provision_root": str(older),
        "provision_cmdline_path": "/boot/cmdline.txt",
        "provision_cmdline_config_path": "/boot/config.txt",
    }
    proc = _playbook(_role_play(tmp_path, "provision_cmdline", variables))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "/boot/cmdline.txt and /boot/config.txt changed" in proc.stdout  # one message, one reboot
    assert (older / "boot/config.txt").read_text() == "[pi4]\notg_mode=1\n[all]\ndtparam=i2c_arm=on\n"


def test_controller_key_is_authorised_once_and_malformed_keys_are_refused(tmp_path: Path) -> None:
    node = tmp_path / "node"
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ6l8gUDd0dM7SSDzcLYf9zrzNbdXd4gAsDjtVl2mhm0 ctl@test"
    keyfile = tmp_path / "id.pub"
    keyfile.write_text(key + "\n")
    variables = {
        "dit_provision_root": str(node),
        "provision_access_user": "root",
        "provision_access_home": "/home/root",
        "provision_access_key_files": [str(keyfile)],
    }
    play = _role_play(tmp_path, "provision_access", variables)
    for _ in range(2):  # the second run changes nothing
        proc = _playbook(play)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "changed=0" in proc.stdout
    authorized = node / "home/root/.ssh/authorized_keys"
    assert authorized.read_text() == key + "\n"
    assert oct(authorized.stat().st_mode & 0o777) == "0o600"
    assert oct(authorized.parent.stat().st_mode & 0o777) == "0o700"
    bad = _playbook(
        _role_play(tmp_path, "provision_access", {**variables, "provision_access_keys": ["not a key"]})
    )
    assert bad.returncode != 0 and "public key" in bad.stdout
