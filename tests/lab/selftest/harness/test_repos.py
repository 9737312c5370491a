"""Tests of the lab package builder and the signed lab apt repositories (tests/lab/repos.py).

The repos are built into a per-session cache dir (its downloads/ shared with the normal lab cache
so the real containerd/runc debs from deb.debian.org are fetched once), served on 127.0.0.1, and
checked with apt in a temporary apt root: signatures verify with the lab key, pins resolve.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab import debs, repos

# Debian packages the lab node image has (CONTRACT.md) or Debian's archive supplies; the apt
# check treats them as installed so only the lab repos are resolved.
ASSUMED_INSTALLED = {
    "python3": "3.11.2-1+b1",
    "python3-yaml": "6.0-3+b2",
    "python3-cryptography": "38.0.4-3+deb12u1",  # the lab kubeadm (kubeadm-certs, AES-GCM)
    "openssl": "3.0.17-1~deb12u2",
    "libc6": "2.36-9+deb12u10",
    "libseccomp2": "2.5.4-1+deb12u1",
    "libsystemd0": "252.38-1~deb12u1",
    "iptables": "1.8.9-2",
    "conntrack": "1:1.4.7-1+b2",
    "iproute2": "6.1.0-3",
    "mount": "2.38.1-5+deb12u3",
    "util-linux": "2.38.1-5+deb12u3",
    "ethtool": "1:6.1-1",
    "socat": "1.7.4.4-2",
    "ebtables": "2.0.11-5",
    "kmod": "30+20221128-1",
    "systemd": "252.38-1~deb12u1",
    "init-system-helpers": "1.65.2",
    "ca-certificates": "20230311",
    "gnupg": "2.2.40-1.1",
    "curl": "7.88.1-10+deb12u12",
    "procps": "2:4.0.2-3",
    "sudo": "1.9.13p3-1+deb12u1",
    "pciutils": "1:3.9.0-4",
    "adduser": "3.134",
    "dpkg": "1.21.22",
    "coreutils": "9.1-1",
    "debconf": "1.5.82",
    "lsb-base": "11.6",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def lab_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    shared = Path(os.environ.get("GPUK8S_LAB_CACHE", "/var/cache/gpuk8s-lab"))
    cache = tmp_path_factory.mktemp("labcache")
    (shared / "downloads").mkdir(parents=True, exist_ok=True)
    (cache / "downloads").symlink_to(shared / "downloads")
    old = {k: os.environ.get(k) for k in ("GPUK8S_LAB_CACHE", "GPUK8S_LAB_STATE")}
    os.environ["GPUK8S_LAB_CACHE"] = str(cache)
    os.environ["GPUK8S_LAB_STATE"] = str(tmp_path_factory.mktemp("labstate"))
    repos._resolver.cache_clear()
    try:
        yield cache
    finally:
        repos.stop_serving()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        repos._resolver.cache_clear()


@pytest.fixture(scope="module")
def www(lab_env: Path) -> Path:
    t0 = time.monotonic()
    root = repos.build_all()
    print(f"cold build_all: {time.monotonic() - t0:.1f}s")
    return root


@pytest.fixture(scope="module")
def base_url(www: Path) -> str:
    listen = f"127.0.0.1:{_free_port()}"
    repos.ensure_served(listen)
    return f"http://{listen}"


def _flat_dirs() -> list[Path]:
    return [Path(r.path) for r in repos.REPOS.values() if r.suite is None]


def test_layout_and_keys(www: Path, lab_env: Path) -> None:
    key = (lab_env / "repos/lab-key.asc").read_text()
    assert key.startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
    assert (lab_env / "repos/lab-key.gpg").read_bytes()[:1] != b"-"
    for rel in (
        "pkgs.k8s.io/core:/stable:/v1.36/deb/Release.key",
        "pkgs.k8s.io/core:/stable:/v1.35/deb/Release.key",
        "developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/3bf863cc.pub",
        "nvidia.github.io/libnvidia-container/gpgkey",
        "download.docker.com/linux/debian/gpg",
    ):
        assert (www / rel).read_text() == key, rel
    for d in _flat_dirs():
        for f in ("Packages", "Packages.gz", "Release", "Release.gpg", "InRelease"):
            assert (www / d / f).is_file(), www / d / f
    dist = www / "download.docker.com/linux/debian/dists/bookworm"
    for f in (
        "Release",
        "Release.gpg",
        "InRelease",
        "stable/binary-amd64/Packages",
        "stable/binary-amd64/Packages.gz",
    ):
        assert (dist / f).is_file()
    rel = (dist / "Release").read_text()
    assert "Suite: bookworm" in rel and "Components: stable" in rel


def test_signatures_verify_with_lab_key(www: Path, lab_env: Path) -> None:
    keyring = lab_env / "repos/lab-key.gpg"
    dirs = [*_flat_dirs(), Path("download.docker.com/linux/debian/dists/bookworm")]
    for d in dirs:
        for args in (["InRelease"], ["Release.gpg", "Release"]):
            res = subprocess.run(
                ["gpgv", "--keyring", str(keyring), *args],
                cwd=www / d,
                capture_output=True,
                text=True,
            )
            assert res.returncode == 0, f"{d}: {res.stderr}"


def _packages(www: Path) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for r in repos.REPOS.values():
        p = (
            www
            / r.path
            / (
                "Packages"
                if r.suite is None
                else f"dists/{r.suite}/{r.component}/binary-amd64/Packages"
            )
        )
        stanzas = []
        for block in p.read_text().strip().split("\n\n"):
            if not block.strip():
                continue
            fields: dict[str, str] = {}
            key = ""
            for line in block.split("\n"):
                if line.startswith(" "):
                    fields[key] += "\n" + line
                else:
                    key, _, val = line.partition(": ")
                    fields[key] = val
            stanzas.append(fields)
        out[r.id] = stanzas
    return out


def test_contract_packages_present(www: Path) -> None:
    pk = _packages(www)
    have = {(rid, s["Package"], s["Version"]) for rid, ss in pk.items() for s in ss}
    for v in ("580.105.08-1", "580.159.04-1"):
        for n in (
            "nvidia-open-580",
            "cuda-drivers-580",
            "nvidia-kernel-open-dkms",
            "nvidia-kernel-dkms",
            "nvidia-driver-cuda",
            "nvidia-fabricmanager",
        ):
            assert ("cuda/debian12", n, v) in have
    assert ("cuda/debian12", "cuda-toolkit-13-0", "13.0.2-1") in have
    assert ("cuda/debian12", "cuda-toolkit-12-8", "12.8.1-1") in have
    for v in ("1.20.0-1", "1.19.0-1"):
        for n in (
            "nvidia-container-toolkit",
            "nvidia-container-toolkit-base",
            "libnvidia-container-tools",
            "libnvidia-container1",
        ):
            assert ("libnvidia-container", n, v) in have
    cio = [s for s in pk["docker/debian/bookworm"] if s["Package"] == "containerd.io"]
    assert (
        len(cio) == 1
        and cio[0]["Version"].startswith("2.1.")
        and cio[0]["Version"].endswith("-1~debian.12~bookworm")
    )
    assert cio[0]["Conflicts"] == "containerd, runc" and cio[0]["Replaces"] == "containerd, runc"
    docker = {s["Package"]: s for s in pk["docker/debian/bookworm"]}
    for name in ("docker-ce", "docker-ce-cli"):
        v = docker[name]["Version"]
        assert v.startswith("5:28.") and v.endswith("-1~debian.12~bookworm"), (name, v)
        assert "Debian's real docker binaries repackaged" in docker[name]["Description"]
    deps = [d.strip() for d in docker["docker-ce"]["Depends"].split(",")]
    assert {"containerd.io (>= 1.7)", "docker-ce-cli", "iptables"} <= set(deps)
    assert not any(d.split()[0] in ("containerd", "runc") for d in deps), deps
    assert "docker.io" in docker["docker-ce"]["Conflicts"]
    assert ("lab-kernel", f"linux-headers-{os.uname().release}".lower(), "1.0~lab1") in have
    for ss in pk.values():
        for s in ss:
            assert "LAB STAND-IN" in s["Description"], s["Package"]


def test_containerd_io_contents(www: Path, tmp_path: Path) -> None:
    deb = next(
        (www / "download.docker.com/linux/debian/dists/bookworm/pool/stable/amd64").glob(
            "containerd.io_*.deb"
        )
    )
    listing = subprocess.run(
        ["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True
    ).stdout
    for path in (
        "./usr/bin/containerd",
        "./usr/bin/ctr",
        "./usr/bin/containerd-shim-runc-v2",
        "./usr/bin/runc",
        "./lib/systemd/system/containerd.service",
        "./etc/containerd/config.toml",
    ):
        assert f" {path}\n" in listing, path
    assert "root/root" in listing and "2026-01-01" in listing
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    subprocess.run(["dpkg-deb", "-e", str(deb), str(tmp_path / "DEBIAN")], check=True)
    assert (tmp_path / "DEBIAN/conffiles").read_text() == "/etc/containerd/config.toml\n"
    assert 'disabled_plugins = ["cri"]' in (tmp_path / "etc/containerd/config.toml").read_text()
    unit = (tmp_path / "lib/systemd/system/containerd.service").read_text()
    for line in (
        "ExecStartPre=-/sbin/modprobe overlay",
        "ExecStart=/usr/bin/containerd",
        "Delegate=yes",
        "KillMode=process",
        "Type=notify",
    ):
        assert line in unit.splitlines()
    postinst = (tmp_path / "DEBIAN/postinst").read_text()
    assert (
        "deb-systemd-helper enable 'containerd.service'" in postinst
        and "[ -d /run/systemd/system ]" in postinst
    )
    version = subprocess.run(
        [str(tmp_path / "usr/bin/containerd"), "--version"], capture_output=True, text=True
    )
    assert version.returncode == 0 and " 2.1." in version.stdout  # sid's binary runs on bookworm
    runc = subprocess.run(
        [str(tmp_path / "usr/bin/runc"), "--version"], capture_output=True, text=True
    )
    assert runc.returncode == 0 and runc.stdout.startswith("runc version 1.")


def test_docker_ce_contents(www: Path, tmp_path: Path) -> None:
    pool = www / "download.docker.com/linux/debian/dists/bookworm/pool/stable/amd64"
    ce, cli = next(pool.glob("docker-ce_*.deb")), next(pool.glob("docker-ce-cli_*.deb"))
    listing = subprocess.run(
        ["dpkg-deb", "-c", str(ce)], capture_output=True, text=True, check=True
    ).stdout
    for path in (
        "./usr/bin/dockerd",
        "./usr/bin/docker-proxy",
        "./usr/bin/docker-init",
        "./lib/systemd/system/docker.service",
        "./lib/systemd/system/docker.socket",
        "./etc/default/docker",
    ):
        assert f" {path}\n" in listing, path
    for deb in (ce, cli):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    subprocess.run(["dpkg-deb", "-e", str(ce), str(tmp_path / "DEBIAN")], check=True)
    assert (tmp_path / "DEBIAN/conffiles").read_text() == "/etc/default/docker\n"
    unit = (tmp_path / "lib/systemd/system/docker.service").read_text().splitlines()
    for line in (
        "ExecStart=/usr/bin/dockerd -H fd:// --containerd=/run/containerd/containerd.sock",
        "Requires=docker.socket",
        "Wants=network-online.target containerd.service",
        "Type=notify",
        "Delegate=yes",
        "KillMode=process",
    ):
        assert line in unit, line
    sock = (tmp_path / "lib/systemd/system/docker.socket").read_text().splitlines()
    assert "ListenStream=/run/docker.sock" in sock and "SocketGroup=docker" in sock
    postinst = (tmp_path / "DEBIAN/postinst").read_text()
    assert "groupadd --system docker" in postinst
    for unit_name in ("docker.service", "docker.socket"):
        assert f"deb-systemd-helper enable '{unit_name}'" in postinst, unit_name
    # the real binaries, and they run on this (bookworm) host
    for binary, want in (
        ("usr/bin/dockerd", "Docker version 28."),
        ("usr/bin/docker", "Docker version 28."),
        ("usr/bin/docker-proxy", "version 28."),
        ("usr/bin/docker-init", "tini version 0.19"),
    ):
        res = subprocess.run([str(tmp_path / binary), "--version"], capture_output=True, text=True)
        assert res.returncode == 0 and want in res.stdout, (binary, res.stdout, res.stderr)


def test_builds_are_deterministic(lab_env: Path, tmp_path: Path) -> None:
    pkg = next(d for d in debs.load_definitions() if d.raw["name"] == "nvidia-driver-cuda")
    spec = debs.render(pkg, "580.159.04-1")
    a = debs.build_deb(spec, tmp_path / "a")
    b = debs.build_deb(spec, tmp_path / "b")
    assert a.read_bytes() == b.read_bytes()
    assert debs.render(pkg, "580.105.08-1").content_hash() != spec.content_hash()


def test_warm_build_is_a_noop(www: Path) -> None:
    inrel = www / "developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/InRelease"
    before = inrel.stat().st_mtime_ns
    t0 = time.monotonic()
    assert repos.build_all() == www
    elapsed = time.monotonic() - t0
    assert inrel.stat().st_mtime_ns == before
    assert elapsed < 10, elapsed


def test_mirror_settings_resolve_on_the_server(base_url: str) -> None:
    s = repos.mirror_settings(base_url)
    assert set(s) == {
        "kubernetes_repo_url",
        "kubernetes_repo_key_url",
        "nvidia_cuda_repo_url",
        "nvidia_cuda_repo_key_url",
        "nvidia_container_toolkit_repo_url",
        "nvidia_container_toolkit_repo_key_url",
        "docker_repo_url",
        "docker_repo_key_url",
        *repos.key_pins(),
    }
    with_registry = repos.mirror_settings(base_url, "http://10.88.0.1:8082")
    assert with_registry["registry_mirrors"] == {
        r: ["http://10.88.0.1:8082"] for r in ("docker.io", "registry.k8s.io", "nvcr.io",
                                               "ghcr.io", "quay.io")}
    # every key the server hands out is the lab key the settings pin
    assert set(repos.key_pins().values()) == {repos.LAB_KEY_FINGERPRINT}
    assert (
        s["kubernetes_repo_url"]
        == f"{base_url}/pkgs.k8s.io/core:/stable:/v{{{{ kubernetes_version }}}}/deb/"
    )
    render = {
        k: v.replace("{{ kubernetes_version }}", "1.36").replace(
            "{{ nvidia_cuda_distro }}", "debian12"
        )
        for k, v in s.items()
        if k.endswith("_url")
    }
    for k, url in render.items():
        if k.endswith("_key_url"):
            assert (
                urllib.request.urlopen(url)
                .read()
                .startswith(b"-----BEGIN PGP PUBLIC KEY BLOCK-----")
            ), k
        elif k == "docker_repo_url":
            assert urllib.request.urlopen(url + "/dists/bookworm/InRelease").status == 200
        else:
            assert urllib.request.urlopen(url + "InRelease").status == 200, k
    listing = (
        urllib.request.urlopen(
            f"{base_url}/nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list"
        )
        .read()
        .decode()
    )
    assert listing.startswith(
        f"deb {base_url}/nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /"
    )


def _apt_root(tmp: Path, base_url: str, keyring: Path, k8s_minor: str = "1.36") -> list[str]:
    for d in (
        "etc/apt/sources.list.d",
        "etc/apt/preferences.d",
        "etc/apt/apt.conf.d",
        "var/lib/apt/lists/partial",
        "var/cache/apt/archives/partial",
        "var/lib/dpkg",
    ):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    (tmp / "var/lib/dpkg/status").write_text(
        "".join(
            f"Package: {n}\nStatus: install ok installed\nPriority: optional\nSection: misc\n"
            f"Maintainer: lab <lab@invalid>\nArchitecture: amd64\nVersion: {v}\n"
            "Description: assumed\n\n"
            for n, v in ASSUMED_INSTALLED.items()
        )
    )
    k = f"signed-by={keyring}"
    (tmp / "etc/apt/sources.list").write_text(
        f"deb [{k}] {base_url}/pkgs.k8s.io/core:/stable:/v{k8s_minor}/deb/ /\n"
        f"deb [{k}] {base_url}/developer.download.nvidia.com"
        "/compute/cuda/repos/debian12/x86_64/ /\n"
        f"deb [{k}] {base_url}/nvidia.github.io/libnvidia-container/stable/deb/amd64/ /\n"
        f"deb [arch=amd64 {k}] {base_url}/download.docker.com/linux/debian bookworm stable\n"
        f"deb [{k}] {base_url}/lab-kernel/ /\n"
    )
    return [
        "apt-get",
        "-o",
        f"Dir={tmp}",
        "-o",
        "Debug::NoLocking=1",
        "-o",
        "APT::Sandbox::User=root",
        "-o",
        "APT::Architecture=amd64",
        "-o",
        "Acquire::Retries=0",
    ]


def _k8s_available(www: Path) -> bool:
    return "Package: kubeadm" in (www / "pkgs.k8s.io/core:/stable:/v1.36/deb/Packages").read_text()


def test_apt_verifies_and_resolves(www: Path, base_url: str, lab_env: Path, tmp_path: Path) -> None:
    apt = _apt_root(tmp_path, base_url, lab_env / "repos/lab-key.gpg")
    res = subprocess.run([*apt, "update"], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (
        "NO_PUBKEY" not in res.stderr and "not signed" not in res.stderr and "W:" not in res.stderr
    ), res.stderr
    pins = [
        "nvidia-open-580=580.159.04-1",
        "nvidia-container-toolkit=1.20.0-1",
        "containerd.io",
        "cuda-toolkit-13-0=13.0.2-1",
        "nvidia-fabricmanager=580.159.04-1",
        f"linux-headers-{os.uname().release}",
    ]
    if _k8s_available(www):
        pins.append("kubeadm=1.36.2-1.1")
    res = subprocess.run(
        [*apt, "install", "--simulate", "-y", *pins], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr
    inst = {
        ln.split()[1]: ln.split()[2].strip("(")
        for ln in res.stdout.splitlines()
        if ln.startswith("Inst ")
    }
    assert (
        inst["nvidia-kernel-open-dkms"] == "580.159.04-1"
        and inst["nvidia-driver-cuda"] == "580.159.04-1"
    )
    for n in ("nvidia-container-toolkit-base", "libnvidia-container-tools", "libnvidia-container1"):
        assert inst[n] == "1.20.0-1", n
    if _k8s_available(www):
        assert inst["kubeadm"] == "1.36.2-1.1"
    # an older meta alone does not drag its exact-version deps down (apt picks the candidates);
    # as upstream, every component must be pinned
    res = subprocess.run(
        [*apt, "install", "--simulate", "-y", "cuda-drivers-580=580.105.08-1"],
        capture_output=True,
        text=True,
    )
    assert res.returncode != 0 and "nvidia-kernel-dkms (= 580.105.08-1)" in res.stdout
    res = subprocess.run(
        [
            *apt,
            "install",
            "--simulate",
            "-y",
            "nvidia-container-toolkit=1.19.0-1",
            "nvidia-container-toolkit-base=1.19.0-1",
            "libnvidia-container-tools=1.19.0-1",
            "libnvidia-container1=1.19.0-1",
            "cuda-drivers-580=580.105.08-1",
            "nvidia-kernel-dkms=580.105.08-1",
            "nvidia-driver-cuda=580.105.08-1",
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Inst nvidia-kernel-dkms (580.105.08-1" in res.stdout
    # mixing toolkit versions is refused, as upstream since 1.18
    res = subprocess.run(
        [
            *apt,
            "install",
            "--simulate",
            "-y",
            "nvidia-container-toolkit=1.20.0-1",
            "nvidia-container-toolkit-base=1.19.0-1",
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode != 0
    # download: apt checks every .deb against the signed index
    res = subprocess.run(
        [*apt, "install", "--download-only", "-y", *pins], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr
    got = {p.name.split("_")[0] for p in (tmp_path / "var/cache/apt/archives").glob("*.deb")}
    assert {"containerd.io", "nvidia-open-580", "nvidia-container-toolkit"} <= got


def test_apt_resolves_docker_ce_with_containerd_io(
    www: Path, base_url: str, lab_env: Path, tmp_path: Path
) -> None:
    """container_runtime: docker installs docker-ce and docker-ce-cli beside containerd.io: all
    three come from the lab's Docker repo, and Debian's own containerd and runc (offered by a
    local repo holding Debian's real packages, as the node's Debian sources would) stay out."""
    apt = _apt_root(tmp_path, base_url, lab_env / "repos/lab-key.gpg")
    debian = tmp_path / "debian-repo"
    debian.mkdir()
    for deb in (
        repos.fetch_upstream_deb("containerd", "unstable"),
        repos.fetch_upstream_deb("runc", "bookworm"),
    ):
        shutil.copy2(deb, debian / deb.name)
    packages = subprocess.run(
        ["apt-ftparchive", "packages", "."],
        cwd=debian,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (debian / "Packages").write_text(packages)
    with open(tmp_path / "etc/apt/sources.list", "a") as fh:
        fh.write(f"deb [trusted=yes] file:{debian} ./\n")
    res = subprocess.run([*apt, "update"], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    want = ["docker-ce", "docker-ce-cli", "containerd.io"]
    res = subprocess.run(
        [*apt, "install", "--simulate", "-y", *want], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr
    # "Inst docker-ce (5:28.5.2-1~debian.12~bookworm Docker CE:bookworm [amd64])"
    inst = {
        ln.split()[1]: ln.split(" ", 2)[2]
        for ln in res.stdout.splitlines()
        if ln.startswith("Inst ")
    }
    assert set(inst) == set(want), res.stdout
    for name, how in inst.items():
        assert "Docker CE:bookworm [amd64]" in how, (name, how)
    assert inst["containerd.io"].startswith("(2.1."), inst
    assert inst["docker-ce"].startswith("(5:28.") and inst["docker-ce-cli"].startswith("(5:28.")
    # Debian's containerd is offered, but refused beside docker-ce (containerd.io conflicts)
    res = subprocess.run(
        [*apt, "install", "--simulate", "-y", "docker-ce", "containerd"],
        capture_output=True,
        text=True,
    )
    assert res.returncode != 0, res.stdout
    res = subprocess.run(
        [*apt, "install", "--download-only", "-y", *want], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr
    got = {p.name.split("_")[0] for p in (tmp_path / "var/cache/apt/archives").glob("*.deb")}
    assert got == set(want)


def test_apt_rejects_other_key(www: Path, base_url: str, tmp_path: Path) -> None:
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    g = [
        "gpg",
        "--homedir",
        str(home),
        "--batch",
        "--passphrase",
        "",
        "--pinentry-mode",
        "loopback",
    ]
    subprocess.run(
        [*g, "--quick-gen-key", "other <o@invalid>", "ed25519", "sign", "never"],
        check=True,
        capture_output=True,
    )
    other = tmp_path / "other.gpg"
    other.write_bytes(subprocess.run([*g, "--export"], check=True, capture_output=True).stdout)
    apt = _apt_root(tmp_path / "root", base_url, other)
    res = subprocess.run([*apt, "update"], capture_output=True, text=True)
    assert "NO_PUBKEY" in res.stderr or "not signed" in res.stderr or res.returncode != 0


def test_serve_lifecycle(www: Path, base_url: str) -> None:
    listen = base_url.removeprefix("http://")
    pid = repos.ensure_served(listen)
    assert repos.ensure_served(listen) == pid  # already running: same process
    assert repos.stop_serving()
    assert not repos._probe(listen)
    assert repos.ensure_served(listen) != pid
