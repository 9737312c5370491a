"""`invoke lock`'s apt half, against real tools: Debian version order against dpkg itself, and
indexes read from repositories that apt-ftparchive and gpg build here (flat, like pkgs.k8s.io
and NVIDIA's, and dists/, like Docker's), signed with the lab's committed key."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpuk8s.errors import PlanError
from gpuk8s.facts.system import PackageState
from gpuk8s.lock import render
from gpuk8s.lock.aptindex import LockError, Source, dearmor, read_index, stanzas
from gpuk8s.lock.debversion import compare, parse_relations, satisfies
from gpuk8s.lock.osarchive import minimal_status, parse_print_uris, resolve_script
from gpuk8s.lock.resolve import resolve
from gpuk8s.lockfile import AptPins, read_apt_pins
from gpuk8s.ops.apt import PACKAGES_META, SOURCE_META, Apt, packages
from gpuk8s.playbook import PHASES
from gpuk8s.roles import HostContext, load_role
from tests.unit.scenarios import default_vars, fresh_facts

LAB_KEY = Path(__file__).resolve().parents[1] / "lab" / "keys" / "lab-repo-signing-key.asc"
LAB_FPR = "4DB64E86A138065762E9BAA291D795CA270F06CD"

# versions of the kinds gpuk8s pins (pkgs.k8s.io, NVIDIA, Docker, Debian, Ubuntu) and the
# corner cases of Debian Policy 5.6.12
TRICKY = ["1.36.0-1.1", "1.36.0-1.10", "1.36.1-1.1", "1.35.9-1.1", "580.159.04-1",
          "580.105.08-1", "580.65.06-0ubuntu1", "1:1.0", "1.0", "1.0~rc1", "1.0~rc1~1", "1.0-1",
          "1.0-1+b1", "1.0+dfsg-1", "1.0a", "1.0.0", "2.2.3-1~debian.12~bookworm",
          "2.2.3-1~ubuntu.24.04~noble", "5:28.1.1-1~debian.12~bookworm", "0", "0~", "1.0-0",
          "2.8.2+ds1-1", "13.0.2-1", "2.27.7-1+cuda13.0", "1.17.8-1", "1.0-0ubuntu0.24.04.1"]


def dpkg_compare(a: str, b: str) -> int:
    for op, value in (("lt", -1), ("eq", 0)):
        rc = subprocess.run(["dpkg", "--compare-versions", a, op, b]).returncode
        assert rc in (0, 1), f"dpkg cannot compare {a} and {b}"
        if rc == 0:
            return value
    return 1


def real_versions(limit: int = 60) -> list[str]:
    """Versions of the packages installed on this machine (Debian's data, nobody here wrote
    it), from dpkg's status file."""
    found: set[str] = set()
    for line in Path("/var/lib/dpkg/status").read_text(errors="replace").splitlines():
        if line.startswith("Version: "):
            found.add(line[9:].strip())
    rng = random.Random(36)
    return rng.sample(sorted(found), min(limit, len(found)))


def test_version_order_is_dpkg_s() -> None:
    versions = TRICKY + real_versions()
    assert len(versions) > len(TRICKY), "no dpkg status to read versions from"
    wrong = [(a, b, compare(a, b), dpkg_compare(a, b))
             for i, a in enumerate(versions) for b in versions[i:i + 12]
             if compare(a, b) != dpkg_compare(a, b)]
    assert wrong == []


def test_relations() -> None:
    assert parse_relations("libc6 (>= 2.34), foo | bar (<< 2), baz:any, qux [amd64]") == [
        [("libc6", ">=", "2.34")], [("foo", "", ""), ("bar", "<<", "2")], [("baz", "", "")],
        [("qux", "", "")]]
    assert satisfies("1.0-1", "=", "1.0-1") and not satisfies("1.0-2", "<<", "1.0-1")
    with pytest.raises(ValueError, match="cannot read"):
        parse_relations("foo (>= )")


