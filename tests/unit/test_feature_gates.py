"""feature_gates after kubeadm init: the facts read the gates kubeadm wrote, the control plane
converges its static pods, every kubelet follows one node at a time, and a failure puts the
previous files back."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.errors import CommandFailed, FactError, InventoryError
from gpuk8s.executor import HostResult, RoleWork
from gpuk8s.facts import HostFacts
from gpuk8s.facts.kube import FeatureGates, GateState
from gpuk8s.facts.system import FileState, Packages, PackageState
from gpuk8s.ops import change, sha256
from gpuk8s.ops.kube import feature_gate_arg, feature_gates, gate_change
from gpuk8s.playbook import PHASES, Phase
from gpuk8s.roles import HostContext, load_role
from tests.unit.scenarios import default_vars, fresh_facts

OLD = {"InPlacePodVerticalScaling": True}
NEW = {"InPlacePodVerticalScaling": False, "UserNamespacesSupport": True}
CLUSTER: dict[str, Any] = {
    "endpoint": "10.0.0.10:6443", "advertise_address": "10.0.0.10", "node_name": "cp-01",
    "nodes": {"cp": {"name": "cp-01", "address": "10.0.0.10", "gpus": 0, "model": ""}}}


# ------------------------------------------------------------------ one format
def test_gates_have_one_form_and_one_flag() -> None:
    assert feature_gates({"B": 1, "A": False}) == {"A": False, "B": True}
    assert list(feature_gates({"B": True, "A": True})) == ["A", "B"]
    assert feature_gate_arg({"B": True, "A": False}) == "A=false,B=true"
    assert feature_gate_arg({}) == ""
    assert gate_change({"A": True, "C": True}, {"A": False, "B": True}) == \
        "A=true -> false, +B=true, -C"


# ------------------------------------------------------------------ the fact
def test_fact_reads_manifest_flags_and_the_kubelet_config() -> None:
    out = ("## kube-apiserver\n--feature-gates=B=false,A=true\n## kube-scheduler\n\n"
           "## kubelet\nfeatureGates:\n  A: true\n  B: false\n")
    state = FeatureGates().parse(out, 0)
    assert state.components == {"kube-apiserver": {"A": True, "B": False}, "kube-scheduler": {}}
    assert state.kubelet == {"A": True, "B": False}
    assert FeatureGates().parse("## kubelet\n", 0) == GateState({}, {})
    assert FeatureGates().parse("", 0) == GateState({}, None)


@pytest.mark.parametrize("out, said", [
    ("## kube-apiserver\n--feature-gates=A=maybe\n", "unreadable --feature-gates entry"),
    ("## kubelet\nfeatureGates:\n  A: [1]\n", "not a map of names to true/false"),
    ("## kubelet\nfeatureGates: {\n", "featureGates is not YAML"),
])
def test_fact_refuses_what_it_cannot_read(out: str, said: str) -> None:
    with pytest.raises(FactError, match=said):
        FeatureGates().parse(out, 0)


def test_fact_command_reads_real_files(tmp_path: Path) -> None:
    """The probe's shell on files laid out as kubeadm writes them."""
    manifests, kubelet = tmp_path / "manifests", tmp_path / "config.yaml"
    manifests.mkdir()
    (manifests / "kube-apiserver.yaml").write_text(
        "spec:\n  containers:\n  - command:\n    - kube-apiserver\n"
        "    - --feature-gates=A=true,B=false\n    - --secure-port=6443\n")
    (manifests / "kube-scheduler.yaml").write_text("spec: {}\n")
    kubelet.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nfeatureGates:\n  A: true\n"
                       "  B: false\nkind: KubeletConfiguration\nstaticPodPath: /x\n")
    cmd = FeatureGates().command().replace("/etc/kubernetes/manifests", str(manifests)) \
        .replace("/var/lib/kubelet/config.yaml", str(kubelet))
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, check=True).stdout
    assert FeatureGates().parse(out, 0) == GateState(
        {"kube-apiserver": {"A": True, "B": False}, "kube-scheduler": {}},
        {"A": True, "B": False})


