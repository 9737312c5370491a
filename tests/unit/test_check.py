"""gpuk8s check: every problem in one run, the hosts' roles, the variables an inventory sets."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.api import check
from gpuk8s.cli import main
from gpuk8s.errors import InventoryError
from gpuk8s.facts import HostFacts
from gpuk8s.report import Reporter
from roles.preflight import role as preflight

ROOT = Path(__file__).resolve().parents[2]


def run(path: Path | str, **kw: object) -> tuple[dict | None, str]:
    out = io.StringIO()
    try:
        result = check(path, reporter=Reporter(out), **kw)  # type: ignore[arg-type]
    except InventoryError as exc:
        return None, out.getvalue() + f"\nerror: {exc}"
    return result, out.getvalue()


def write(tmp_path: Path, text: str, name: str = "inventory.ini") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


#: three problems, on lines 2, 5 and 6
THREE_PROBLEMS = """\
[control_plane]
cp-01 ansible_host=10.0.0.10 kubernetes_version=1.36.2

[workers]
gpu-01 ansible_host=10.0.0.21 cni=weave
gpu-02 ansible_host=10.0.0.22 ansible_port=notaport
"""


def test_the_lab_inventory_is_accepted_with_roles_and_origins() -> None:
    result, text = run(ROOT / "inventories" / "lab.yaml")
    assert result is not None
    assert result["hosts"] == {"cp-01": "control plane", "gpu-01": "worker",
                               "gpu-02": "worker", "cpu-01": "worker"}
    proxy = next(c for c in result["changed"] if c["name"] == "apt_proxy")
    assert proxy["value"] == "http://10.88.0.1:3142"
    assert proxy["origin"].startswith("inventories/lab.yaml:") and len(proxy["hosts"]) == 4
    assert "no problems: plan and bootstrap will accept this inventory" in text


def test_every_problem_in_one_run_in_file_order(tmp_path: Path) -> None:
    inv = write(tmp_path, THREE_PROBLEMS)
    result, text = run(inv)
    assert result is None
    lines = [ln for ln in text.splitlines() if ln.startswith("  - ")]
    assert len(lines) == 3, text
    assert [ln.split(":")[1] for ln in lines] == ["2", "5", "6"]  # file order, with lines
    assert "3 problem(s) in the inventory (listed above)" in text


def test_an_even_number_of_control_planes_is_refused_with_the_quorum_reason(
        tmp_path: Path) -> None:
    inv = write(tmp_path, """\
        [control_plane]
        cp-01 ansible_host=10.0.0.10
        cp-02 ansible_host=10.0.0.11

        [workers]
        gpu-01 ansible_host=10.0.0.21
        """)
    result, text = run(inv)
    assert result is None
    assert "2 control planes (cp-01, cp-02): every control plane runs an etcd member" in text
    assert "a majority (2 of 2)" in text
    assert "use an odd number of control planes: 1 or 3" in text
    assert "cp-02   root@10.0.0.11:22" in text  # the hosts are still listed


def test_three_control_planes_pass_check_with_the_local_load_balancer(tmp_path: Path) -> None:
    inv = write(tmp_path, """\
        [control_plane]
        cp-01 ansible_host=10.0.0.10
        cp-02 ansible_host=10.0.0.11
        cp-03 ansible_host=10.0.0.12

        [workers]
        gpu-01 ansible_host=10.0.0.21
        """)
    result, text = run(inv)
    assert result is not None, text
    assert [result["hosts"][h] for h in ("cp-01", "cp-02", "cp-03")] == ["control plane"] * 3


def test_an_endpoint_mode_without_what_it_needs_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    external = write(tmp_path / "a", """\
        [control_plane]
        cp-01 ansible_host=10.0.0.10

        [all:vars]
        control_plane_endpoint_mode=external
        """)
    result, text = run(external)
    assert result is None
    assert "control_plane_endpoint_mode is external but control_plane_endpoint is empty" in text
    both = write(tmp_path / "b", """\
        [control_plane]
        cp-01 ansible_host=10.0.0.10

        [all:vars]
        control_plane_endpoint_mode=local_lb
        control_plane_endpoint=lb.lab:6443
        """)
    result, text = run(both)
    assert result is None
    assert "control_plane_endpoint is 'lb.lab:6443' but control_plane_endpoint_mode is " \
        "local_lb" in text


def test_a_host_in_no_cluster_group_is_shown_as_such(tmp_path: Path) -> None:
    inv = write(tmp_path, """\
        [control_plane]
        cp-01 ansible_host=10.0.0.10

        [workers]
        gpu-01 ansible_host=10.0.0.21

        [login]
        login01 ansible_host=10.0.0.30
        """)
    result, text = run(inv)
    assert result is not None
    assert result["hosts"]["login01"] == \
        "skipped: in neither control_plane nor workers (never contacted)"
    assert "notes:" in text and "login01" in text.split("notes:")[1]


def test_credentials_in_values_are_masked(tmp_path: Path) -> None:
    inv = write(tmp_path, """\
        [control_plane]
        cp-01 ansible_host=10.0.0.10

        [all:vars]
        apt_proxy=http://alice:s3cret@proxy.lab:3128
        """)
    result, text = run(inv)
    assert result is not None
    assert "s3cret" not in text and "http://***@proxy.lab:3128" in text


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "-i", str(ROOT / "inventories" / "lab.yaml")]) == 0
    bad = write(tmp_path, "[control_plane]\ncp-01 ansible_host=10.0.0.10 cni=weave\n")
    assert main(["check", "-i", str(bad)]) == 1
    assert "1 problem(s) in the inventory" in capsys.readouterr().err


def test_other_playbooks_variables_are_one_warning_per_file(tmp_path: Path) -> None:
    """kubespray's builder writes ip/access_ip on every host; DeepOps carries Slurm settings:
    ignored, said once per file, unless strict_variables is on."""
    inv = write(tmp_path, """\
        [kube_control_plane]
        node1 ansible_host=10.0.0.10 ip=10.0.0.10 access_ip=10.0.0.10

        [kube_node]
        node2 ansible_host=10.0.0.11 ip=10.0.0.11

        [all:vars]
        ntp_servers=pool.ntp.org
        slurm_password=hunter2
        """)
    result, text = run(inv)
    assert result is not None, text
    warning = (f"{inv}: 4 variables gpuk8s does not use (ignored): access_ip, ip, "
               "ntp_servers, slurm_password")
    assert warning in text
    from gpuk8s.inventory import load_inventory

    assert load_inventory(inv).warnings == (warning,)
    result, text = run(inv, sets=["strict_variables=true"])
    assert result is None
    assert "4 problem(s)" in text and "unknown variable 'slurm_password' (strict_variables" in text


def test_near_misses_stay_errors_and_no_hint_changes_meaning() -> None:
    from gpuk8s.inventory.names import near_miss, unknown_variable
    from gpuk8s.variables import load_variable_specs

    specs = list(load_variable_specs())
    for typo, meant in [("kuberentes_version", "kubernetes_version"),
                        ("contianer_runtime", "container_runtime"), ("pod_cdir", "pod_cidr"),
                        ("nvidia_driver_brach", "nvidia_driver_branch"),
                        ("feature_gate", "feature_gates")]:
        assert near_miss(typo, specs) == meant
    # names of other meanings that a loose match used to propose (from public inventories)
    for other in ["container_manager", "containerd_snapshotter", "k3s_version", "slurm_password",
                  "kube_users", "nfs_exports", "maas_dns_domain", "nvidia_version",
                  "nvidia_driver_force_install", "enroot_runtime_path", "registry_port",
                  "gpu_enabled", "kube_cert_group", "kubeadm_control_plane", "kubernetes_audit",
                  "podsecuritypolicy_enabled", "docker_rpm_keepcache", "kata_containers_enabled",
                  "halon_system_timeout", "calico_cni_name", "kube_vip_enabled",
                  "trident_version", "cluster_name", "docker_registry_mirrors"]:
        problem = unknown_variable(other, specs)
        assert problem is None or "did you mean" not in problem.message, (other, problem)
    assert near_miss("ansible_ruby_interpreter", ["ansible_python_interpreter"]) is None


def test_kubespray_settings_are_read_as_gpuk8s_variables(tmp_path: Path) -> None:
    """kubespray's k8s_cluster group_vars shape: its settings with a gpuk8s meaning are
    translated and announced; what gpuk8s cannot do is refused naming the setting."""
    inv = write(tmp_path, """\
        [kube_control_plane]
        node1 ansible_host=10.0.0.10 ip=10.0.0.10

        [kube_node]
        node2 ansible_host=10.0.0.11 ip=10.0.0.11
        """)  # like kubespray's current sample: k8s_cluster exists only in its group_vars
    gv = tmp_path / "group_vars" / "k8s_cluster"
    gv.mkdir(parents=True)
    (gv / "k8s-cluster.yml").write_text(
        "kube_version: v1.36.2\nkube_network_plugin: calico\n"
        "kube_pods_subnet: 10.233.64.0/18\nkube_service_addresses: 10.233.0.0/18\n"
        "container_manager: containerd\ndns_domain: '{{ cluster_name }}'\n"
        "kube_feature_gates: ['InPlacePodVerticalScaling=true']\nkube_proxy_mode: ipvs\n")
    result, text = run(inv)
    assert result is not None, text
    changed = {c["name"]: (c["value"], c["origin"]) for c in result["changed"]}
    assert changed["cni"][0] == "calico"
    assert changed["pod_cidr"][0] == "10.233.64.0/18"
    assert changed["service_cidr"][0] == "10.233.0.0/18"
    assert changed["feature_gates"][0] == '{"InPlacePodVerticalScaling": true}'
    assert "group_vars/k8s_cluster/k8s-cluster.yml:2" in changed["cni"][1], changed
    assert "kube_network_plugin (kubespray's name) is read as cni: calico" in text
    assert "dns_domain is a Jinja expression" in text
    assert "group_vars/k8s_cluster applies to control_plane and workers" in text
    assert "kube_proxy_mode" in text.split("warnings:")[1]  # no gpuk8s meaning: ignored
    # kubespray and gpuk8s names in one file must agree
    (gv / "k8s-cluster.yml").write_text("kube_network_plugin: calico\ncni: flannel\n")
    result, text = run(inv)
    assert result is None and "cni and kube_network_plugin (line 1) disagree" in text
    (gv / "k8s-cluster.yml").write_text("container_manager: crio\n")
    result, text = run(inv)
    assert result is None
    assert "container_manager: crio is not something gpuk8s installs (containerd or docker)" \
        in text


def test_cns_shaped_inventory_with_ansibles_other_key_names(tmp_path: Path) -> None:
    """NVIDIA Cloud Native Stack's shape: [master]/[node] groups, ansible_ssh_user and
    ansible_sudo_pass on the host lines: read as the keys they alias, each said in a note."""
    inv = write(tmp_path, """\
        [master]
        cns-cp ansible_ssh_host=10.0.0.10 ansible_ssh_user=nvidia ansible_sudo_pass=s3cret

        [node]
        cns-gpu ansible_ssh_host=10.0.0.11 ansible_ssh_user=nvidia ansible_ssh_port=2222

        [all:vars]
        ansible_become_method=sudo
        ansible_become_user=root
        """)
    result, text = run(inv)
    assert result is not None, text
    assert result["hosts"] == {"cns-cp": "control plane", "cns-gpu": "worker"}
    assert "nvidia@10.0.0.11:2222" in text and "s3cret" not in text
    assert "ansible_ssh_user is read as ansible_user" in text
    assert "group 'master' is read as 'control_plane'" in text
    from gpuk8s.inventory import load_inventory

    host = load_inventory(inv).hosts["cns-cp"]
    assert host.user == "nvidia" and host.become_password is not None


def test_k3s_ansible_groups_are_read(tmp_path: Path) -> None:
    inv = write(tmp_path, """\
        k3s_cluster:
          children:
            server:
              hosts:
                10.0.0.10:
            agent:
              hosts:
                10.0.0.11:
        """, name="inventory.yml")
    result, text = run(inv)
    assert result is not None, text
    assert result["hosts"] == {"10.0.0.10": "control plane", "10.0.0.11": "worker"}


def test_plan_refuses_with_every_problem_and_contacts_no_host(tmp_path: Path) -> None:
    from gpuk8s import api
    from gpuk8s.errors import InventoryProblems

    inv = write(tmp_path, THREE_PROBLEMS)

    def no_host(*a: object) -> None:
        pytest.fail("a host was contacted")

    with pytest.raises(InventoryProblems) as err:
        api.plan(inv, reporter=Reporter(io.StringIO()), opener=no_host)
    text = str(err.value)
    assert text.startswith("3 problems in the inventory, in file order")
    assert [ln.split(":")[1] for ln in text.splitlines() if ln.startswith("- ")] == \
        ["2", "5", "6"]
    assert err.value.line == 2 and err.value.fix  # the first one's, for callers that want one


def test_hosts_outside_the_cluster_are_never_contacted(tmp_path: Path) -> None:
    """A DeepOps-shaped inventory: a Slurm login node in neither control_plane nor workers."""
    from gpuk8s import api
    from gpuk8s.errors import ConnectError, Gpuk8sError
    from gpuk8s.transport import ConnectSpec

    inv = write(tmp_path, """\
        [kube-master]
        mgmt01 ansible_host=10.0.0.10

        [kube-node]
        gpu01 ansible_host=10.0.0.21

        [slurm-master]
        login01 ansible_host=10.0.0.30

        [slurm-cluster:children]
        slurm-master

        [slurm-cluster:vars]
        slurm_password=hunter2
        """)
    asked: list[str] = []

    def opener(spec: ConnectSpec, redact: object) -> None:
        asked.append(spec.name)
        raise ConnectError(f"{spec.name}: test opener, nothing is contacted")

    out = io.StringIO()
    with pytest.raises(Gpuk8sError):
        api.plan(inv, reporter=Reporter(out), opener=opener)
    assert sorted(asked) == ["gpu01", "mgmt01"]
    assert "skipping login01: in neither control_plane nor workers" in out.getvalue()
    assert "hunter2" not in out.getvalue()


def test_vault_values_and_inventory_scripts_are_named_as_such(tmp_path: Path) -> None:
    inv = write(tmp_path, """\
        all:
          children:
            control_plane:
              hosts:
                cp-01: {ansible_host: 10.0.0.10}
        """, name="hosts.yaml")
    gv = tmp_path / "group_vars"
    gv.mkdir()
    (gv / "all.yml").write_text("ansible_become_password: !vault |\n"
                                "  $ANSIBLE_VAULT;1.1;AES256\n  62313365396662343061\n")
    result, text = run(inv)
    assert result is None
    assert "all.yml:1: Ansible Vault values are not supported: ansible_become_password is " \
        "vault-encrypted" in text
    assert "YAML syntax error" not in text and "62313365" not in text
    script = tmp_path / "inventory.py"
    script.write_text("#!/usr/bin/env python3\nprint('{}')\n")
    script.chmod(0o755)
    result, text = run(script)
    assert result is None
    assert "executable (dynamic) inventory script; gpuk8s reads static YAML or INI " \
        "inventories and never runs it" in text
    assert f"ansible-inventory -i {script} --list -y > inventory.yaml" in text


def test_an_inventory_folder_loads_with_its_group_vars(tmp_path: Path) -> None:
    """kubespray's layout: -i inventory/mycluster/ with hosts.yaml and group_vars/ inside."""
    folder = tmp_path / "mycluster"
    folder.mkdir()
    write(folder, """\
        all:
          children:
            kube_control_plane:
              hosts:
                node1: {ansible_host: 10.0.0.10, ip: 10.0.0.10}
            kube_node:
              hosts:
                node2: {ansible_host: 10.0.0.11, ip: 10.0.0.11}
        """, name="hosts.yaml")
    (folder / "group_vars" / "k8s_cluster").mkdir(parents=True)
    (folder / "group_vars" / "k8s_cluster" / "k8s-cluster.yml").write_text(
        "kube_network_plugin: calico\n")
    result, text = run(folder)
    assert result is not None, text
    assert [c["value"] for c in result["changed"] if c["name"] == "cni"] == ["calico"]
    result, text = run(tmp_path)  # a folder without an inventory file in it
    assert result is None and "the inventory folder holds none of hosts.yaml" in text