# -- repositories built here ------------------------------------------------------------------
PACKAGES = [
    # name, version, depends
    ("kubeadm", "1.36.0-1.1", "cri-tools (>= 1.30.0), kubernetes-cni (>= 1.2.0)"),
    ("kubeadm", "1.36.1-1.1", "cri-tools (>= 1.30.0), kubernetes-cni (>= 1.2.0)"),
    ("kubeadm", "1.35.4-1.1", "cri-tools (>= 1.30.0)"),
    ("cri-tools", "1.36.0-1.1", ""),
    ("cri-tools", "1.29.0-1.1", ""),
    ("kubernetes-cni", "1.7.1-1.1", "iptables, libc6 (>= 2.34)"),
    ("cuda-drivers-570", "570.195.03-1", "nvidia-driver-cuda (= 570.195.03-1)"),
    ("cuda-drivers-580", "580.105.08-1", "nvidia-driver-cuda (= 580.105.08-1)"),
    ("cuda-drivers-580", "580.159.04-1", "nvidia-driver-cuda (= 580.159.04-1)"),
    ("nvidia-driver-cuda", "570.195.03-1", ""),
    ("nvidia-driver-cuda", "580.105.08-1", ""),
    ("nvidia-driver-cuda", "580.159.04-1", "nvidia-kernel-dkms (= 580.159.04-1) | "
                                           "nvidia-kernel-open-dkms (= 580.159.04-1)"),
    ("nvidia-kernel-dkms", "580.159.04-1", "dkms"),
]


def _gpg(home: Path, *args: str) -> str:
    return subprocess.run(["gpg", "--homedir", str(home), "--batch", "--pinentry-mode",
                           "loopback", "--passphrase", "", *args], check=True,
                          capture_output=True, text=True).stdout


def _deb(pool: Path, name: str, version: str, depends: str) -> None:
    root = pool / f"{name}-{version}"
    (root / "DEBIAN").mkdir(parents=True)
    control = (f"Package: {name}\nVersion: {version}\nArchitecture: amd64\n"
               f"Maintainer: gpuk8s tests <tests@gpuk8s.invalid>\n"
               + (f"Depends: {depends}\n" if depends else "")
               + "Description: a package built by tests/unit/test_lock_apt.py\n")
    (root / "DEBIAN" / "control").write_text(control)
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root),
                    str(pool / f"{name}_{version.replace(':', '%3a')}_amd64.deb")],
                   check=True, capture_output=True)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One folder with a flat repository (flat/) and a dists/ one (deb/), signed by the lab key;
    another key (other.asc) for the refusals."""
    top = tmp_path_factory.mktemp("repo")
    home = top / "gnupg"
    home.mkdir(mode=0o700)
    _gpg(home, "--import", str(LAB_KEY))
    (top / "lab.asc").write_text(_gpg(home, "--armor", "--export", LAB_FPR))
    other = top / "gnupg-other"
    other.mkdir(mode=0o700)
    _gpg(other, "--quick-gen-key", "other <o@gpuk8s.invalid>", "ed25519", "sign", "never")
    (top / "other.asc").write_text(_gpg(other, "--armor", "--export"))
    flat = top / "flat"
    pool = flat / "amd64"
    pool.mkdir(parents=True)
    for name, version, deps in PACKAGES:
        _deb(pool, name, version, deps)
    for item in pool.iterdir():
        if item.is_dir():
            subprocess.run(["rm", "-rf", str(item)], check=True)
    packages = subprocess.run(["apt-ftparchive", "packages", "amd64"], cwd=flat, check=True,
                              capture_output=True, text=True).stdout
    (flat / "Packages").write_text(packages)
    (flat / "Packages.gz").write_bytes(gzip.compress(packages.encode(), mtime=0))
    release = subprocess.run(["apt-ftparchive", "release", "."], cwd=flat, check=True,
                             capture_output=True, text=True).stdout
    (flat / "Release").write_text(release)
    _gpg(home, "--local-user", LAB_FPR, "--clearsign", "-o", str(flat / "InRelease"),
         str(flat / "Release"))
    # a dists/ layout: deb/dists/stable/main/binary-amd64/Packages, Filename from deb/
    dists = top / "deb"
    bdir = dists / "dists" / "stable" / "main" / "binary-amd64"
    bdir.mkdir(parents=True)
    (dists / "pool").symlink_to(pool)
    text = subprocess.run(["apt-ftparchive", "packages", "pool"], cwd=dists, check=True,
                          capture_output=True, text=True).stdout
    (bdir / "Packages").write_text(text)
    rel = subprocess.run(["apt-ftparchive", "release", "."], cwd=dists / "dists" / "stable",
                         check=True, capture_output=True, text=True).stdout
    (dists / "dists" / "stable" / "Release").write_text(rel)
    _gpg(home, "--local-user", LAB_FPR, "--clearsign", "-o",
         str(dists / "dists" / "stable" / "InRelease"), str(dists / "dists" / "stable" / "Release"))
    yield top
    for gnupg in (home, other):  # gpg started an agent for each home: stop them
        subprocess.run(["gpgconf", "--homedir", str(gnupg), "--kill", "gpg-agent"],
                       capture_output=True)


def files(top: Path, tamper: dict[str, bytes] | None = None):  # type: ignore[no-untyped-def]
    """A fetch that serves ``top`` at http://repo/ (``tamper``: paths served other bytes)."""
    def fetch(url: str) -> bytes:
        assert url.startswith("http://repo/"), url
        rel = url[len("http://repo/"):]
        if tamper and rel in tamper:
            return tamper[rel]
        try:
            return (top / rel).read_bytes()
        except FileNotFoundError:
            raise LockError(f"{url}: HTTP 404 Not Found") from None
    return fetch


