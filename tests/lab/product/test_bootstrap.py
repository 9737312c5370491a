"""gpuk8s against the booted lab over real SSH: plan changes nothing, bootstrap (as a sudo user
with a password) makes a Ready GPU cluster, a second run (as root by key) changes nothing.

The tests of this module run in order and share the lab; the last one snapshots the
bootstrapped lab as "bootstrapped" for later modules.
"""

from __future__ import annotations

import io
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import api, htmlreport
from gpuk8s.playbook import PHASES
from gpuk8s.report import Reporter
from tests.browser import render, timeline_problems
from tests.lab.lab import Lab
from tests.lab.paths import REPO_ROOT
from tests.lab.product.runs import (
    PYTHON,
    bootstrapped_is_current,
    restore_fresh,
    snapshot_bootstrapped,
)
from tests.lab.repos import real_kubectl

pytestmark = pytest.mark.lab

ROOT = REPO_ROOT
GATES = "feature_gates={InPlacePodVerticalScaling: true, UserNamespacesSupport: true}"
#: the same, as the inventory variable (the "bootstrapped" snapshot was made with these)
GATE_VARS = {"InPlacePodVerticalScaling": True, "UserNamespacesSupport": True}
NODES = ("cp-01", "gpu-01", "gpu-02", "cpu-01")
#: what a node's state is, for "plan changes nothing": packages and every file under /etc
STATE_CMD = ("dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\\n' | sha256sum; "
             "find /etc -xdev -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum; "
             "find /etc -xdev | sort | sha256sum")


def run_api(fn: Any, *args: Any, **kwargs: Any) -> tuple[dict[str, Any], str]:
    out = io.StringIO()
    result = fn(*args, reporter=Reporter(out), **kwargs)
    text = out.getvalue()
    sys.stdout.write(text)
    return result, text


def node_state(lab: Lab) -> dict[str, str]:
    state = {}
    for name in NODES:
        rc, out, err = lab.ssh(name, STATE_CMD)
        assert rc == 0, err
        state[name] = out
    return state


def kubectl_cp(lab: Lab, args: str) -> str:
    rc, out, err = lab.ssh("cp-01", f"kubectl --kubeconfig /etc/kubernetes/admin.conf {args}")
    assert rc == 0, f"kubectl {args}: {err}"
    return out


@pytest.fixture(scope="module")
def fresh(lab: Lab) -> Lab:
    """The default lab, fresh; snapshotted once as "fresh" so later modules can go back."""
    return restore_fresh(lab)


def test_plan_on_fresh_nodes_lists_changes_and_changes_nothing(fresh: Lab) -> None:
    before = node_state(fresh)
    result, text = run_api(api.plan, fresh.inventory_path, sets=[GATES], diff=True)
    assert result["planned"] > 20
    for name in NODES:
        assert f"{name}: " in text, f"no plan shown for {name}"
    assert "+ kubeadm init" in text and "+ kubeadm join" in text
    assert "nvidia-open-580" in text  # GPU nodes plan the driver
    assert node_state(fresh) == before, "invoke plan changed a node"


#: the first bootstrap's run folder, for the run-page test below
FIRST_RUN: dict[str, Path] = {}


