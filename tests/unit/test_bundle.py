"""invoke bundle: the pip commands it builds, the errors it explains, and one real bundle built
from a local wheel cache and installed, with no index, into a fresh venv."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from gpuk8s import bundle as b
from gpuk8s.errors import BundleError
from tests.unit.installs import bare_venv, no_index, sh, wheel_cache

ROOT = Path(__file__).resolve().parents[2]


def _proc(rc: int, out: str) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(["pip"], rc, out, None)


def test_download_command_for_another_python_and_platform(tmp_path: Path) -> None:
    target = b.Target("3.12", ("manylinux_2_28_x86_64",))
    cmd = b.download_command(["invoke>=2.2", "pyyaml>=6.0"], tmp_path, target,
                             ["--no-index", "--find-links", "/w"])
    assert cmd[:4] == [sys.executable, "-m", "pip", "download"]
    assert "--only-binary=:all:" in cmd
    joined = " ".join(cmd)
    assert "--python-version 3.12 --implementation cp --abi cp312" in joined
    platforms = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--platform"]
    # pip matches tags literally: the older manylinux tags a glibc 2.28 box runs are added
    assert platforms[0] == "manylinux_2_28_x86_64"
    assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64",
            "manylinux1_x86_64"} <= set(platforms)
    assert "manylinux_2_29_x86_64" not in platforms
    assert cmd[-4:] == ["-d", str(tmp_path), "invoke>=2.2", "pyyaml>=6.0"]
    assert "--no-index --find-links /w" in joined
    assert target.tag == "py312" and target.arch == "x86_64"


def test_expand_platforms() -> None:
    arm = b.expand_platforms(["manylinux_2_28_aarch64"])
    assert arm[-2:] == ["manylinux_2_17_aarch64", "manylinux2014_aarch64"]  # no aarch64 before
    assert b.expand_platforms(["manylinux2014_x86_64"])[0] == "manylinux_2_17_x86_64"
    assert b.expand_platforms(["musllinux_1_2_x86_64"]) == ["musllinux_1_2_x86_64",
                                                           "musllinux_1_1_x86_64"]
    assert b.expand_platforms(["win_amd64", "win_amd64"]) == ["win_amd64"]
    both = b.expand_platforms(["manylinux_2_28_x86_64", "manylinux_2_17_x86_64"])
    assert len(both) == len(set(both))


def test_default_target_is_this_python_on_this_machine(tmp_path: Path) -> None:
    cmd = b.download_command(["rich"], tmp_path, b.Target())
    assert "--platform" not in cmd and "--python-version" not in cmd
    assert b.Target().version == "{}.{}".format(*sys.version_info[:2])


def test_requirements_come_from_pyproject() -> None:
    meta = b.project(ROOT)
    assert meta["name"] == "gpuk8s"
    reqs = meta["requirements"]
    for name in ("invoke", "fabric", "paramiko", "pyyaml", "jinja2", "rich"):
        assert any(r.startswith(name) for r in reqs), name
    assert any(r.startswith("setuptools") for r in reqs)  # pip install -e . builds with it
    assert not any(r.startswith(("pytest", "ruff", "mypy")) for r in reqs)  # dev extras stay


@pytest.mark.parametrize("bad", ["3", "3.12.1", "python3.12", "3.9"])
def test_bad_python_version(bad: str) -> None:
    with pytest.raises(BundleError) as err:
        b.bundle("/nonexistent", python_version=bad, runner=lambda cmd: pytest.fail("ran pip"))
    assert "fix:" in str(err.value)


UNREACHABLE = """Looking in indexes: http://127.0.0.1:9/simple
WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after \
connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPConnection object \
at 0x7f>: Failed to establish a new connection: [Errno 111] Connection refused')': /simple/invoke/
ERROR: Could not find a version that satisfies the requirement invoke>=2.2 (from versions: none)
ERROR: No matching distribution found for invoke>=2.2
"""


def test_index_unreachable_names_the_fix_and_shows_pips_tail() -> None:
    with pytest.raises(BundleError) as err:
        b.check_pip(_proc(1, UNREACHABLE), b.Target())
    text = str(err.value)
    assert text.startswith("pip cannot reach the package index")
    assert "Connection refused" in text and "No matching distribution found" in text
    assert "PIP_INDEX_URL" in text and "--find-links" in text


def test_no_wheel_for_the_target_names_the_package() -> None:
    out = ("Collecting pyyaml>=6.0\n"
           "ERROR: Could not find a version that satisfies the requirement pyyaml>=6.0 (from "
           "versions: 6.0.1)\nERROR: No matching distribution found for pyyaml>=6.0\n")
    with pytest.raises(BundleError) as err:
        b.check_pip(_proc(1, out), b.Target("3.14", ("manylinux_2_28_x86_64",)))
    text = str(err.value)
    assert text.startswith("no wheel of pyyaml ")
    assert "CPython 3.14 on manylinux_2_28_x86_64" in text
    assert "--python-version 3.X" in text and "ldd --version" in text


def test_a_backtracking_failure_names_what_has_no_wheel() -> None:
    # pip's own output (trimmed) for a target where cffi has no wheel at all
    out = ("ERROR: Cannot install paramiko because these package versions have conflicting "
           "dependencies.\n\nThe conflict is caused by:\n"
           '    cryptography 50.0.2 depends on cffi>=2.0.0; platform_python_implementation '
           '!= "PyPy"\n    cryptography 38.0.0 depends on cffi>=1.12\n\n'
           "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/\n")
    with pytest.raises(BundleError) as err:
        b.check_pip(_proc(1, out), b.Target("3.12", ("manylinux_2_28_x86_64",)))
    assert str(err.value).startswith("no wheel of cffi (")


def test_other_pip_failures_and_success() -> None:
    b.check_pip(_proc(0, "Successfully downloaded rich"), b.Target())
    with pytest.raises(BundleError, match=r"pip failed \(exit 2\):\n    ERROR: boom"):
        b.check_pip(_proc(2, "ERROR: boom\n"), b.Target())
    with pytest.raises(BundleError, match="has no pip"):
        b.check_pip(_proc(1, "/usr/bin/python3: No module named pip\n"), b.Target())


def _fake_pip(calls: list[list[str]]) -> b.Runner:
    def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d" if "download" in cmd else "-w") + 1])
        names = ["gpuk8s-0.1.0-py3-none-any.whl"] if "wheel" in cmd else \
            ["invoke-2.2.1-py3-none-any.whl", "pyyaml-6.0.4-cp312-cp312-manylinux_2_17.whl"]
        for n in names:
            (dest / n).write_bytes(b"x" * 1000)
        return _proc(0, "ok")
    return run


def test_bundle_layout_with_a_fake_pip(tmp_path: Path) -> None:
    calls: list[list[str]] = []
    out = io.StringIO()
    result = b.bundle(tmp_path, python_version="3.12", platforms=["manylinux_2_28_x86_64"],
                      tarball=True, find_links=["wheelhouse"], runner=_fake_pip(calls), out=out)
    name = "gpuk8s-bundle-0.1.0-py312-x86_64"
    assert result["path"] == str(tmp_path / f"{name}.tar.gz")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{name}.tar.gz"]
    assert result["wheels"] == 3
    download, wheel = calls
    assert "--python-version" in download and "--find-links" in download
    assert str(Path("wheelhouse").absolute()) in download and "--no-index" not in download
    assert wheel[3] == "wheel" and "--no-deps" in wheel
    with tarfile.open(result["path"]) as tar:
        members = {m.name: m for m in tar.getmembers()}
        install = tar.extractfile(f"{name}/INSTALL.txt").read().decode()  # type: ignore[union-attr]
    src = f"{name}/gpuk8s-0.1.0"
    for path in ("tasks.py", "pyproject.toml", "roles/base/role.py", "gpuk8s/bundle.py",
                 "inventories/lab.yaml", "gpuk8s/data/bundle-install.sh"):
        assert f"{src}/{path}" in members, path
    assert not [m for m in members if "/.venv/" in m or "__pycache__" in m or ".egg-info" in m]
    assert members[f"{name}/install.sh"].mode & 0o111
    assert f"{name}/wheels/gpuk8s-0.1.0-py3-none-any.whl" in members
    assert ("python3 -m venv .venv && .venv/bin/pip install --no-index --find-links ../wheels "
            "-e .") in install
    assert "must be 3.12" in install and "GPUK8S_HOME" in install
    summary = out.getvalue()
    assert "3 wheels" in summary and f"tar xzf {name}.tar.gz" in summary
    assert b.INSTALL in summary


def test_the_checkout_copy_skips_the_bundles_folder(tmp_path: Path) -> None:
    source = b.source_files(ROOT, skip=ROOT / "dist")
    assert "tasks.py" in source.files and "roles/base/role.py" in source.files
    assert not [f for f in source.files if f.startswith(("dist/", ".venv/", "runs/"))]


# -- what a bundle packs: committed files only, never secrets (review 2, M2) --------------------

SECRET = "hunter2-S3CRET"
ADMIN_CONF = ("apiVersion: v1\nkind: Config\nusers:\n- name: kubernetes-admin\n  user:\n"
              "    client-certificate-data: QUJDREVGR0g=\n    client-key-data: "
              "U0VDUkVUS0VZREFUQQ==\n")


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                    *args], check=True, capture_output=True)


def _checkout(tmp_path: Path) -> Path:
    """A small real git checkout of a gpuk8s-like project: committed, then dirtied."""
    repo = tmp_path / "checkout"
    files = {"pyproject.toml": (ROOT / "pyproject.toml").read_text(),
             "tasks.py": "# tasks\n", "roles/base/role.py": "# role\n",
             "gpuk8s/__init__.py": "", "inventories/lab.yaml": "all: {}\n",
             ".gitignore": "runs/\n",
             # committed by mistake: never packed all the same
             "inventories/old/artifacts/admin.conf": ADMIN_CONF,
             "inventories/keys/deploy.key": "x\n",
             "docs/notes.txt": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaA==\n"}
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    (repo / "scripts").mkdir()
    (repo / "scripts/setup").write_text("#!/bin/sh\n")
    (repo / "scripts/setup").chmod(0o755)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "init")
    # after the commit: a password added to a tracked inventory, a tracked file deleted, an
    # untracked inventory and the admin.conf bootstrap writes next to a subfolder inventory
    (repo / "inventories/lab.yaml").write_text(f"all: {{vars: {{ansible_become_password: "
                                               f"{SECRET}}}}}\n")
    (repo / "roles/base/role.py").unlink()
    (repo / "inventories/prod/artifacts").mkdir(parents=True)
    (repo / "inventories/prod/artifacts/admin.conf").write_text(ADMIN_CONF)
    (repo / "inventories/prod/hosts.yaml").write_text(f"# {SECRET}\n")
    (repo / "runs/20260101-000000-bootstrap").mkdir(parents=True)
    (repo / "runs/20260101-000000-bootstrap/cp-01.log").write_text(SECRET)
    (repo / "inventories/staged.yaml").write_text(f"# {SECRET}\n")
    _git(repo, "add", "inventories/staged.yaml")  # staged, never committed
    return repo


def _bundle_of(repo: Path, out: Path) -> tuple[dict[str, object], dict[str, bytes], str]:
    summary = io.StringIO()
    result = b.bundle(out, tarball=True, root=repo, runner=_fake_pip([]), out=summary)
    with tarfile.open(str(result["path"])) as tar:
        packed = {m.name.split("/", 2)[2]: tar.extractfile(m).read()  # type: ignore[union-attr]
                  for m in tar.getmembers() if m.isfile() and m.name.count("/") >= 2
                  and m.name.split("/")[1].startswith("gpuk8s-")}
        modes = {m.name.split("/", 2)[2]: m.mode for m in tar.getmembers()
                 if m.name.count("/") >= 2 and m.name.split("/")[1].startswith("gpuk8s-")}
    assert modes["scripts/setup"] & 0o111 and not modes["tasks.py"] & 0o111
    return result, packed, summary.getvalue()


def test_a_bundle_packs_the_committed_files_only(tmp_path: Path) -> None:
    repo = _checkout(tmp_path)
    result, packed, summary = _bundle_of(repo, tmp_path / "out")
    blob = b"".join(packed.values())
    # the committed lab.yaml, not the edited one; the deleted file as committed
    assert packed["inventories/lab.yaml"] == b"all: {}\n"
    assert packed["roles/base/role.py"] == b"# role\n"
    assert SECRET.encode() not in blob
    assert b"client-key-data" not in blob and b"PRIVATE KEY" not in blob
    assert not [p for p in packed if "artifacts" in p or p.startswith("runs/")
                or p.endswith(".key") or p == "docs/notes.txt"]
    # every change and every file left behind is named
    assert result["changed"] == ["inventories/lab.yaml", "roles/base/role.py"]
    assert result["untracked"] == ["inventories/staged.yaml",
                                   "inventories/prod/artifacts/admin.conf",
                                   "inventories/prod/hosts.yaml"]  # runs/ is ignored
    assert set(result["withheld"]) == {  # type: ignore[arg-type]
        "inventories/old/artifacts/admin.conf", "inventories/keys/deploy.key",
        "docs/notes.txt"}
    assert ("uncommitted changes left out (packed as in commit " in summary
            and "(HEAD)): 2 file(s): inventories/lab.yaml, roles/base/role.py" in summary)
    assert "not in commit" in summary and "inventories/prod/hosts.yaml" in summary
    assert "never packed" in summary and "docs/notes.txt (holds a private key)" in summary
    # the manifest lists what was packed, as sha256sum checks it
    manifest = packed[b.MANIFEST].decode().splitlines()
    lab_sha = hashlib.sha256(b"all: {}\n").hexdigest()
    assert f"{lab_sha}  inventories/lab.yaml" in manifest
    assert len(manifest) == len(packed) - 1


def test_rebundling_from_a_bundles_checkout_carries_no_local_files(tmp_path: Path) -> None:
    """A bundle's checkout has no .git and INSTALL.txt says to keep inventories there: a
    bundle made from it packs what it shipped with, and nothing of the admin machine's."""
    repo = _checkout(tmp_path)
    first, _, _ = _bundle_of(repo, tmp_path / "out")
    admin = tmp_path / "admin"
    admin.mkdir()
    with tarfile.open(str(first["path"])) as tar:
        tar.extractall(admin, filter="tar")
    checkout = next(admin.glob("gpuk8s-bundle-*/gpuk8s-*"))
    (checkout / "inventories/prod/artifacts").mkdir(parents=True)
    (checkout / "inventories/prod/artifacts/admin.conf").write_text(ADMIN_CONF)
    (checkout / "inventories/prod/hosts.yaml").write_text(f"# {SECRET}\n")
    (checkout / "inventories/lab.yaml").write_text(f"# {SECRET}\n")  # a shipped file, edited
    (checkout / "runs/20260101-000000-plan").mkdir(parents=True)
    (checkout / "runs/20260101-000000-plan/cp-01.log").write_text(SECRET)
    (checkout / ".venv/bin").mkdir(parents=True)
    (checkout / ".venv/bin/python").write_text("x")
    result, packed, summary = _bundle_of(checkout, tmp_path / "out2")
    assert SECRET.encode() not in b"".join(packed.values())
    assert "inventories/lab.yaml" not in packed and "tasks.py" in packed
    assert result["origin"] == b.MANIFEST and result["changed"] == ["inventories/lab.yaml"]
    assert result["untracked"] == ["inventories/prod/artifacts/admin.conf",
                                   "inventories/prod/hosts.yaml"]  # runs/, .venv/: unnamed
    assert "inventories/prod/artifacts/admin.conf" in summary
    assert ("left out, changed since the bundle was made (not as BUNDLE-FILES.sha256 lists "
            "them): 1 file(s): inventories/lab.yaml") in summary
    # a changed file gpuk8s needs: refused, not left out
    (checkout / "tasks.py").write_text("# edited\n")
    with pytest.raises(BundleError, match=r"tasks\.py") as err:
        b.source_files(checkout)
    assert "sha256sum -c BUNDLE-FILES.sha256" in str(err.value)