FLAT = Source("nvidia", "http://repo/flat/", "/", "", "http://repo/lab.asc", LAB_FPR)
DISTS = Source("docker", "http://repo/deb", "stable", "main", "http://repo/lab.asc",
               LAB_FPR.lower())


def test_a_flat_and_a_dists_repository_are_read_and_checked(repo: Path) -> None:
    flat = read_index(FLAT, "amd64", files(repo))
    dists = read_index(DISTS, "amd64", files(repo))
    assert flat.fingerprint == dists.fingerprint == LAB_FPR
    assert sorted(p["Version"] for p in flat.packages if p["Package"] == "kubeadm") == \
        ["1.35.4-1.1", "1.36.0-1.1", "1.36.1-1.1"]
    assert len(dists.packages) == len(PACKAGES)


def test_resolution_takes_the_newest_match_and_the_dependencies_sources_carry(repo: Path
                                                                               ) -> None:
    index = read_index(FLAT, "amd64", files(repo))
    got = resolve({"kubeadm": "1.36.", "cuda-drivers-580": "580.", "curl": ""}, [index])
    versions = {n: p.version for n, p in got.packages.items()}
    assert versions == {"kubeadm": "1.36.1-1.1", "cri-tools": "1.36.0-1.1",
                        "kubernetes-cni": "1.7.1-1.1", "cuda-drivers-580": "580.159.04-1",
                        "nvidia-driver-cuda": "580.159.04-1",
                        "nvidia-kernel-dkms": "580.159.04-1"}
    # what no gpuk8s source carries is the OS archive's: named, not pinned
    assert got.os_archive == {"curl", "iptables", "libc6", "dkms"}
    deb = repo / "flat" / got.packages["kubeadm"].filename
    import hashlib
    assert hashlib.sha256(deb.read_bytes()).hexdigest() == got.packages["kubeadm"].sha256
    # an (= version) dependency is taken exactly, even when a newer one exists
    older = resolve({"cuda-drivers-580": "580.105."}, [index])
    assert older.packages["nvidia-driver-cuda"].version == "580.105.08-1"
    assert "nvidia-kernel-dkms" not in older.packages


def test_a_changed_driver_branch_changes_only_the_driver_lines(repo: Path) -> None:
    index = read_index(FLAT, "amd64", files(repo))

    def text(branch: str) -> str:
        res = resolve({"kubeadm": "1.36.", f"cuda-drivers-{branch}": f"{branch}."}, [index])
        return render({"apt": {n: p.as_dict() for n, p in res.packages.items()}})

    assert text("580") == text("580"), "the same inputs must give the same bytes"
    before, after = yaml.safe_load(text("580"))["apt"], yaml.safe_load(text("570"))["apt"]
    changed = {n for n in before.keys() | after.keys() if before.get(n) != after.get(n)}
    assert changed == {"cuda-drivers-580", "cuda-drivers-570", "nvidia-driver-cuda",
                       "nvidia-kernel-dkms"}



