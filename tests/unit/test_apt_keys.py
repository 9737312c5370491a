"""pkgs.k8s.io's signing key is re-published with a later expiry under the same fingerprint
(it expired once, 2024-11-02: kubernetes/kubernetes#128609, kubernetes/release#3818): a keyring
holding an expired copy, or one expiring within 30 days, is fetched again, and the expiry gpuk8s
reads from the keyring is what the real gpg reads."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.facts.system import FileState


def _gpg(home: Path, *args: str, faked: int | None = None) -> bytes:
    import subprocess

    fake = [f"--faked-system-time={faked}!"] if faked else []
    return subprocess.run(["gpg", "--homedir", str(home), "--batch", "--pinentry-mode",
                           "loopback", "--passphrase", "", *fake, *args],
                          capture_output=True, check=True).stdout


@pytest.fixture(scope="module")
def gpg_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, int]:
    """A real gpg key made a year ago (ed25519, certify+sign), as OBS's repository keys are."""
    import time

    home = tmp_path_factory.mktemp("gnupg")
    home.chmod(0o700)
    born = int(time.time()) - 365 * 86400
    _gpg(home, "--quick-gen-key", "test repo <repo@gpuk8s.invalid>", "ed25519", "cert,sign",
         "seconds=63072000", faked=born)
    fpr = next(ln.split(":")[9] for ln in _gpg(home, "--with-colons", "--list-keys")
               .decode().splitlines() if ln.startswith("fpr:"))
    return home, fpr, born


def _copy_expiring_at(key: tuple[Path, str, int], tmp_path: Path, expires: int,
                      signed: int) -> bytes:
    """An export of the key whose newest self-signature (made at ``signed``) sets its expiry
    to ``expires``, as a re-published (or an old) copy of pkgs.k8s.io's key is."""
    import shutil

    home, fpr, _ = key
    copy = tmp_path / "home"
    shutil.copytree(home, copy, ignore=shutil.ignore_patterns("S.*"))
    _gpg(copy, "--quick-set-expire", fpr, f"seconds={expires - signed}", faked=signed)
    return _gpg(copy, "--export", fpr)


def _gpg_says(tmp_path: Path, keyring: bytes) -> tuple[str, int | None]:
    import subprocess

    (tmp_path / "k.gpg").write_bytes(keyring)
    out = subprocess.run(["gpg", "--show-keys", "--with-colons", str(tmp_path / "k.gpg")],
                         capture_output=True, text=True, check=True,
                         env={"GNUPGHOME": str(tmp_path), "PATH": "/usr/bin:/bin"}).stdout
    pub = next(ln for ln in out.splitlines() if ln.startswith("pub:")).split(":")
    fpr = next(ln for ln in out.splitlines() if ln.startswith("fpr:")).split(":")[9]
    return fpr, int(pub[6]) if pub[6] else None


@pytest.mark.parametrize("days_left", [-30, 10, 200])
def test_keyring_expiry_is_what_the_real_gpg_reads(gpg_key: tuple[Path, str, int],
                                                   tmp_path: Path, days_left: int) -> None:
    import time

    from gpuk8s.ops.apt import keyring_keys

    now = int(time.time())
    signed = now - 40 * 86400 if days_left < 0 else now - 60
    keyring = _copy_expiring_at(gpg_key, tmp_path, now + days_left * 86400, signed)
    fpr, expires = _gpg_says(tmp_path, keyring)
    assert keyring_keys(keyring) == [type(keyring_keys(keyring)[0])(fpr, expires)]
    assert expires is not None and abs(expires - (now + days_left * 86400)) < 5


def _repo_op(keyring: bytes, fpr: str, *, mtime: int = 0, now: float | None = None) -> Any:
    from gpuk8s.ops.apt import repo, source_line

    key_path = "/etc/apt/keyrings/kubernetes-apt-keyring.gpg"
    listing = ("# managed by gpuk8s; key from https://k/Release.key\n" +
               source_line("https://k/deb/", "/", "", key_path)).encode()
    return repo(FileState("/etc/apt/sources.list.d/kubernetes.list", True, "644", "root",
                          hashlib.sha256(listing).hexdigest()),
                FileState(key_path, True, "644", "root", "x", keyring, mtime),
                "kubernetes | apt repo", name="kubernetes", url="https://k/deb/", suite="/",
                components="", key_url="https://k/Release.key", fingerprint=fpr,
                fingerprint_var="kubernetes_repo_key_fingerprint", now=now)


def test_an_expired_copy_of_the_pinned_key_is_fetched_again(gpg_key: tuple[Path, str, int],
                                                            tmp_path: Path) -> None:
    import time

    now = int(time.time())
    expired = _copy_expiring_at(gpg_key, tmp_path, now - 86400, now - 40 * 86400)
    op = _repo_op(expired, gpg_key[1], now=now)
    assert op.changes
    day = time.strftime("%Y-%m-%d", time.gmtime(now - 86400))
    assert f"expired on {day}" in op.reason and "EXPKEYSIG" in op.reason
    assert "checked against the pinned fingerprint" in op.reason
    assert gpg_key[1] in op.commands[0]  # the fetch still checks the pin


def test_an_expiring_key_is_fetched_again_once_a_day(gpg_key: tuple[Path, str, int],
                                                     tmp_path: Path) -> None:
    import time

    now = int(time.time())
    soon = _copy_expiring_at(gpg_key, tmp_path, now + 10 * 86400, now - 60)
    op = _repo_op(soon, gpg_key[1], mtime=now - 3 * 86400, now=now)
    assert op.changes and ("in 9 day(s)" in op.reason or "in 10 day(s)" in op.reason)
    # fetched an hour ago and upstream has not extended it: no change (a second run is a no-op)
    again = _repo_op(soon, gpg_key[1], mtime=now - 3600, now=now)
    assert not again.changes and "not extended it yet" in again.reason
    later = _copy_expiring_at(gpg_key, tmp_path / "b", now + 200 * 86400, now - 60)
    assert not _repo_op(later, gpg_key[1], now=now).changes