def test_kubespray_bastion_is_the_jump_host_of_the_others(tmp_path: Path) -> None:
    """kubespray's documented bastion: a host and a group both named bastion. Every other
    host is reached through it (unless it has a jump of its own); it is no cluster member."""
    inv = write(tmp_path, """\
        node1 ansible_host=10.0.0.10 ip=10.3.0.1
        node2 ansible_host=10.0.0.11 ansible_ssh_common_args='-J admin@10.9.9.9'

        [kube_control_plane]
        node1

        [kube_node]
        node2

        [bastion]
        bastion ansible_host=198.51.100.1 ansible_user=jump ansible_port=2200
        """)
    result, text = run(inv)
    assert result is not None, text
    assert result["hosts"]["bastion"].startswith("skipped: the bastion")
    assert "node1    root@10.0.0.10:22            control plane (through " \
        "jump@198.51.100.1:2200)" in text
    from gpuk8s.inventory import load_inventory

    hosts = load_inventory(inv).hosts
    assert hosts["node1"].proxy_jump == "jump@198.51.100.1:2200"
    assert hosts["node2"].proxy_jump == "admin@10.9.9.9"  # its own jump stays
    assert hosts["bastion"].proxy_jump is None
    assert not hosts["bastion"].is_control_plane and not hosts["bastion"].is_worker