def test_a_folder_without_git_or_manifest_is_refused(tmp_path: Path) -> None:
    co = tmp_path / "co"
    (co / "inventories/prod/artifacts").mkdir(parents=True)
    (co / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (co / "inventories/prod/artifacts/admin.conf").write_text(ADMIN_CONF)
    with pytest.raises(BundleError) as err:
        b.bundle(tmp_path / "out", root=co, runner=lambda cmd: pytest.fail("ran pip"),
                 out=io.StringIO())
    text = str(err.value)
    assert "neither a git checkout nor a bundle's checkout" in text
    assert "fix: bundle from a git clone" in text
    assert not (tmp_path / "out").exists()


def test_artifacts_and_run_folders_are_ignored_at_any_depth(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    _git(tmp_path, "init", "-q", str(repo))
    shutil.copy(ROOT / ".gitignore", repo / ".gitignore")
    for rel in ("inventories/prod/artifacts/admin.conf", "site/a/runs/x/cp-01.log",
                "elsewhere/20260101-000000-bootstrap/cp-01.log", "inventories/prod/hosts.yaml"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("x")
    _git(repo, "add", "-A")
    staged = subprocess.run(["git", "-C", str(repo), "diff", "--cached", "--name-only"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert sorted(staged) == [".gitignore", "inventories/prod/hosts.yaml"]


def test_invoke_and_cli_wiring(monkeypatch: pytest.MonkeyPatch) -> None:
    import tasks
    from gpuk8s import cli
    from gpuk8s.lock import bundle as cluster

    assert cli.COMMANDS["bundle"] is cluster.bundle  # which calls b.bundle, --cluster or not
    assert cli.run("bundle", python_version="2.7") == 1  # a BundleError: message, exit 1
    # --cluster needs the inventory's lock: said before any wheel is fetched
    assert cli.run("bundle", cluster=True, inventory="/nonexistent/inv.yaml") == 1
    seen: list[dict[str, object]] = []
    monkeypatch.setitem(cli.COMMANDS, "bundle", lambda **kw: seen.append(kw))
    assert cli.main(["bundle", "--python-version", "3.12", "--platform", "a", "--platform",
                     "b", "--tarball", "-o", "out"]) == 0
    assert seen[-1] == {"output": "out", "python_version": "3.12", "platforms": ["a", "b"],
                        "tarball": True, "find_links": [], "no_index": False,
                        "cluster": False, "inventory": cli.INVENTORY}
    assert cli.main(["bundle", "--cluster", "-i", "x.yaml"]) == 0
    assert seen[-1]["cluster"] is True and seen[-1]["inventory"] == "x.yaml"
    assert "bundle" in tasks.ns.task_names


# -- the real thing ------------------------------------------------------------------------

def test_a_real_bundle_installs_with_no_index(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    cache = wheel_cache(b.project(ROOT)["requirements"])
    start = time.monotonic()
    no_index(monkeypatch)
    for var in ("GPUK8S_HOME", "PYTHONPATH"):  # PYTHONPATH: the venvs import their own gpuk8s
        monkeypatch.delenv(var, raising=False)
    result = b.bundle(tmp_path / "out", tarball=True, find_links=[str(cache)], no_index=True,
                      out=io.StringIO())
    admin = tmp_path / "admin"
    admin.mkdir()
    with tarfile.open(result["path"]) as tar:
        tar.extractall(admin, filter="tar")
    top = admin / Path(result["path"]).name.removesuffix(".tar.gz")
    checkout = top / "gpuk8s-0.1.0"
    # the documented way: install.sh, a venv in the checkout with gpuk8s editable
    installer = subprocess.Popen([str(top / "install.sh")], cwd=top, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True,
                                 env={**os.environ, "PYTHON": sys.executable})
    # meanwhile the other way: the gpuk8s wheel in a bare venv, GPUK8S_HOME at the checkout
    venv = tmp_path / "venv"
    bare_venv(venv, top / "wheels", "gpuk8s")
    code = "import gpuk8s, fabric, invoke, paramiko; print(gpuk8s.__file__)"
    assert str(venv) in sh([str(venv / "bin/python"), "-c", code], tmp_path)
    out = sh([str(venv / "bin/gpuk8s"), "check", "-i", "inventories/lab.yaml"], checkout,
              GPUK8S_HOME=str(checkout))
    assert "no problems" in out
    log, _ = installer.communicate(timeout=300)
    assert installer.returncode == 0, log[-4000:]
    python = checkout / ".venv/bin/python"
    assert str(checkout) in sh([str(python), "-c", code], tmp_path)  # editable: the checkout
    assert "bootstrap" in sh([str(checkout / ".venv/bin/invoke"), "--list"], checkout)
    elapsed = time.monotonic() - start
    print(f"bundle {result['bytes'] / 2**20:.1f} MiB, {result['wheels']} wheels; "
          f"built and installed twice in {elapsed:.1f} s")
