"""Kubernetes upgrades: the target, the inventory and kubeadm's skew rules are checked before
any host changes; the upgrade phases run kubeadm's order through roles/kubernetes_upgrade;
bootstrap's kubernetes role never swaps a joined node's release (nor downgrades it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuk8s import day2
from gpuk8s.day2.kubernetes import _inventory_line, check_inventory, check_skew, parse_target
from gpuk8s.errors import InventoryError
from gpuk8s.facts import HostFacts
from gpuk8s.facts.dpkg import PackageState
from gpuk8s.facts.system import Packages
from gpuk8s.inventory import load_inventory
from gpuk8s.ops.kube import KUBE_PACKAGES
from gpuk8s.playbook import ALL_ROLES, UPGRADE_PHASES
from gpuk8s.roles import HostContext, load_role
from tests.unit.scenarios import default_vars, fresh_facts

LAB = Path(__file__).resolve().parents[2] / "inventories" / "lab.yaml"


@pytest.mark.parametrize(("given", "want"), [("1.36.2", "1.36.2"), ("v1.36.2", "1.36.2"),
                                             (" 1.36.10 ", "1.36.10"), ("1.37", "1.37"),
                                             ("v1.37", "1.37")])
def test_targets(given: str, want: str) -> None:
    assert parse_target(given) == want


@pytest.mark.parametrize("bad", ["latest", "1.36.2-1.1", "2.0.0", "", "1", "1.37.x"])
def test_bad_targets(bad: str) -> None:
    with pytest.raises(InventoryError, match="is not a Kubernetes release"):
        parse_target(bad)


# -- kubeadm's rules ----------------------------------------------------------------------------
def test_one_minor_up_and_patches_are_allowed() -> None:
    check_skew("1.37", "v1.36.2", {"cp-01": "v1.36.2", "gpu-01": "v1.36.2"}, {"cp-01"})
    check_skew("1.36.2", "v1.36.1", {}, set())
    check_skew("1.36", "v1.36.1", {}, set())  # the newest 1.36 patch
    check_skew("1.36.2", "v1.36.2", {}, set())  # nothing to do, said later


def test_a_skipped_minor_is_refused_with_the_step_between() -> None:
    with pytest.raises(InventoryError) as err:
        check_skew("1.37", "v1.35.4", {}, set())
    text = str(err.value)
    assert "one minor release at a time" in text and "v1.35.4" in text
    assert "invoke upgrade --kubernetes 1.36` first" in text


@pytest.mark.parametrize(("target", "server"), [("1.35", "v1.36.1"), ("1.36.1", "v1.36.2"),
                                                ("1.35.9", "v1.36.0")])
def test_a_downgrade_is_refused(target: str, server: str) -> None:
    with pytest.raises(InventoryError, match=f"the cluster runs {server}, newer than {target}"):
        check_skew(target, server, {}, set())


def test_a_kubelet_left_out_three_minors_behind_is_refused() -> None:
    kubelets = {"cp-01": "v1.37.0", "old-01": "v1.34.3", "gpu-01": "v1.34.1"}
    with pytest.raises(InventoryError) as err:
        check_skew("1.38", "v1.37.0", kubelets, {"cp-01", "gpu-01"})
    assert "old-01 (v1.34.3)" in str(err.value) and "gpu-01" not in str(err.value)
    check_skew("1.38", "v1.37.0", kubelets, {"cp-01", "gpu-01", "old-01"})
    check_skew("1.37", "v1.37.0", kubelets, {"cp-01"})  # three behind is still allowed


# -- the inventory ------------------------------------------------------------------------------
def test_a_pin_on_another_release_names_where_it_is_set() -> None:
    inv = load_inventory(LAB, overrides=["kubernetes_package_version=1.36.1-1.1"])
    check_inventory(inv, "1.36.1", list(inv.hosts))
    with pytest.raises(InventoryError) as err:
        check_inventory(inv, "1.36.2", list(inv.hosts))
    text = str(err.value)
    assert "kubernetes_package_version pins 1.36.1-1.1" in text and "(--set)" in text
    assert 'kubernetes_package_version: ""' in text
    with pytest.raises(InventoryError, match=r"pins 1\.36\.1-1\.1"):
        check_inventory(inv, "1.37", list(inv.hosts))
    check_inventory(load_inventory(LAB), "1.37", list(inv.hosts))


def test_the_line_to_change_names_the_file() -> None:
    inv = load_inventory(LAB)
    assert _inventory_line(inv, str(inv.control_planes[0].vars["kubernetes_version"])) == ""
    line = _inventory_line(inv, "1.37")
    assert line.startswith('now write kubernetes_version: "1.37" in ') and "lab.yaml" in line


def test_driver_kubernetes_or_kernel_one_of_them() -> None:
    with pytest.raises(InventoryError, match="--driver VERSION, --kubernetes VERSION or "
                       r"--kernel \[RELEASE\]"):
        day2.upgrade(LAB)
    with pytest.raises(InventoryError, match="one of them"):
        day2.upgrade(LAB, driver="580.159.04", kubernetes="1.36.2")
    with pytest.raises(InventoryError, match="one of them"):
        day2.upgrade(LAB, driver="580.159.04", kernel=True)
    with pytest.raises(InventoryError, match="is not a kernel release"):
        day2.upgrade(LAB, kernel="6.8; reboot")
    with pytest.raises(InventoryError, match="at least one node at a time"):
        day2.upgrade(LAB, kubernetes="1.37", serial=0)


# -- the phases and the role --------------------------------------------------------------------
def test_upgrade_phases_follow_kubeadms_order_drained_and_waited_for() -> None:
    node = ("container_runtime", "kubernetes_upgrade")
    assert [(p.hosts, p.roles) for p in UPGRADE_PHASES] == [
        ("first_control_plane", node), ("other_control_planes", node), ("workers", node),
        ("first_control_plane", ("control_plane",))]
    for phase in UPGRADE_PHASES[:3]:
        assert phase.serial == 1 and phase.wait_ready
        assert phase.drain_timeout_var == "upgrade_drain_timeout"
    assert "kubernetes_upgrade" in ALL_ROLES  # its facts are gathered with the others


def ctx(role: str, host: str, version: str, *, joined: bool = True, first: bool = False,
        **vars: Any) -> HostContext:
    values = default_vars(**vars)
    facts = dict(fresh_facts("ubuntu2404", 0, host, values).items())
    facts[Packages(*KUBE_PACKAGES)] = {p: PackageState(version, True, "hi")
                                       for p in KUBE_PACKAGES}
    cluster = {"joined": {host: joined}, "node_name": host if first else "cp-01",
               "nodes": {host: {"name": host}}}
    return HostContext(host, role, values, HostFacts(host, facts), cluster)


def plan(c: HostContext) -> list[Any]:
    return load_role(c.role).plan(c)


def test_the_first_control_plane_runs_upgrade_apply_between_kubeadm_and_kubelet() -> None:
    ops = plan(ctx("kubernetes_upgrade", "cp-01", "1.36.2-1.1", first=True,
                   kubernetes_version="1.37", kubernetes_upgrade_target="1.37"))
    assert [op.id for op in ops] == [
        "kubernetes | pkgs.k8s.io repo", "kubernetes_upgrade | kubeadm",
        "kubernetes_upgrade | kubeadm upgrade apply", "kubernetes_upgrade | kubelet, kubectl"]
    repo, kubeadm, apply, kubelet = ops
    assert repo.changes and "v1.37" in repo.reason  # pkgs.k8s.io's repo of the new minor
    assert kubeadm.reason == "+ install kubeadm=1.37.*"
    script = "\n".join(apply.commands)
    assert 'kubeadm upgrade apply "$v" --yes $p' in script and "--patches" in script
    assert "dpkg-query -W -f '${Version}' kubeadm" in script
    # a containerd restart just before leaves the node NotReady a while: kubeadm's preflight
    # (ControlPlaneNodesReady) would refuse, so the control planes are waited for first
    assert script.index("wait --for=condition=Ready nodes -l node-role.kubernetes.io/"
                        "control-plane") < script.index("kubeadm upgrade apply")
    assert kubelet.reason == "+ install kubelet=1.37.*, kubectl=1.37.*"
    assert kubelet.notify == ("restart kubelet",)
    assert any("apt-mark hold" in c for c in kubelet.commands)


def test_other_nodes_run_upgrade_node_and_a_patch_target_is_exact() -> None:
    ops = plan(ctx("kubernetes_upgrade", "gpu-01", "1.36.1-1.1", kubernetes_version="1.36",
                   kubernetes_upgrade_target="1.36.2"))
    by_id = {op.id: op for op in ops}
    assert "/v1.36/deb/" in by_id["kubernetes | pkgs.k8s.io repo"].reason  # the same minor
    assert by_id["kubernetes_upgrade | kubeadm"].reason == "+ install kubeadm=1.36.2-*"
    assert "kubeadm upgrade node $p" in "\n".join(
        by_id["kubernetes_upgrade | kubeadm upgrade node"].commands)


def test_a_node_at_the_target_or_not_joined_is_left_alone() -> None:
    at = plan(ctx("kubernetes_upgrade", "gpu-01", "1.37.0-1.1", kubernetes_version="1.37",
                  kubernetes_upgrade_target="1.37"))
    assert [op.changes for op in at] == [0] and "1.37.0-1.1" in at[0].reason
    new = plan(ctx("kubernetes_upgrade", "gpu-01", "1.36.1-1.1", joined=False,
                   kubernetes_version="1.37", kubernetes_upgrade_target="1.37"))
    assert [op.changes for op in new] == [0] and "not in a cluster" in new[0].reason
    assert "no upgrade" in plan(ctx("kubernetes_upgrade", "gpu-01", "1.36.1-1.1"))[0].reason


def test_the_kubelet_restart_waits_for_its_health_check() -> None:
    handler = load_role("kubernetes_upgrade").handlers()["restart kubelet"](
        ctx("kubernetes_upgrade", "gpu-01", "1.36.1-1.1"))
    script = "\n".join(handler.commands)
    assert script.index("systemctl restart kubelet") < script.index("10248/healthz")


def _moves_packages(ops: list[Any]) -> bool:
    return any(op.changes and op.id in ("kubernetes | pkgs.k8s.io repo", "kubernetes | packages")
               for op in ops)


def test_bootstrap_never_downgrades_a_joined_node_and_says_what_to_write() -> None:
    ops = plan(ctx("kubernetes", "gpu-01", "1.37.2-1.1", kubernetes_version="1.36"))
    assert [op.id for op in ops][:1] == ["kubernetes | release"]
    assert ops[0].warning and not _moves_packages(ops)
    assert 'write kubernetes_version: "1.37"' in ops[0].reason


def test_bootstrap_does_not_swap_packages_under_a_joined_kubelet() -> None:
    ops = plan(ctx("kubernetes", "gpu-01", "1.36.1-1.1", kubernetes_version="1.37"))
    assert ops[0].warning and "invoke upgrade --kubernetes 1.37" in ops[0].reason
    assert not _moves_packages(ops)
    pinned = plan(ctx("kubernetes", "gpu-01", "1.36.1-1.1", kubernetes_version="1.36",
                      kubernetes_package_version="1.36.2-1.1"))
    assert "invoke upgrade --kubernetes 1.36.2" in pinned[0].reason


def test_bootstrap_installs_the_inventorys_release_on_a_new_node() -> None:
    ops = plan(ctx("kubernetes", "gpu-01", "1.36.1-1.1", joined=False,
                   kubernetes_version="1.37"))
    assert [op.id for op in ops][:2] == ["kubernetes | pkgs.k8s.io repo",
                                         "kubernetes | packages"]
    assert ops[1].reason == "+ install kubeadm=1.37.*, kubelet=1.37.*, kubectl=1.37.*"


def test_a_node_that_does_not_come_back_ready_stays_cordoned_and_stops_the_phase(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuk8s import runner
    from gpuk8s.errors import Gpuk8sError
    from gpuk8s.executor import HostResult, RoleWork
    from gpuk8s.ops import change

    events: list[str] = []
    monkeypatch.setattr(runner, "run_phase", lambda work, runners: {
        h: HostResult(h) for h in work if not events.append(f"upgrade {h}")})
    monkeypatch.setattr(runner, "_empty", lambda session, phase, hosts: {
        h: (f"node-{h}", False) for h in hosts if not events.append(f"drain {h}")})

    def wait(session: Any, node: str, gpus: int, timeout: int, knob: str) -> None:
        events.append(f"wait {node} {gpus} {timeout} {knob}")
        if node == "node-b":
            raise Gpuk8sError("node-b did not come back Ready")

    monkeypatch.setattr(runner, "wait_ready", wait)
    monkeypatch.setattr(runner, "uncordon", lambda session, node: events.append(f"uncordon "
                                                                                f"{node}"))

    class Sess:
        class reporter:  # what apply_phase calls of a Reporter
            @staticmethod
            def start(hosts: Any) -> None: ...
            @staticmethod
            def stop() -> None: ...
            @staticmethod
            def print(text: str, style: str = "") -> None:
                events.append(text)

        cluster = {"nodes": {h: {"allocatable_gpus": 2} for h in "abc"}}

        def runner(self, host: str) -> None:
            return None

        def host(self, name: str) -> Any:
            return type("H", (), {"vars": {"upgrade_drain_timeout": 42}})()

    work = {h: [RoleWork("kubernetes_upgrade", (change("k | x", "+ x", "true"),))]
            for h in "abc"}
    results = runner.apply_phase(Sess(), UPGRADE_PHASES[2], work)  # type: ignore[arg-type]
    assert events == [
        "drain a", "upgrade a", "wait node-a 2 42 upgrade_drain_timeout", "uncordon node-a",
        "drain b", "upgrade b", "wait node-b 2 42 upgrade_drain_timeout",
        "upgrade-workers: stopped after a failed batch; not started on c"]
    assert str(results["b"].error) == "node-b did not come back Ready" and "c" not in results