def test_bootstrap_as_sudo_user_with_password(fresh: Lab, monkeypatch: pytest.MonkeyPatch,
                                              capfd: pytest.CaptureFixture[str]) -> None:
    password = fresh.labadmin_password
    monkeypatch.setenv("GPUK8S_BECOME_PASSWORD", password)
    result, text = run_api(api.bootstrap, fresh.become_inventory_path, sets=[GATES], yes=True)
    FIRST_RUN["bootstrap"] = Path(result["run_dir"])
    # the GPU nodes rebooted for their driver: one calm line each, and no library traceback
    # (paramiko's refused handshakes go to the run's library.log) on stdout or stderr
    terminal = text + "".join(capfd.readouterr())
    for gpu_node in ("gpu-01", "gpu-02"):
        assert re.search(rf"\[{gpu_node}\] rebooting \.\.\. back after \d+ s", text), text
        assert text.count(f"[{gpu_node}] rebooting") == 1, text
    assert "Traceback" not in terminal and "Exception (client)" not in terminal, terminal
    assert result["changed"] > 20
    assert all(t["failed"] == 0 for t in result["totals"].values())
    run_dir = Path(result["run_dir"])
    written = "".join(p.read_text() for p in run_dir.iterdir())
    assert password not in text and password not in written
    report = json.loads((run_dir / "report.json").read_text())
    assert [p["phase"] for p in report["phases"]] == [phase.name for phase in PHASES]
    assert stat.S_IMODE((run_dir / "report.json").stat().st_mode) == 0o600
    # the join token minted for this run never reaches the output or the run folder
    tokens = kubectl_cp(fresh, "get secrets -n kube-system -o json")
    for item in json.loads(tokens)["items"]:
        if item["metadata"]["name"].startswith("bootstrap-token-"):
            import base64

            secret = base64.b64decode(item["data"]["token-secret"]).decode()
            assert secret not in text and secret not in written


def test_cluster_is_ready_with_gpus(fresh: Lab) -> None:
    nodes = json.loads(kubectl_cp(fresh, "get nodes -o json"))["items"]
    by_name = {n["metadata"]["name"]: n for n in nodes}
    assert sorted(by_name) == sorted(NODES)
    for name, node in by_name.items():
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", f"{name} not Ready: {ready}"
    gpus = {name: node["status"].get("allocatable", {}).get("nvidia.com/gpu")
            for name, node in by_name.items()}
    assert gpus == {"cp-01": None, "gpu-01": "2", "gpu-02": "1", "cpu-01": None}


def test_kubectl_from_admin_machine(fresh: Lab) -> None:
    conf = fresh.become_inventory_path.parent / "artifacts" / "admin.conf"
    assert conf.exists() and stat.S_IMODE(conf.stat().st_mode) == 0o600
    # the REAL kubectl on the lab host, as an admin would use the fetched kubeconfig
    out = subprocess.run([str(real_kubectl()), "--kubeconfig", str(conf), "get", "nodes"],
                         capture_output=True, text=True, check=False, timeout=60,
                         env={**os.environ, "HOME": str(conf.parent)})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:2] == ["NAME", "STATUS"]
    assert sorted(line.split()[0] for line in lines[1:]) == sorted(NODES)
    assert all(line.split()[1] == "Ready" for line in lines[1:])


def test_feature_gates_reach_every_kubelet_and_the_apiserver(fresh: Lab) -> None:
    for name in NODES:
        rc, out, err = fresh.ssh(name, "cat /var/lib/kubelet/config.yaml")
        assert rc == 0, err
        assert "InPlacePodVerticalScaling: true" in out, f"{name} kubelet config: {out}"
        assert "UserNamespacesSupport: true" in out
    rc, manifest, _ = fresh.ssh("cp-01", "cat /etc/kubernetes/manifests/kube-apiserver.yaml")
    assert rc == 0
    assert "--feature-gates=InPlacePodVerticalScaling=true,UserNamespacesSupport=true" in manifest
    metrics = kubectl_cp(fresh, "get --raw /metrics")
    assert 'kubernetes_feature_enabled{name="InPlacePodVerticalScaling"' in metrics


def test_second_run_as_root_changes_nothing(fresh: Lab) -> None:
    before = node_state(fresh)
    result, text = run_api(api.bootstrap, fresh.inventory_path, sets=[GATES], yes=True)
    assert result["changed"] == 0, text
    assert "no changes" in text and "wall time" in text
    print(f"\nno-op re-run wall time: {result['wall_time']:.2f}s")
    assert node_state(fresh) == before