@pytest.mark.parametrize(("bastion", "problem"), [
    ("b1 ansible_host=10.0.0.1\nb2 ansible_host=10.0.0.2",
     "group bastion has 2 hosts (b1, b2); it is the one jump host of the others"),
    ("node1", "host 'node1' is the bastion and a cluster member"),
])
def test_a_bastion_group_gpuk8s_cannot_follow_is_refused(tmp_path: Path, bastion: str,
                                                         problem: str) -> None:
    inv = write(tmp_path, f"[kube_control_plane]\nnode1 ansible_host=10.0.0.10\n\n"
                f"[bastion]\n{bastion}\n")
    result, text = run(inv)
    assert result is None and problem in text, text


def test_a_host_key_with_a_port_is_read_as_ansible_reads_it(tmp_path: Path) -> None:
    inv = write(tmp_path, """\
        all:
          children:
            control_plane:
              hosts:
                cp-01:5309:
                  ansible_host: 10.0.0.10
            workers:
              hosts:
                "gpu-[01:02]:2222":
                w-03:7000: {ansible_port: 22}
                "[2001:db8::7]:2222":
                "[2001:db8::8]":
        """, name="inventory.yml")
    from gpuk8s.inventory import load_inventory

    hosts = load_inventory(inv).hosts
    assert {n: (h.address, h.port) for n, h in hosts.items()} == {
        "cp-01": ("10.0.0.10", 5309), "gpu-01": ("gpu-01", 2222), "gpu-02": ("gpu-02", 2222),
        "w-03": ("w-03", 22),  # the host's own ansible_port wins, as in Ansible
        "2001:db8::7": ("2001:db8::7", 2222), "2001:db8::8": ("2001:db8::8", 22)}


