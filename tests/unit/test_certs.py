"""The certificate expiry fact (the node's certificates, read on the admin machine and checked
against the real openssl's -enddate) and the warnings status and the plan print from it."""

from __future__ import annotations

import base64
import datetime as dt
import subprocess
from pathlib import Path

import pytest

from gpuk8s.day2.status import certificate_lines
from gpuk8s.facts.certs import CertExpiry, CertState, expiry_warning

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
DAYS = {"apiserver.crt": 365, "ca.crt": 3650, "etcd/server.crt": 10, "front-proxy-ca.crt": 3650,
        "kubelet-client-current.pem": 300, "admin.conf": 365}


def _openssl(*args: str, cwd: Path) -> str:
    return subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"}).stdout


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A node's kubeadm files as the real openssl writes them: certificates of different
    lifetimes, a kubelet client .pem with its key, a kubeconfig with client-certificate-data
    and client-key-data, and a broken certificate."""
    root = tmp_path_factory.mktemp("node")
    (root / "etc/kubernetes/pki/etcd").mkdir(parents=True)
    (root / "var/lib/kubelet/pki").mkdir(parents=True)
    for name, days in DAYS.items():
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                 "-nodes", "-keyout", "key.pem", "-out", "cert.pem", "-days", str(days),
                 "-subj", f"/CN={name.replace('/', '-')}", cwd=root)
        cert, key = (root / "cert.pem").read_bytes(), (root / "key.pem").read_bytes()
        if name == "admin.conf":
            (root / "etc/kubernetes/admin.conf").write_text(
                "users:\n- name: kubernetes-admin\n  user:\n"
                f"    client-certificate-data: {base64.b64encode(cert).decode()}\n"
                f"    client-key-data: {base64.b64encode(key).decode()}\n")
        elif name.endswith(".pem"):
            (root / "var/lib/kubelet/pki" / name).write_bytes(cert + key)
        else:
            (root / "etc/kubernetes/pki" / name).write_bytes(cert)
    (root / "etc/kubernetes/pki/broken.crt").write_text(
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")
    (root / "etc/kubernetes/pki/truncated.crt").write_text("-----BEGIN CERTIFICATE-----\nMII\n")
    (root / "key.pem").unlink()
    (root / "cert.pem").unlink()
    return root


def probe(root: Path) -> str:
    script = CertExpiry().command().replace("/etc/kubernetes", f"{root}/etc/kubernetes") \
        .replace("/var/lib/kubelet", f"{root}/var/lib/kubelet")
    return subprocess.run(["sh", "-c", script], check=True, capture_output=True,
                          text=True).stdout


def test_the_probe_reads_what_openssl_reads_and_prints_no_key(node: Path) -> None:
    out = probe(node)
    assert "PRIVATE KEY" not in out and "client-key-data" not in out
    state = CertExpiry().parse(out, 0)
    got = {p.replace(str(node), ""): t for p, t in state.expiry.items()}
    assert set(got) == {"/etc/kubernetes/pki/apiserver.crt", "/etc/kubernetes/pki/ca.crt",
                        "/etc/kubernetes/pki/etcd/server.crt",
                        "/etc/kubernetes/pki/front-proxy-ca.crt", "/etc/kubernetes/admin.conf",
                        "/var/lib/kubelet/pki/kubelet-client-current.pem"}, got
    for path, when in got.items():
        if path.endswith(".conf"):
            continue
        said = _openssl("x509", "-noout", "-enddate", "-in", f"{node}{path}", cwd=node)
        assert when == dt.datetime.strptime(" ".join(said.split("=", 1)[1].split()),
                                            "%b %d %H:%M:%S %Y GMT").replace(tzinfo=dt.UTC)
    left = {p.rpartition("/")[2]: (t - dt.datetime.now(dt.UTC)).days for p, t in got.items()}
    assert left["server.crt"] in (9, 10) and left["admin.conf"] in (364, 365)
    assert left["kubelet-client-current.pem"] in (299, 300)
    assert CertExpiry().parse("", 0) == CertState()


def test_a_node_before_kubeadm_prints_nothing(tmp_path: Path) -> None:
    assert probe(tmp_path) == ""
    (tmp_path / "etc/kubernetes").mkdir(parents=True)
    assert probe(tmp_path) == ""


def _state(days: dict[str, float]) -> CertState:
    return CertState({f"/etc/kubernetes/{p}": NOW + dt.timedelta(days=d)
                      for p, d in days.items()})


STATE = _state({"pki/apiserver.crt": 365, "pki/ca.crt": 3650, "pki/etcd/server.crt": 10,
                "pki/front-proxy-ca.crt": 3650, "admin.conf": 365})


def test_the_earliest_leaf_and_ca() -> None:
    assert STATE.earliest() == ("/etc/kubernetes/pki/etcd/server.crt",
                                NOW + dt.timedelta(days=10))
    assert STATE.earliest(cas=True)[0] in ("/etc/kubernetes/pki/ca.crt",
                                           "/etc/kubernetes/pki/front-proxy-ca.crt")


def test_the_warning_names_the_soonest_and_the_fix() -> None:
    state = STATE
    said = expiry_warning(state, NOW)
    assert said.startswith("certificates expire in 10 day(s) (etcd/server.crt; the first "
                           "2026-12-09): renew them: `kubeadm certs renew all`"), said
    assert expiry_warning(state, NOW - dt.timedelta(days=30)) == ""
    gone = expiry_warning(state, NOW + dt.timedelta(days=12))
    assert gone.startswith("certificates expired 2 day(s) ago"), gone
    ca = CertState({"/etc/kubernetes/pki/ca.crt": NOW + dt.timedelta(days=3)})
    assert "kubeadm does not renew CAs" in expiry_warning(ca, NOW)


def test_status_lines_fit_80_columns() -> None:
    rows = [{"host": "cp-01", "certificates": {"earliest": "2027-11-29T11:58:02Z",
                                               "days_left": 364, "warning": ""}},
            {"host": "cp-02-with-a-long-name", "certificates": {
                "earliest": "2026-12-09T11:58:03Z", "days_left": 9,
                "warning": expiry_warning(STATE, NOW)}},
            {"host": "gpu-01"}]
    lines = certificate_lines(rows)
    assert lines[0] == ("certificates: cp-01 until 2027-11-29 (364 d)", "green")
    assert lines[1][0].startswith("warning: cp-02-with-a-long-name: certificates expire in 10")
    assert all(len(text) <= 80 and style in ("green", "yellow") for text, style in lines)
    assert lines[-1][0].startswith("  ")  # the warning's wrapped tail


def test_the_restart_puts_the_manifests_back_whatever_happens() -> None:
    from gpuk8s.day2.certs import RENEW, restart_script

    script = restart_script()
    # the trap that moves them back is set before any manifest moves, and cleared only after
    # they are back
    assert script.index("trap back EXIT") < script.index('mv "$f" "$d"/')
    assert script.index("back\ntrap - EXIT") > script.index("did not stop etcd")
    for pod in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        assert f"/etc/kubernetes/manifests/{pod}.yaml" in script
    # done means served: both daemons' certificates compared with the renewed files
    assert 'served "$a:6443")" = "$want_api"' in script
    assert 'served 127.0.0.1:2379' in script and '"$want_etcd"' in script
    # admin.conf's copies: only regular files that still equal the old admin.conf
    assert "-type f" in RENEW and 'cmp -s "$old"' in RENEW
    assert "Done renewing certificates" in RENEW