# ------------------------------------------------------------------ the control plane
def cp_context(gates_now: dict[str, bool], config_gates: dict[str, bool],
               want: dict[str, bool], inventory: dict[str, Any] | None = None,
               **config_vars: Any) -> HostContext:
    """An initialised first control plane whose static pods run ``gates_now`` and whose kubeadm
    config file was rendered with ``config_gates`` (and ``config_vars``); the inventory asks
    for ``want`` (and ``inventory``'s other values)."""
    from roles.control_plane import role as cp

    vars = default_vars(feature_gates=want, **(inventory or {}))
    base = fresh_facts("ubuntu2404", 0, "cp", vars)
    values = dict(base.items())
    values[FeatureGates()] = GateState({c: dict(gates_now) for c in (
        "kube-apiserver", "kube-controller-manager", "kube-scheduler")}, dict(gates_now))

    values[Packages("kubeadm")] = {"kubeadm": PackageState("1.36.2-1.1", True, "ii")}
    ctx0 = HostContext("cp", "control_plane", {**vars, "feature_gates": config_gates,
                                               **config_vars},
                       HostFacts("cp", values), CLUSTER, ("control_plane",))
    written = cp.kubeadm_config(ctx0)
    files = cp._kubeconfig_files(vars)
    states = {}
    for arg in files.args:
        path = arg.lstrip("+")
        content = written if path == cp.CONFIG else b"admin"
        states[path] = FileState(path, True, "600", "root", sha256(content), content)
    values[files] = states
    return HostContext("cp", "control_plane", vars, HostFacts("cp", values), CLUSTER,
                       ("control_plane",))


def ops_by_id(ctx: HostContext) -> dict[str, Any]:
    return {op.id: op for op in load_role(ctx.role).plan(ctx)}


def test_changed_gates_converge_the_static_pods() -> None:
    ops = ops_by_id(cp_context(OLD, OLD, NEW))
    assert ops["control_plane | kubeadm config"].changes
    assert '"UserNamespacesSupport": true' in (ops["control_plane | kubeadm config"].diff or "")
    gates = ops["control_plane | feature gates"]
    assert gates.changes
    assert gates.reason == ("+ feature gates kube-apiserver: InPlacePodVerticalScaling=true -> "
                            "false, +UserNamespacesSupport=true; kube-controller-manager: "
                            "InPlacePodVerticalScaling=true -> false, +UserNamespacesSupport="
                            "true; kube-scheduler: InPlacePodVerticalScaling=true -> false, "
                            "+UserNamespacesSupport=true (static pods rewritten by kubeadm, "
                            "restarted by the kubelet)")
    script = gates.commands[0]
    assert script.index("init phase control-plane all") < script.index("init phase upload-config")
    assert "'\"--feature-gates=InPlacePodVerticalScaling=false,UserNamespacesSupport=true\"'" \
        in script


def test_same_gates_are_a_noop() -> None:
    ops = ops_by_id(cp_context(NEW, NEW, NEW))
    assert not ops["control_plane | kubeadm config"].changes
    assert not ops["control_plane | feature gates"].changes


def test_an_interrupted_change_is_taken_up_again() -> None:
    """The config file already has the new gates, the static pods still the old ones."""
    ops = ops_by_id(cp_context(OLD, NEW, NEW))
    assert not ops["control_plane | kubeadm config"].changes
    assert ops["control_plane | feature gates"].changes


def test_other_config_changes_still_only_warn_and_gates_wait() -> None:
    ops = ops_by_id(cp_context(OLD, OLD, NEW, pod_cidr="10.32.0.0/16"))
    assert ops["control_plane | kubeadm config"].warning
    assert "beyond feature_gates" in ops["control_plane | kubeadm config"].reason
    assert not ops["control_plane | feature gates"].changes


def fake_tools(tmp_path: Path, tools: dict[str, str]) -> dict[str, str]:
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    for tool, body in tools.items():
        (bin_ / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bin_ / tool).chmod(0o755)
    return {"PATH": f"{bin_}:/usr/bin:/bin"}


def cp_script(tmp_path: Path, want: dict[str, bool] = NEW) -> tuple[str, Path, Path]:
    from roles.control_plane import role as cp

    op = ops_by_id(cp_context(OLD, OLD, want))["control_plane | feature gates"]
    manifests, gpuk8s_dir = tmp_path / "manifests", tmp_path / "gpuk8s"
    manifests.mkdir()
    gpuk8s_dir.mkdir()
    for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        (manifests / f"{c}.yaml").write_text(f"{c} old\n")
    script = op.commands[0].replace("/etc/kubernetes/manifests", str(manifests)) \
        .replace("/etc/kubernetes/gpuk8s", str(gpuk8s_dir)) \
        .replace(f"+ {cp.APISERVER_WAIT} ))", "+ 2 ))")
    return script, manifests, gpuk8s_dir