def test_password_login_is_refused_with_the_switch_to_a_key(tmp_path: Path) -> None:
    inv = write(tmp_path, """\
        [kube_control_plane]
        node1 ansible_host=10.0.0.10

        [all:vars]
        ansible_password=vagrant
        """)
    result, text = run(inv)
    assert result is None
    assert ":5: ansible_password: gpuk8s does not log in with passwords, only with SSH keys" \
        in text
    assert "run `ssh-copy-id USER@HOST` once per host" in text and "vagrant" not in text


def test_ansibles_harmless_settings_are_ignored_and_others_refused(tmp_path: Path) -> None:
    inv = write(tmp_path, """\
        [control]
        cp ansible_host=10.0.0.10 ansible_ssh_retries=3 ansible_ruby_interpreter=/usr/bin/ruby

        [workers]
        w ansible_host=10.0.0.11
        """)
    result, text = run(inv)
    assert result is not None, text
    assert result["hosts"] == {"cp": "control plane", "w": "worker"}  # chutes' [control]
    assert "2 variables gpuk8s does not use (ignored): ansible_ruby_interpreter, " \
        "ansible_ssh_retries" in result["warnings"][0]
    bad = write(tmp_path, "[control_plane]\ncp ansible_host=10.0.0.10 ansible_become_exe=doas\n")
    result, text = run(bad)
    assert result is None and "ansible_become_exe is not supported by gpuk8s" in text