def test_no_version_matching_is_an_error_naming_it(repo: Path) -> None:
    index = read_index(FLAT, "amd64", files(repo))
    with pytest.raises(LockError, match=r'no version of kubeadm .* "1\.99\.\*"'):
        resolve({"kubeadm": "1.99."}, [index])


def test_a_tampered_packages_index_is_refused_naming_the_hash(repo: Path) -> None:
    real = (repo / "flat" / "Packages").read_bytes()
    bad = real.replace(b"Version: 1.36.1-1.1", b"Version: 1.36.9-1.1")
    with pytest.raises(LockError, match=r"flat/Packages\.gz: SHA256 [0-9a-f]{64} .* is not "
                                        r"the [0-9a-f]{64}"):
        read_index(FLAT, "amd64", files(repo, {"flat/Packages.gz": gzip.compress(bad)}))


def test_a_release_signed_by_another_key_or_unsigned_is_refused(repo: Path) -> None:
    release = (repo / "flat" / "Release").read_bytes()
    with pytest.raises(LockError, match=f"not signed by the pinned key {LAB_FPR}"):
        read_index(FLAT, "amd64", files(repo, {"flat/InRelease": release}))
    edited = (repo / "flat" / "InRelease").read_bytes().replace(b"Packages", b"Packagez", 1)
    with pytest.raises(LockError, match="not signed by the pinned key"):
        read_index(FLAT, "amd64", files(repo, {"flat/InRelease": edited}))


def test_a_key_that_is_not_the_pinned_one_is_refused(repo: Path) -> None:
    other = Source("nvidia", "http://repo/flat/", "/", "", "http://repo/other.asc", LAB_FPR)
    with pytest.raises(LockError, match=f"not the pinned {LAB_FPR}"):
        read_index(other, "amd64", files(repo))
    assert dearmor(b"\x99\x01") == b"\x99\x01"


def test_the_plan_s_ops_carry_the_sources_and_packages_the_lock_reads() -> None:
    """The lock reads the roles' plan: a fresh Debian GPU node's plan names its sources (with
    their pinned keys) and the packages of each role, driver included."""
    vars = default_vars(kubernetes_version="1.36")
    facts = fresh_facts("debian12", 2, "node", vars)
    cluster = {"endpoint": "10.0.0.10:6443", "advertise_address": "10.0.0.10",
               "node_name": "cp-01", "endpoint_mode": "direct",
               "control_planes": [{"host": "cp-01", "address": "10.0.0.10"}],
               "nodes": {"node": {"name": "node", "address": "10.0.0.11", "gpus": 2,
                                  "model": "NVIDIA H100 80GB HBM3"}}}
    sources: dict[str, dict[str, str]] = {}
    wanted: dict[str, str] = {}
    for phase in PHASES:
        for role in phase.roles:
            ctx = HostContext("node", role, vars, facts, cluster, ("workers",))
            for op in load_role(role).plan(ctx):
                if SOURCE_META in op.meta:
                    src = json.loads(op.meta[SOURCE_META])
                    sources[src["name"]] = src
                wanted.update(json.loads(op.meta.get(PACKAGES_META, "{}")))
    assert {"kubernetes", "cuda", "nvidia-container-toolkit"} <= set(sources)
    assert sources["kubernetes"]["suite"] == "/" and sources["kubernetes"]["fingerprint"]
    # an H100 gets the open kernel modules (nvidia_driver's flavour)
    assert wanted["kubeadm"] == "1.36." and wanted["nvidia-open-580"] == "580."
    assert "conntrack" in wanted