def _expired_copy_of_the_lab_key(home: Path) -> bytes:
    """The lab's repository key with a newer self-signature that expired it (as a node keeps
    an old copy of pkgs.k8s.io's key after OBS re-published it with a later expiry)."""
    from tests.lab.repos import LAB_KEY_FILE

    home.mkdir(mode=0o700)
    gpg = ["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback",
           "--passphrase", ""]
    subprocess.run([*gpg, "--import", str(LAB_KEY_FILE)], check=True, capture_output=True)
    pub = subprocess.run([*gpg, "--with-colons", "--list-keys"], check=True,
                         capture_output=True, text=True).stdout.splitlines()
    created = int(next(ln for ln in pub if ln.startswith("pub:")).split(":")[5])
    fpr = next(ln for ln in pub if ln.startswith("fpr:")).split(":")[9]
    subprocess.run([*gpg, f"--faked-system-time={created + 10}!", "--quick-set-expire", fpr,
                    "seconds=60"], check=True, capture_output=True)
    return subprocess.run([*gpg, "--export", fpr], check=True, capture_output=True).stdout


def test_an_expired_copy_of_the_pinned_repo_key_is_fetched_again(fresh: Lab,
                                                                  tmp_path: Path) -> None:
    """pkgs.k8s.io re-publishes its key with a later expiry under the same fingerprint: a node
    holding the expired copy fails every `apt-get update` (EXPKEYSIG) until it is fetched
    again. plan names it first; bootstrap fetches it (still checked against the pin)."""
    import base64

    keyring = "/etc/apt/keyrings/kubernetes-apt-keyring.gpg"
    expired = base64.b64encode(_expired_copy_of_the_lab_key(tmp_path / "gnupg")).decode()
    rc, _, err = fresh.ssh("gpu-01", f"echo {expired} | base64 -d > {keyring}")
    assert rc == 0, err
    update = ("apt-get update -o Dir::Etc::sourcelist=/etc/apt/sources.list.d/kubernetes.list "
              "-o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0 2>&1")
    rc, out, _ = fresh.ssh("gpu-01", update)
    assert "EXPKEYSIG" in out or "expired" in out, out  # the real apt refuses it
    _, text = run_api(api.plan, fresh.inventory_path, sets=[GATES])
    assert f"the key in {keyring} expired on" in text, text
    assert "checked against the pinned fingerprint" in text, text
    result, text = run_api(api.bootstrap, fresh.inventory_path, sets=[GATES], yes=True)
    assert result["changed"] == 1 and "expired on" in text, text
    rc, out, _ = fresh.ssh("gpu-01", update)
    assert rc == 0 and "EXPKEYSIG" not in out, out
    again, text = run_api(api.bootstrap, fresh.inventory_path, sets=[GATES], yes=True)
    assert again["changed"] == 0, text


def test_the_run_page_of_the_bootstrap_shows_every_host_in_chromium(fresh: Lab) -> None:
    """`invoke report` of the first bootstrap, rendered and screenshotted by headless
    Chromium: the four hosts' timelines are drawn, and the cluster table lists them Ready."""
    run = FIRST_RUN.get("bootstrap")
    assert run is not None, "test_bootstrap_as_sudo_user_with_password did not run first"
    page = htmlreport.write(run)
    rendered = render(page)
    ids = [f"host-{h}" for h in NODES]
    assert timeline_problems(rendered, ids) == {}, f"{run}: hosts not drawn"
    assert all(rendered.hosts[i].bars >= 2 for i in ids)
    assert rendered.scripts == 1 and rendered.handlers == 0  # only the measuring script
    for node in NODES:
        assert f"<td>{node}</td><td>Ready</td>" in rendered.dom


def _drift(lab: Lab) -> None:
    """A small change for a run to put back: cpu-01's sysctl file removed."""
    rc, _, err = lab.ssh("cpu-01", "rm -f /etc/sysctl.d/99-kubernetes.conf")
    assert rc == 0, err