def test_templates_and_inventories_without_a_cluster_say_why(tmp_path: Path) -> None:
    template = write(tmp_path, """\
        [kube_control_plane]
        # node1 ansible_host=95.54.0.12  # ip=10.3.0.1

        [kube_node]
        # node4 ansible_host=95.54.0.15
        """)
    _, text = run(template)
    assert "the inventory defines no hosts, but 2 host lines are commented out (a template" \
        in text
    web = write(tmp_path, "[webservers]\nweb1 ansible_host=10.0.0.1\n[dbservers]\ndb1\n")
    _, text = run(web)
    assert "no control plane: no host is in the control_plane group (or kube_control_plane, " \
        "master, server...); groups here: dbservers, webservers" in text


def test_kubespray_proxies_are_applied_to_apt(tmp_path: Path) -> None:
    inv = write(tmp_path, """\
        [kube_control_plane]
        node1 ansible_host=10.0.0.10

        [all:vars]
        http_proxy=http://10.0.0.1:3128
        https_proxy=http://10.0.0.1:3129
        no_proxy=localhost,10.0.0.5,.svc,10.0.0.0/8,mirror.lab
        additional_no_proxy=10.0.0.6
        """)
    result, text = run(inv)
    assert result is not None, text
    changed = {c["name"]: c["value"] for c in result["changed"]}
    assert changed == {"apt_proxy": "http://10.0.0.1:3128",
                       "apt_https_proxy": "http://10.0.0.1:3129",
                       "apt_proxy_direct": '["localhost", "10.0.0.5", "mirror.lab", "10.0.0.6"]'}
    assert "no_proxy: .svc, 10.0.0.0/8 not applied to apt" in text
    assert "http_proxy is applied to apt only" in text
    bad = write(tmp_path, "[control_plane]\ncp ansible_host=10.0.0.10\n[all:vars]\n"
                "apt_proxy_direct=['10.0.0.0/8']\n")
    result, text = run(bad)
    assert result is None and "apt_proxy_direct: '10.0.0.0/8' is not a host name" in text


