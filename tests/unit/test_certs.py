"""The certificate expiry fact (openssl's -enddate lines) and the warnings status and the plan
print from it."""

from __future__ import annotations

import datetime as dt

from gpuk8s.day2.status import certificate_lines
from gpuk8s.facts.certs import CertExpiry, CertState, expiry_warning

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
# what the probe prints: openssl x509 -noout -enddate, notAfter= cut (LC_ALL=C)
OUTPUT = """\
/etc/kubernetes/pki/apiserver.crt Nov 29 11:58:02 2027 GMT
/etc/kubernetes/pki/ca.crt Nov 27 11:58:01 2036 GMT
/etc/kubernetes/pki/etcd/server.crt Dec  9 11:58:03 2026 GMT
/etc/kubernetes/pki/front-proxy-ca.crt Nov 27 11:58:01 2036 GMT
/etc/kubernetes/admin.conf Nov 29 11:58:04 2027 GMT
/var/lib/kubelet/pki/kubelet-client-current.pem Oct  1 08:00:00 2027 GMT
garbage line
/etc/kubernetes/pki/broken.crt not a date
"""


def test_the_probe_lines_parse_to_utc_times() -> None:
    state = CertExpiry().parse(OUTPUT, 0)
    assert state.expiry["/etc/kubernetes/pki/etcd/server.crt"] == \
        dt.datetime(2026, 12, 9, 11, 58, 3, tzinfo=dt.UTC)
    assert "/etc/kubernetes/pki/broken.crt" not in state.expiry
    assert state.earliest() == ("/etc/kubernetes/pki/etcd/server.crt",
                                dt.datetime(2026, 12, 9, 11, 58, 3, tzinfo=dt.UTC))
    assert state.earliest(cas=True)[0] in ("/etc/kubernetes/pki/ca.crt",
                                           "/etc/kubernetes/pki/front-proxy-ca.crt")
    assert CertExpiry().parse("", 0) == CertState()


def test_the_warning_names_the_soonest_and_the_fix() -> None:
    state = CertExpiry().parse(OUTPUT, 0)
    said = expiry_warning(state, NOW)
    assert said.startswith("certificates expire in 9 day(s) (etcd/server.crt; the first "
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
                "warning": expiry_warning(CertExpiry().parse(OUTPUT, 0), NOW)}},
            {"host": "gpu-01"}]
    lines = certificate_lines(rows)
    assert lines[0] == ("certificates: cp-01 until 2027-11-29 (364 d)", "green")
    assert lines[1][0].startswith("warning: cp-02-with-a-long-name: certificates expire in 9")
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