def test_on_a_terminal_the_run_shows_the_live_panel(fresh: Lab, tmp_path: Path) -> None:
    """bootstrap under a pseudo-terminal: the live panel (phase bar, hosts done of total, a
    spinner on the host at work), drawn with cursor movements; the final table after it."""
    _drift(fresh)
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [PYTHON, "-m", "gpuk8s.cli", "bootstrap", "-i", str(fresh.inventory_path), "--yes",
         "--set", GATES], cwd=ROOT, stdin=slave, stdout=slave, stderr=slave, close_fds=True,
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "140",
             "GPUK8S_RUNS_DIR": str(tmp_path)})
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=300) == 0
    screen = b"".join(chunks).decode(errors="replace")
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen)
    assert "\x1b[?25l" in screen and "\x1b[1A" in screen  # a live region, redrawn in place
    assert re.search(r"node .*━.* [01]/1 hosts", plain), plain[-3000:]
    assert re.search(r"[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏] cpu-01 running base \| sysctls", plain), plain[-3000:]
    assert "✓ cpu-01 done" in plain and "node: 1/1 host(s) done in" in plain
    assert "result" in plain and "Traceback" not in plain
    # the node's own times: the final table's time column is not 0.0s for any host
    # (box-drawn where it fits the terminal, plain aligned text where it does not)
    times = re.findall(r"^[│ ]*(\S+)[│ ]+\d+[│ ]+\d+[│ ]+\d+[│ ]+([\d.]+)s[│ ]*$",
                       plain.split("result")[-1].replace("\r", ""), re.M)
    assert times and "cpu-01" in dict(times), plain[-2000:]
    assert all(t != "0.0" for _host, t in times), plain[-2000:]


def test_piped_the_run_prints_plain_lines(fresh: Lab, tmp_path: Path) -> None:
    """The same run with stdout a pipe (CI logs): no escape sequences, one line per op as it
    starts; with --quiet, only the final table."""
    _drift(fresh)
    argv = [PYTHON, "-m", "gpuk8s.cli", "bootstrap", "-i", str(fresh.inventory_path),
            "--yes", "--set", GATES]
    env = {**os.environ, "GPUK8S_RUNS_DIR": str(tmp_path)}
    piped = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env,
                           timeout=300)
    assert piped.returncode == 0, piped.stderr
    assert "\x1b" not in piped.stdout + piped.stderr
    assert "  [cpu-01] -> base | sysctls persisted" in piped.stdout
    assert "node: 1/1 host(s) done in" in piped.stdout
    _drift(fresh)
    quiet = subprocess.run([*argv, "--quiet"], cwd=ROOT, capture_output=True, text=True,
                           env=env, timeout=300)
    assert quiet.returncode == 0, quiet.stderr
    assert "[cpu-01] ->" not in quiet.stdout and "== node" not in quiet.stdout
    # the result table as plain aligned text in a pipe (no box drawing): host, changed, ...
    assert re.search(r"^HOST +CHANGED +OK +FAILED +TIME$", quiet.stdout, re.M), quiet.stdout
    assert re.search(r"^cpu-01 +[12] +\d+ +0 +[\d.]+s$", quiet.stdout, re.M), quiet.stdout
    assert "│" not in quiet.stdout


def wait_cluster_ready(lab: Lab, timeout: int = 180) -> None:
    """After a boot: the API server answers, then every node is Ready again."""
    rc, out, err = lab.ssh("cp-01", (
        f"end=$(( $(date +%s) + {timeout} )); k='kubectl --kubeconfig "
        "/etc/kubernetes/admin.conf'; until $k get --raw /readyz >/dev/null 2>&1; do "
        "[ $(date +%s) -lt $end ] || exit 1; sleep 1; done; "
        f"$k wait --for=condition=Ready {' '.join('node/' + n for n in NODES)} "
        f"--timeout={timeout}s && "
        "for n in gpu-01:2 gpu-02:1; do $k wait --for=jsonpath='{.status.allocatable."
        "nvidia\\.com/gpu}'=${n#*:} node/${n%:*} "
        f"--timeout={timeout}s || exit 1; done"), timeout=timeout * 2)
    assert rc == 0, f"cluster not Ready after boot: {out} {err}"


def test_snapshot_bootstrapped(fresh: Lab) -> None:
    dest = snapshot_bootstrapped(fresh)
    assert (dest / "topology.yaml").exists() and bootstrapped_is_current(fresh)
    assert os.path.exists(dest / "nodes" / "cp-01")
    # the snapshot boots back into a Ready cluster with its GPUs
    wait_cluster_ready(fresh)
    nodes = json.loads(kubectl_cp(fresh, "get nodes -o json"))["items"]
    assert len(nodes) == len(NODES)