def test_a_bastion_outside_k8s_cluster_vars_and_at_a_nodes_address(tmp_path: Path) -> None:
    """kubespray's k8s_cluster group_vars do not reach the bastion: its defaults are no
    cluster-wide disagreement; a bastion may be a node's own address."""
    inv = write(tmp_path, """\
        node1 ansible_host=10.0.0.10

        [kube_control_plane]
        node1

        [k8s_cluster:children]
        kube_control_plane

        [bastion]
        bastion ansible_host=10.0.0.10
        """)
    (tmp_path / "group_vars" / "k8s_cluster").mkdir(parents=True)
    (tmp_path / "group_vars" / "k8s_cluster" / "k8s-cluster.yml").write_text(
        "kube_version: v1.35.2\n")
    result, text = run(inv)
    assert result is not None, text
    assert {c["name"]: c["value"] for c in result["changed"]}["kubernetes_version"] == "1.35"


def test_the_bastions_own_jump_and_key_are_chained(tmp_path: Path) -> None:
    inv = write(tmp_path, """\
        [kube_control_plane]
        node1 ansible_host=10.0.0.10

        [jumps]
        gw ansible_host=198.51.100.1 ansible_ssh_private_key_file=/keys/gw

        [jumps:vars]
        ansible_ssh_common_args='-J edge@203.0.113.9'

        [bastion:children]
        jumps

        [all:vars]
        ansible_ssh_private_key_file=/keys/node
        """)
    from gpuk8s.inventory import load_inventory

    node = load_inventory(inv).hosts["node1"]
    assert node.proxy_jump == "edge@203.0.113.9,root@198.51.100.1:22"
    assert node.identity_files == ("/keys/node", "/keys/gw")
    proxycommand = write(tmp_path, """\
        [kube_control_plane]
        node1 ansible_host=10.0.0.10

        [bastion]
        gw ansible_host=198.51.100.1 ansible_ssh_common_args='-o ProxyCommand="nc %h %p"'
        """)
    result, text = run(proxycommand)
    assert result is None and "has a ProxyCommand, which gpuk8s cannot chain" in text