# -- bootstrap with a lock: packages() installs the pins ---------------------------------------
def _pins() -> AptPins:
    return AptPins("/inv/lab.gpuk8s.lock", "debian-12-amd64", {
        "kubeadm": ("1.36.1-1.1", ("cri-tools", "kubernetes-cni")),
        "kubelet": ("1.36.1-1.1", ("kubernetes-cni",)),
        "cri-tools": ("1.36.0-1.1", ()), "kubernetes-cni": ("1.7.1-1.1", ())})


def test_with_a_lock_packages_installs_exactly_the_pins_and_their_pinned_needs() -> None:
    op = packages({}, "k | p", {"kubeadm": "1.36.", "kubelet": "1.36.", "curl": ""}, hold=True,
                  apt=Apt(pins=_pins()))
    script = "\n".join(op.commands)
    assert ("install --allow-change-held-packages --allow-downgrades kubeadm=1.36.1-1.1 "
            "kubelet=1.36.1-1.1 curl cri-tools=1.36.0-1.1 kubernetes-cni=1.7.1-1.1 >") in script
    assert "apt-cache madison kubeadm" not in script and "$(r kubeadm" not in script
    assert "apt-mark hold kubeadm kubelet curl " in script, "only what was asked is held"
    assert op.reason == ("+ install kubeadm=1.36.1-1.1, kubelet=1.36.1-1.1, curl, "
                         "cri-tools=1.36.0-1.1, kubernetes-cni=1.7.1-1.1 (pinned by "
                         "lab.gpuk8s.lock)")
    # the meta keeps the inventory's patterns: a new lock resolves them afresh
    assert json.loads(op.meta[PACKAGES_META]) == {"kubeadm": "1.36.", "kubelet": "1.36.",
                                                  "curl": ""}


def test_with_a_lock_plan_names_the_drift_and_a_node_at_the_pins_is_left_alone() -> None:
    newer = {"kubeadm": PackageState("1.36.2-1.1", True, "hi"),
             "kubelet": PackageState("1.36.1-1.1", True, "hi")}
    op = packages(newer, "k | p", {"kubeadm": "1.36.", "kubelet": "1.36."}, hold=True,
                  apt=Apt(pins=_pins()))
    assert op.changes and op.reason.endswith(
        "(pinned by lab.gpuk8s.lock; the node has kubeadm 1.36.2-1.1)"), op.reason
    assert "kubelet=" not in op.reason, "kubelet is at its pin"
    at_pins = {**newer, "kubeadm": PackageState("1.36.1-1.1", True, "hi")}
    same = packages(at_pins, "k | p", {"kubeadm": "1.36.", "kubelet": "1.36."}, hold=True,
                    apt=Apt(pins=_pins()))
    assert not same.changes and same.reason.endswith("(held) (as the lock pins)")


def test_a_lock_older_than_the_inventory_stops_the_plan_with_the_fix() -> None:
    with pytest.raises(PlanError, match=r"pins kubeadm 1\.36\.1-1\.1 for debian-12-amd64, but "
                                        r"the inventory asks for '1\.37\.'.*invoke lock"):
        packages({}, "k | p", {"kubeadm": "1.37."}, apt=Apt(pins=_pins()))


def test_a_host_whose_os_release_the_lock_lacks_is_an_error_naming_both(tmp_path: Path
                                                                          ) -> None:
    path = tmp_path / "lab.gpuk8s.lock"
    path.write_text(render({"apt": {"releases": {"ubuntu-24.04-amd64": {"packages": {
        "kubeadm": {"version": "1.36.1-1.1", "requires": ["cri-tools"]}}}}}}))
    pins = read_apt_pins(path)
    assert pins["ubuntu-24.04-amd64"].packages["kubeadm"] == ("1.36.1-1.1", ("cri-tools",))
    vars = default_vars()
    ctx = HostContext("node", "base", vars, fresh_facts("debian12", 0, "node", vars),
                      {"apt_lock": {"path": str(path), "releases": pins}})
    with pytest.raises(PlanError, match=r"has no packages for debian-12-amd64 \(node's OS "
                                        r"release; it has ubuntu-24.04-amd64\)"):
        _ = ctx.apt
    path.write_text("apt: [not, a, lock]\n")
    with pytest.raises(PlanError, match="not a lock gpuk8s can read"):
        read_apt_pins(path)