def test_control_plane_script_waits_for_the_new_flag_then_stores_the_config(
        tmp_path: Path) -> None:
    script, manifests, _ = cp_script(tmp_path)
    calls = tmp_path / "calls"
    flag = '"--feature-gates=InPlacePodVerticalScaling=false,UserNamespacesSupport=true"'
    env = fake_tools(tmp_path, {
        "kubeadm": f'echo "kubeadm $*" >> {calls}; [ "$3" = control-plane ] && '
                   f'for f in {manifests}/*.yaml; do echo new > "$f"; done; true',
        "kubectl": f"case \"$*\" in *readyz*) exit 0;; esac; echo '{{\"command\": [{flag}]}}'"})
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    made = calls.read_text().splitlines()
    assert [line.split()[1:4] for line in made] == [["init", "phase", "control-plane"],
                                                    ["init", "phase", "upload-config"]]
    assert (manifests / "kube-apiserver.yaml").read_text() == "new\n"


def test_control_plane_script_puts_the_old_manifests_back(tmp_path: Path) -> None:
    script, manifests, _ = cp_script(tmp_path)
    calls = tmp_path / "calls"
    env = fake_tools(tmp_path, {
        "kubeadm": f'echo "kubeadm $*" >> {calls}; [ "$3" = control-plane ] && '
                   f'for f in {manifests}/*.yaml; do echo new > "$f"; done; true',
        "kubectl": "echo 'The connection to the server was refused' >&2; exit 1",
        "sleep": "exit 0"})
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env)
    assert proc.returncode == 1
    assert "did not come back with --feature-gates=InPlacePodVerticalScaling=false," \
        "UserNamespacesSupport=true" in proc.stderr
    assert (manifests / "kube-apiserver.yaml").read_text() == "kube-apiserver old\n"
    assert "upload-config" not in calls.read_text()  # the cluster's stored config is untouched


# ------------------------------------------------------------------ the kubelets
def kubelet_ops(running: dict[str, bool] | None, want: dict[str, bool]) -> Any:
    vars = default_vars(feature_gates=want, kubelet_restart_timeout=2)
    values = dict(fresh_facts("ubuntu2404", 0, "n", vars).items())
    values[FeatureGates()] = GateState({}, running)
    ctx = HostContext("n", "kubelet", vars, HostFacts("n", values), CLUSTER, ("workers",))
    [op] = load_role("kubelet").plan(ctx)
    return op


def test_kubelet_plan() -> None:
    assert not kubelet_ops(None, NEW).changes  # not joined: join writes the cluster's config
    assert not kubelet_ops(dict(NEW), NEW).changes
    op = kubelet_ops(OLD, NEW)
    assert op.reason == ("+ kubelet feature gates InPlacePodVerticalScaling=true -> false, "
                         "+UserNamespacesSupport=true; restart the kubelet")


@pytest.mark.parametrize("configmap_gates, healthy, rc, said, restored", [
    ("  InPlacePodVerticalScaling: false\n  UserNamespacesSupport: true\n", True, 0, "", False),
    ("  InPlacePodVerticalScaling: true\n", True, 1,
     "kube-system/kubelet-config (kubeadm's kubelet config for the cluster) does not hold", True),
    ("  InPlacePodVerticalScaling: false\n  UserNamespacesSupport: true\n", False, 1,
     "the kubelet did not answer http://127.0.0.1:10248/healthz within 2s", True),
])
def test_kubelet_script(tmp_path: Path, configmap_gates: str, healthy: bool, rc: int, said: str,
                        restored: bool) -> None:
    config = tmp_path / "config.yaml"
    old = "featureGates:\n  InPlacePodVerticalScaling: true\nkind: KubeletConfiguration\n"
    config.write_text(old)
    calls = tmp_path / "calls"
    env = fake_tools(tmp_path, {
        "kubeadm": f"printf 'featureGates:\\n{configmap_gates}kind: KubeletConfiguration\\n' "
                   f"> {config}",
        "systemctl": f'echo "systemctl $*" >> {calls}',
        "curl": "exit 0" if healthy else "exit 7"})
    script = kubelet_ops(OLD, NEW).commands[0].replace("/var/lib/kubelet/config.yaml",
                                                        str(config))
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env,
                          timeout=30)
    assert proc.returncode == rc, proc.stderr
    assert said in proc.stderr
    assert (config.read_text() == old) is restored
    assert [p.name for p in tmp_path.iterdir() if "before-gates" in p.name] == []


# ------------------------------------------------------------------ one node at a time
def test_the_kubelet_phase_is_serial_and_after_join() -> None:
    names = [p.name for p in PHASES]
    kubelets = next(p for p in PHASES if p.name == "kubelets")
    assert names.index("join") < names.index("kubelets") < names.index("cluster")
    assert kubelets.serial == 1 and kubelets.hosts == "all"