@pytest.mark.parametrize(("line", "needle"), [
    ("ansible_ssh_password=x", "ansible_ssh_password: gpuk8s does not log in with passwords"),
    ("ansible_ssh_args='-o ProxyCommand=nc'", "ansible_ssh_args is not supported by gpuk8s"),
])
def test_other_ansible_login_settings_are_refused(tmp_path: Path, line: str,
                                                  needle: str) -> None:
    inv = write(tmp_path, f"[control_plane]\ncp ansible_host=10.0.0.10 {line}\n")
    result, text = run(inv)
    assert result is None and needle in text, text


def test_kubesprays_separate_etcd_group_is_named_in_the_fix(tmp_path: Path) -> None:
    # kubespray's documented layout: two control planes, etcd on three hosts of its own group
    inv = write(tmp_path, """\
        node1 ansible_host=10.0.0.1
        node2 ansible_host=10.0.0.2
        node3 ansible_host=10.0.0.3

        [kube_control_plane]
        node1
        node2

        [etcd]
        node1
        node2
        node3

        [kube_node]
        node2
        node3
        """)
    result, text = run(inv)
    assert result is None
    assert "survive as many failures as 1 do (0)" in text
    assert "This inventory's etcd group (node1, node2, node3) is where kubespray runs etcd" in text
    assert "list node1, node2, node3 under control_plane" in text


# -- check and preflight hold an inventory to the same rules -----------------------------------
def test_local_yaml_is_refused_by_check_as_plan_refuses_it() -> None:
    """inventories/local.yaml: `check` said "plan and bootstrap will accept this inventory",
    then plan's preflight refused its loopback endpoint (the real H200 host). The same rule
    now runs in both, with the same text."""
    import collections

    from gpuk8s.cluster_values import inventory_cluster
    from gpuk8s.inventory import load_inventory
    from gpuk8s.roles import HostContext
    from tests.unit.scenarios import fresh_facts

    result, text = run(ROOT / "inventories" / "local.yaml")
    assert result is None and "will accept" not in text
    inv = load_inventory(ROOT / "inventories" / "local.yaml")
    host = inv.hosts["localhost"]
    vars = collections.ChainMap({"ansible_user": host.user}, dict(host.vars))
    ctx = HostContext("localhost", "preflight", vars,
                      fresh_facts("ubuntu2404", 1, "localhost", dict(vars)),
                      {**inventory_cluster(inv), "joined": {}}, host.groups)
    errors, _ = preflight.check(ctx)  # plan's preflight, with a healthy host's facts
    assert [p[0] for p in errors] == ["endpoint"]
    _, message, fix = errors[0]
    flat = " ".join(text.split())
    assert f"localhost: {message} (preflight check endpoint)" in flat
    assert f"fix: {fix}" in flat
    assert "1 problem(s) in the inventory" in text