# -- the OS archive's part: the node's apt, against a minimal dpkg status ----------------------
def _apt_check(status: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "status"
    path.write_text(status)
    return subprocess.run(["apt-get", "-o", f"Dir::State::status={path}", "-o",
                           "Debug::NoLocking=1", "check"], capture_output=True, text=True)


def test_the_minimal_status_is_a_consistent_install_apt_itself_accepts(tmp_path: Path) -> None:
    """This machine's own dpkg status (Debian's data): its required and important packages
    with what they need, which `apt-get check` finds without an unmet dependency; the same
    packages without their needs it refuses."""
    full = Path("/var/lib/dpkg/status").read_text()
    small = minimal_status(full)
    names = {p["Package"] for p in stanzas(small)}
    required = {p["Package"] for p in stanzas(full)
                if p.get("Priority") in ("required", "important")
                and p.get("Status", "").endswith(" installed")}
    assert required <= names and len(names) < full.count("\nPackage: ") + 1
    ok = _apt_check(small, tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    naive = "".join(p.strip("\n") + "\n\n" for p in full.split("\n\n")
                    if next(stanzas(p), {}).get("Package") in required)
    broken = _apt_check(naive, tmp_path)
    assert broken.returncode != 0 and "nmet dependencies" in broken.stdout + broken.stderr


# apt 2.6's --print-uris lines (the MD5Sum it prints, none at all for the security archive's
# record) and the records apt-cache show printed for them, from a lab node
PRINTED = """\
'http://deb.debian.org/debian/pool/main/c/conntrack-tools/conntrack_1%3a1.4.7-1%2bb2_amd64.deb' \
conntrack_1%3a1.4.7-1+b2_amd64.deb 35240 MD5Sum:0c5c87e49401d34ca8b7b384db092d80
'http://deb.debian.org/debian-security/pool/updates/main/c/cyrus-sasl2/libsasl2-modules_2.1.28\
%2bdfsg-10%2bdeb12u1_amd64.deb' libsasl2-modules_2.1.28+dfsg-10+deb12u1_amd64.deb 66868 
--- records
Package: conntrack
Version: 1:1.4.7-1+b2
SHA256: 9827d60b60c1b5673e97f34db48d9db79e9f9ef807ee998320f6dafc80711e82
Description: Program to modify the conntrack tables
 conntrack is a userspace command line program

Package: libsasl2-modules
Version: 2.1.28+dfsg-10+deb12u1
SHA256: c8f4780356794ed00b154866ead8c7bcdc6c3b76ffcd120b8d6bfcbdc536c8af
"""


def test_print_uris_and_the_records_give_each_deb_with_its_sha256() -> None:
    got = {f.name: f for f in parse_print_uris(PRINTED)}
    assert got["conntrack"].version == "1:1.4.7-1+b2"
    assert got["conntrack"].sha256.startswith("9827d60b") and got["conntrack"].size == 35240
    assert got["libsasl2-modules"].url.endswith("deb12u1_amd64.deb")
    with pytest.raises(LockError, match=r"conntrack 1:1\.4\.7-1\+b2 .* has no SHA256"):
        parse_print_uris(PRINTED.replace("SHA256: 9827", "MD5sum: 9827"))


def test_the_node_script_keeps_node_text_out_of_the_shell() -> None:
    """The status (node text) and the keys travel base64-encoded; a source's URL is quoted."""
    src = Source("k8s", "http://repo/x'$(reboot)/", "/", "", "http://repo/k", LAB_FPR)
    script = resolve_script([(src, b"\x99key")], "Package: a\n$(reboot)\n", {"curl": "",
                            "nvidia-driver-580-server": "580."}, {"kubeadm": "1.36.2-1.1"})
    assert "$(reboot)\n" not in script and "'\"'\"'$(reboot)" in script
    assert "kubeadm=1.36.2-1.1" in script and "v1=$(r nvidia-driver-580-server 580.)" in script
    assert subprocess.run(["sh", "-n", "-c", script]).returncode == 0