def test_serial_phase_applies_in_batches_and_stops_after_a_failure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuk8s import runner

    batches: list[list[str]] = []

    def run_phase(work: Any, runners: Any) -> dict[str, HostResult]:
        batches.append(sorted(work))
        return {h: HostResult(h, error=CommandFailed(h, "x", "x", 1, "boom") if h == "b"
                              else None) for h in work}

    class Rep:
        def __init__(self) -> None:
            self.lines: list[str] = []

        def start(self, hosts: Any) -> None: ...
        def stop(self) -> None: ...

        def print(self, text: str, style: str = "") -> None:
            self.lines.append(text)

    class Sess:
        reporter = Rep()

        def runner(self, host: str) -> None:
            return None

    monkeypatch.setattr(runner, "run_phase", run_phase)
    work = {h: [RoleWork("kubelet", (change("kubelet | x", "+ x", "true"),))]
            for h in ("a", "b", "c")}
    work["q"] = [RoleWork("kubelet", ())]
    session: Any = Sess()
    results = runner.apply_phase(session, Phase("k", "all", ("kubelet",), "t", serial=1), work)
    assert batches == [["q"], ["a"], ["b"]]  # the unchanged host first, c never started
    assert sorted(results) == ["a", "b", "q"]
    assert session.reporter.lines == ["k: stopped after a failed batch; not started on c"]
    batches.clear()
    runner.apply_phase(session, Phase("k", "all", ("kubelet",), "t"), work)
    assert batches == [["a", "b", "c", "q"]]


@pytest.mark.parametrize("want", [NEW, {}], ids=["gates", "no-gates"])
def test_both_scripts_are_valid_sh(tmp_path: Path, want: dict[str, bool]) -> None:
    script, _, _ = cp_script(tmp_path, want)
    assert subprocess.run(["sh", "-n", "-c", script]).returncode == 0
    kubelet = kubelet_ops(OLD, want).commands[0]
    assert subprocess.run(["sh", "-n", "-c", kubelet]).returncode == 0


@pytest.mark.parametrize("pod, rc", [
    ('{"command": ["kube-apiserver", "--secure-port=6443"]}', 0),
    ('{"command": ["kube-apiserver", "--feature-gates=InPlacePodVerticalScaling=true"]}', 1),
    ("", 1),   # no mirror pod (yet): never taken for a flag-less one
])
def test_removing_every_gate_waits_for_a_flagless_api_server(tmp_path: Path, pod: str,
                                                             rc: int) -> None:
    script, _, _ = cp_script(tmp_path, {})
    env = fake_tools(tmp_path, {
        "kubeadm": "true", "sleep": "exit 0",
        "kubectl": f"case \"$*\" in *readyz*) exit 0;; esac; [ -n '{pod}' ] || exit 1; "
                   f"echo '{pod}'"})
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env)
    assert proc.returncode == rc, proc.stderr


# ------------------------------------------------------------------ the certificates' validity
def test_a_new_certificate_validity_rewrites_and_uploads_the_config_only() -> None:
    """certificate_validity_period changed on a running cluster: gpuk8s's kubeadm config is
    written again and uploaded to kube-system/kubeadm-config (what `kubeadm certs renew`
    reads), nothing else moves; the gates stay as they are."""
    from roles.control_plane import role as cp

    ctx = cp_context(NEW, NEW, NEW, inventory={"certificate_validity_period": "240h"},
                     certificate_validity_period="")
    ops = ops_by_id(ctx)
    config = ops["control_plane | kubeadm config"]
    assert config.changes and not config.warning
    assert '+certificateValidityPeriod: "240h"' in (config.diff or "")
    assert config.notify == ("upload kubeadm config",)
    upload = cp.upload_config(ctx)
    assert upload.commands == (f"kubeadm init phase upload-config kubeadm --config {cp.CONFIG}",)
    assert not ops["control_plane | feature gates"].changes
    # unset, the field is not written: kubeadm's default (a year)
    assert b"certificateValidityPeriod" not in cp.kubeadm_config(cp_context(NEW, NEW, NEW))


@pytest.mark.parametrize("bad", ["a year", "10d", "240", "-1h"])
def test_a_validity_that_is_not_a_duration_in_hours_is_refused(bad: str) -> None:
    from gpuk8s.inventory import load_inventory

    lab = Path(__file__).resolve().parents[2] / "inventories" / "lab.yaml"
    with pytest.raises(InventoryError, match="certificate_validity_period must be a duration"):
        load_inventory(lab, overrides=[f"certificate_validity_period={bad}"])
    load_inventory(lab, overrides=["certificate_validity_period=17520h"])