def test_check_runs_every_inventory_rule_on_every_member() -> None:
    assert len(preflight.INVENTORY_RULES) >= 3
    seen: list[tuple[str, str]] = []
    originals = list(preflight.INVENTORY_RULES)

    def recording(rule: Any) -> Any:
        def wrapped(ctx: Any) -> Any:
            seen.append((rule.__name__, ctx.host))
            return rule(ctx)
        return wrapped

    preflight.INVENTORY_RULES[:] = [recording(r) for r in originals]
    try:
        result, text = run(ROOT / "inventories" / "lab.yaml")
    finally:
        preflight.INVENTORY_RULES[:] = originals
    assert result is not None, text
    hosts = ["cp-01", "gpu-01", "gpu-02", "cpu-01"]
    assert sorted(seen) == sorted((r.__name__, h) for r in originals for h in hosts)


class _FactsRead(Exception):
    pass


class _NoFacts(HostFacts):
    """Facts that raise when a rule reads any: what `check` has (no host contacted)."""

    def __getitem__(self, fact: Any) -> Any:
        raise _FactsRead(fact)

    def get(self, fact: Any, default: Any = None) -> Any:
        raise _FactsRead(fact)


def test_every_preflight_rule_that_reads_no_fact_runs_in_check() -> None:
    """A rule of roles/preflight/role.py that takes a host's context and reads no fact (under
    any of these inventories' variables) needs only the inventory: it must be one of
    INVENTORY_RULES, which `check` runs. A new rule left out (say, one about a signing key
    in the variables) fails here instead of letting check accept what plan refuses."""
    import inspect

    from gpuk8s.roles import HostContext
    from tests.unit.scenarios import default_vars

    variants = [default_vars(), default_vars(control_plane_endpoint="k8s-api.lab:6443",
                                             control_plane_endpoint_mode="external"),
                default_vars(registry_mirrors={"docker.io": ["http://10.88.0.1:5000"]},
                             gpu_allocation="dra", kubernetes_version="1.33",
                             gpu_sharing={"mode": "time-slicing", "replicas": 2})]
    cluster = {"control_planes": [{"host": "cp-01", "address": "127.0.0.1"}],
               "endpoint_mode": "direct", "advertise_address": "127.0.0.1", "joined": {}}
    candidates = []
    for name, fn in vars(preflight).items():
        if not inspect.isfunction(fn) or fn.__module__ != preflight.__name__ or name in (
                "check", "inventory_check", "plan", "inventory_rule", "facts",
                    "_host_address"):
            continue
        params = list(inspect.signature(fn).parameters.values())
        if len(params) == 1 and "HostContext" in str(params[0].annotation):
            candidates.append(fn)
    assert len(candidates) >= 5, [f.__name__ for f in candidates]
    inventory_only = []
    for fn in candidates:
        try:
            for v in variants:
                fn(HostContext("cp-01", "preflight", v, _NoFacts("cp-01", {}), dict(cluster),
                               ("control_plane",)))
        except _FactsRead:
            continue
        inventory_only.append(fn.__name__)
    registered = [r.__name__ for r in preflight.INVENTORY_RULES]
    assert sorted(inventory_only) == sorted(registered)
