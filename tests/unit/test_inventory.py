"""Inventory loading: YAML and INI, aliases, vars dirs, precedence, limits, validation, fuzzing."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuk8s.errors import InventoryError
from gpuk8s.inventory import Host, Inventory, Secret, load_inventory, validate_all

FIXTURES = Path(__file__).parent / "fixtures" / "inventories"
GOOD = FIXTURES / "good"
BAD = FIXTURES / "bad"


def load(path: Path | str, **kwargs: object) -> Inventory:
    kwargs.setdefault("env", {})
    return load_inventory(path, **kwargs)  # type: ignore[arg-type]


def write(tmp_path: Path, text: str, name: str = "hosts.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


MINIMAL = """\
all:
  vars:
    ansible_user: ubuntu
  children:
    control_plane:
      hosts:
        cp-01: {ansible_host: 10.0.0.10}
    workers:
      hosts:
        gpu-01: {ansible_host: 10.0.0.21}
        gpu-02: {ansible_host: 10.0.0.22}
        cpu-01: {ansible_host: 10.0.0.30, absent: true}
    gpu:
      hosts:
        gpu-01:
        gpu-02:
"""


# --------------------------------------------------------------------------- good inventories


def test_lab_yaml_hosts_and_connection_settings() -> None:
    inv = load(GOOD / "lab" / "hosts.yaml")
    assert list(inv.hosts) == ["cp-01", "gpu-01", "gpu-02", "cpu-01"]
    cp = inv.hosts["cp-01"]
    assert (cp.address, cp.port, cp.user, cp.connection) == ("10.0.0.10", 22, "ubuntu", "ssh")
    assert cp.become is True  # user is not root
    assert cp.is_control_plane and not cp.is_worker and not cp.schedulable
    lab_dir = (GOOD / "lab").resolve()
    assert cp.private_key_file == str(lab_dir / "keys" / "lab_ed25519")
    assert cp.key_file == cp.private_key_file
    assert cp.known_hosts_files == (str(lab_dir / "known_hosts"),)
    assert cp.strict_host_key_checking == "accept-new"
    assert cp.source.endswith("good/lab/hosts.yaml:12")
    gpu = inv.hosts["gpu-01"]
    assert gpu.address == "gpu-01"  # no ansible_host: the name
    assert gpu.vars["gpu_required"] is True
    assert gpu.vars["feature_gates"] == {"DynamicResourceAllocation": True}
    assert inv.hosts["cpu-01"].port == 2222
    assert inv.hosts["cpu-01"].absent
    assert [h.name for h in inv.control_planes] == ["cp-01"]
    assert [h.name for h in inv.workers] == ["gpu-01", "gpu-02", "cpu-01"]
    assert [h.name for h in inv.present()] == ["cp-01", "gpu-01", "gpu-02"]


def test_yaml_and_ini_equivalents_give_the_same_inventory() -> None:
    from_yaml = load(GOOD / "lab" / "hosts.yaml")
    from_ini = load(GOOD / "lab" / "hosts.ini")
    assert from_yaml == from_ini
    for name, host in from_yaml.hosts.items():
        assert dict(host.vars) == dict(from_ini.hosts[name].vars)
        assert host.vars["kubernetes_version"] == "1.36"
        assert host.vars["nvidia_driver_branch"] == "580" or host.is_control_plane
    # ...but each knows where its values came from.
    assert from_ini.hosts["gpu-01"].vars.origin("nvidia_driver_branch").endswith(
        "hosts.ini:10 ([workers:vars])")
    assert from_yaml.hosts["gpu-01"].vars.origin("nvidia_driver_branch").endswith(
        "hosts.yaml:23 (workers.vars)")


def test_kubespray_inventory_aliases_and_ignored_groups() -> None:
    inv = load(GOOD / "kubespray" / "hosts.yaml")
    node1, node2 = inv.hosts["node1"], inv.hosts["node2"]
    # kube_control_plane -> control_plane, kube_node -> workers; node1 is in both.
    assert node1.is_control_plane and not node1.is_worker and node1.schedulable
    assert node2.is_worker and node2.schedulable
    assert [h.name for h in inv.control_planes] == ["node1"]
    assert [h.name for h in inv.workers] == ["node2", "node3"]
    assert set(node1.groups) == {"control_plane", "workers", "k8s_cluster"}
    assert "etcd" not in inv.groups and "calico_rr" not in inv.groups
    assert inv.groups["control_plane"].aliases == ("kube_control_plane",)
    assert inv.groups["k8s_cluster"].children == ("control_plane", "workers")
    assert any("etcd" in n and "ignored" in n for n in inv.notes)
    # group_vars/k8s_cluster/ (a directory) applies through the parent group;
    # group_vars/etcd.yml (kubespray's own variables) is not read.
    assert node2.vars["kubernetes_version"] == "1.35"
    assert node2.vars["cni"] == "calico"
    assert node2.vars.origin("cni").endswith("group_vars/k8s_cluster/k8s-cluster.yml:3")
    assert node1.user == "root" and node1.become is False


def test_deepops_ini_inventory() -> None:
    inv = load(GOOD / "deepops" / "inventory")  # no suffix: sniffed as INI
    assert [h.name for h in inv.control_planes] == ["mgmt01"]
    assert [h.name for h in inv.workers] == ["gpu01", "gpu02"]
    gpu01 = inv.hosts["gpu01"]
    assert gpu01.address == "10.0.2.1" and gpu01.user == "ubuntu"
    assert gpu01.proxy_command == "ssh -W %h:%p -q ubuntu@10.0.0.1"
    assert gpu01.warnings == ("ssh option ServerAliveInterval ignored",)
    assert set(gpu01.groups) == {"workers", "k8s-cluster"}
    assert inv.groups["slurm-cluster"].children == ("slurm-master", "slurm-node")
    assert inv.groups["slurm-master"].hosts == ()
    assert gpu01.vars["nvidia_driver_branch"] == "570"
    assert gpu01.vars.origin("nvidia_driver_branch").endswith("deepops/group_vars/all.yml:2")


def test_precedence_and_origins_with_vars_dirs() -> None:
    inv = load(GOOD / "dirs" / "hosts.yaml", overrides=["cuda_version=12.8"])
    gpu1, gpu2, cpu, cp = (inv.hosts[n] for n in ("gpu-01", "gpu-02", "cpu-01", "cp-01"))
    base = "good/dirs/"
    # role default only
    assert cp.vars["kubernetes_version"] == "1.36"
    assert cp.vars.origin("kubernetes_version") == "role default (roles/kubernetes/defaults.yaml)"
    assert cp.vars.origin("absent") == "default (gpuk8s/defaults.yaml)"
    # all: vars < group_vars/all.yaml
    assert cp.vars["reboot_timeout"] == 700
    assert cp.vars.origin("reboot_timeout").endswith(base + "hosts.yaml:4 (all.vars)")
    assert cp.vars["nvidia_driver_branch"] == "580"
    assert cp.vars.origin("nvidia_driver_branch").endswith(base + "group_vars/all.yaml:3")
    # group (inline) beats all; a group_vars/<group>/ directory is read in sorted order
    assert cpu.vars["reboot_timeout"] == 800
    assert cpu.vars.origin("reboot_timeout").endswith("hosts.yaml:13 (workers.vars)")
    assert cpu.vars["nvidia_driver_branch"] == "580"
    assert cpu.vars.origin("nvidia_driver_branch").endswith("group_vars/workers/20-toolkit.yml:1")
    # child group beats parent group
    assert gpu2.vars["reboot_timeout"] != 900  # host_vars wins, see below
    assert gpu1.vars["gpu_required"] is True
    assert gpu1.vars.origin("gpu_required").endswith("group_vars/gpu.yml:1")
    # host inline beats groups; host_vars/ file beats host inline and groups
    assert gpu1.vars["reboot_timeout"] == 1000
    assert gpu1.vars.origin("reboot_timeout").endswith("hosts.yaml:25 (host gpu-01)")
    assert gpu2.vars["reboot_timeout"] == 1200
    assert gpu2.vars.origin("reboot_timeout").endswith(base + "host_vars/gpu-02.yaml:2")
    # same depth: alphabetical, so rack_b beats rack_a
    assert gpu2.vars["nvidia_driver_flavor"] == "proprietary"
    assert gpu2.vars.origin("nvidia_driver_flavor").endswith("(rack_b.vars)")
    assert gpu2.groups == ("rack_a", "rack_b", "workers", "gpu")  # precedence order
    # --set beats everything
    assert gpu2.vars["cuda_version"] == "12.8"
    assert gpu2.vars.origin("cuda_version") == "--set"
    history = [value for _, value in gpu2.vars.history("reboot_timeout")]
    assert history == [600, 700, 800, 900, 1200]
    assert any("wrokers.yaml" in n for n in inv.notes)  # misspelt group_vars file


def test_set_overrides_are_parsed_as_yaml_scalars(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL)
    inv = load(path, overrides=[
        "kubernetes_version=1.35",  # a string variable keeps the text: not the number 1.35
        "nvidia_driver_branch=580",
        "reboot_timeout=900", "gpu_required=yes", "cuda_toolkit_enabled=false",
        "preflight_ignore=[time_sync, swap]", "feature_gates={DynamicResourceAllocation: true}",
        "apt_proxy=http://10.0.0.1:3142", "containerd_sandbox_image=",
        "ansible_port=2222", "ansible_become=no",
    ])
    v = inv.hosts["gpu-01"].vars
    assert v["kubernetes_version"] == "1.35"
    assert v["nvidia_driver_branch"] == "580"
    assert v["reboot_timeout"] == 900
    assert v["gpu_required"] is True and v["cuda_toolkit_enabled"] is False
    assert v["preflight_ignore"] == ["time_sync", "swap"]
    assert v["feature_gates"] == {"DynamicResourceAllocation": True}
    assert v["apt_proxy"] == "http://10.0.0.1:3142"
    assert v["containerd_sandbox_image"] == ""
    assert all(v.origin(k) == "--set" for k in ("reboot_timeout", "apt_proxy"))
    host = inv.hosts["gpu-01"]
    assert host.port == 2222 and host.become is False
    # a mapping works too
    inv2 = load(path, overrides={"reboot_timeout": "30", "cni": "calico"})
    assert inv2.hosts["cp-01"].vars["reboot_timeout"] == 30


@pytest.mark.parametrize("item, fragment, fix", [
    ("reboot_timeout", "is not key=value", "--set key=value"),
    ("reboot_timout=5", "did you mean 'reboot_timeout'?", "rename it to reboot_timeout"),
    ("reboot_timeout=soon", "reboot_timeout must be a whole number", "reboot_timeout: 600"),
    ("gpu_required=2", "gpu_required must be a boolean", "true"),
    ("kubernetes_version=1.30", "Kubernetes 1.30 is not supported", 'kubernetes_version: "'),
])
def test_set_errors(tmp_path: Path, item: str, fragment: str, fix: str) -> None:
    with pytest.raises(InventoryError) as exc:
        load(write(tmp_path, MINIMAL), overrides=[item])
    assert exc.value.path == "--set"
    assert fragment in exc.value.message
    assert exc.value.fix and fix in exc.value.fix


def test_ini_features(tmp_path: Path) -> None:
    path = write(tmp_path, """\
; comment
ungrouped-01 ansible_host=10.9.0.1

[control_plane]
cp-[a:b] ansible_connection=local  # trailing comment

[workers]
node[1:5:2].lab ansible_user=admin ansible_become=false

[gpu:children]
workers

[gpu:vars]
gpu_required=True
nvidia_fabricmanager=false
base_sysctls={"vm.max_map_count": 262144}
""", name="hosts.ini")
    inv = load(path)
    assert list(inv.hosts) == ["ungrouped-01", "cp-a", "cp-b", "node1.lab", "node3.lab",
                               "node5.lab"]
    assert inv.groups["ungrouped"].hosts == ("ungrouped-01",)
    assert inv.hosts["cp-a"].connection == "local"
    node = inv.hosts["node3.lab"]
    assert node.user == "admin" and node.become is False
    assert node.groups == ("gpu", "workers")
    assert node.vars["gpu_required"] is True
    assert node.vars["nvidia_fabricmanager"] is False
    assert node.vars["base_sysctls"] == {"vm.max_map_count": 262144}
    assert inv.groups["gpu"].hosts == ("node1.lab", "node3.lab", "node5.lab")


def test_top_level_groups_other_than_all(tmp_path: Path) -> None:
    inv = load(write(tmp_path, """\
masters:
  hosts:
    cp-01: {ansible_host: 10.0.0.10}
nodes:
  hosts:
    gpu-01: {ansible_host: 10.0.0.21}
  vars:
    nvidia_driver_branch: "570"
    cuda_version: "12.8"
"""))
    assert [h.name for h in inv.control_planes] == ["cp-01"]
    assert [h.name for h in inv.workers] == ["gpu-01"]
    assert inv.hosts["gpu-01"].vars["nvidia_driver_branch"] == "570"


def test_host_in_several_groups_is_one_host(tmp_path: Path) -> None:
    inv = load(write(tmp_path, MINIMAL))
    gpu = inv.hosts["gpu-01"]
    assert gpu.groups == ("gpu", "workers")
    assert list(inv.groups["gpu"].hosts) == ["gpu-01", "gpu-02"]
    assert len(inv.hosts) == 4


def test_ssh_args_are_parsed_into_fields(tmp_path: Path) -> None:
    inv = load(write(tmp_path, """\
all:
  vars:
    ansible_ssh_common_args: >-
      -o ProxyJump=jump@bastion.lab:2200 -o UserKnownHostsFile="~/.ssh/lab_known /tmp/other"
      -F ssh_config -i keys/extra -o StrictHostKeyChecking=no -o ControlMaster=auto -C
    ansible_ssh_extra_args: -J ignored-second-jump -o ProxyCommand="nc %h %p"
  children:
    control_plane:
      hosts:
        cp-01:
"""))
    cp = inv.hosts["cp-01"]
    assert cp.proxy_jump == "jump@bastion.lab:2200"
    assert cp.proxy_command == "nc %h %p"
    assert cp.known_hosts_files == (str(Path("~/.ssh/lab_known").expanduser()), "/tmp/other")
    assert cp.ssh_config_file == str(tmp_path.resolve() / "ssh_config")
    assert cp.strict_host_key_checking == "no"
    assert cp.private_key_file == str(tmp_path.resolve() / "keys" / "extra")
    assert "ssh option ControlMaster ignored" in cp.warnings
    assert "ssh flag -C ignored" in cp.warnings
    assert any("ProxyJump is used" in w for w in cp.warnings)


# --------------------------------------------------------------------------- secrets


SECRET = "s3cr3t-Pa55"


def test_become_password_never_shown(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL.replace("ansible_user: ubuntu",
                                           f"ansible_user: ubuntu\n    ansible_become_password: "
                                           f"{SECRET}"))
    inv = load(path)
    cp = inv.hosts["cp-01"]
    assert isinstance(cp.become_password, Secret)
    assert cp.become_password.reveal() == SECRET
    for text in (repr(cp), str(cp), repr(inv), str(cp.become_password), repr(cp.vars),
                 f"{cp.become_password}", repr(list(inv.hosts.values())), str(inv.notes)):
        assert SECRET not in text
    assert "ansible_become_password" not in cp.vars
    assert inv.needs_become_password() == []


def test_become_password_not_in_errors(tmp_path: Path) -> None:
    broken = [
        f'all:\n  vars:\n    ansible_become_password: "{SECRET}\n',  # unclosed quote
        f"all:\n  vars:\n    ansible_become_password: {{{SECRET}: 1}}\n",
        f"all:\n  vars:\n    ansible_become_pass: {SECRET}\n  hosts: {{cp: }}\n",
        f"all:\n  vars:\n    ansible_become_password: {SECRET}\n    kubernetes_version: 1.3\n",
        f"all:\n  vars:\n    ansible_become_password: !{SECRET}\n",  # read as a YAML tag
        f"all:\n  vars:\n    ansible_become_password: *{SECRET}\n",  # read as an alias
    ]
    for text in broken:
        problems = validate_all(write(tmp_path, text), env={})
        assert problems
        for p in problems:
            assert SECRET not in str(p) and SECRET not in repr(p)
    ini = f"[control_plane]\ncp-01 ansible_become_password {SECRET}\n"
    for p in validate_all(write(tmp_path, ini, "hosts.ini"), env={}):
        assert SECRET not in str(p)


def test_become_password_from_env_and_prompt_list(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL)
    inv = load(path)
    # cpu-01 is absent: never contacted, never prompted for.
    assert inv.needs_become_password() == ["cp-01", "gpu-01", "gpu-02"]
    inv2 = inv.with_become_password("typed", names=["cp-01"])
    assert inv2.hosts["cp-01"].become_password == Secret("typed")
    assert inv2.needs_become_password() == ["gpu-01", "gpu-02"]
    from_env = load(path, env={"GPUK8S_BECOME_PASSWORD": "envpw"})
    assert from_env.needs_become_password() == []
    assert from_env.hosts["gpu-01"].become_password == Secret("envpw")
    root = load(path, overrides=["ansible_user=root"])
    assert root.needs_become_password() == []
    assert root.hosts["cp-01"].become is False


def test_secret_class() -> None:
    s = Secret("x")
    assert repr(s) == "Secret('********')" and str(s) == "********" and f"{s:>20}" == "********"
    assert s == Secret("x") and s != Secret("y") and bool(s) and not Secret("")
    host = Host("h", "10.0.0.1", become_password=Secret("pw"))
    assert "pw" not in repr(host) and "<set>" in repr(host)
    assert Host("h", "a", user="ubuntu").become is True
    assert Host("h", "a").become is False


# --------------------------------------------------------------------------- select


@pytest.mark.parametrize("limit, expected", [
    (None, ["cp-01", "gpu-01", "gpu-02", "cpu-01"]),
    ("", ["cp-01", "gpu-01", "gpu-02", "cpu-01"]),
    ("all", ["cp-01", "gpu-01", "gpu-02", "cpu-01"]),
    ("gpu-01", ["gpu-01"]),
    ("gpu-02,cp-01", ["cp-01", "gpu-02"]),
    ("gpu-02:cp-01", ["cp-01", "gpu-02"]),
    ("workers", ["gpu-01", "gpu-02", "cpu-01"]),
    ("kube_node", ["gpu-01", "gpu-02", "cpu-01"]),  # aliases work in limits too
    ("gpu-*", ["gpu-01", "gpu-02"]),
    ("workers,!gpu-02", ["gpu-01", "cpu-01"]),
    ("!gpu", ["cp-01", "cpu-01"]),
    ("workers,&gpu", ["gpu-01", "gpu-02"]),
    ("~^gpu-0[2-9]$", ["gpu-02"]),
    ("control_plane, gpu-0?", ["cp-01", "gpu-01", "gpu-02"]),
])
def test_select(tmp_path: Path, limit: str | None, expected: list[str]) -> None:
    inv = load(write(tmp_path, MINIMAL))
    assert [h.name for h in inv.select(limit)] == expected


def test_select_present_only_and_unknown(tmp_path: Path) -> None:
    inv = load(write(tmp_path, MINIMAL))
    assert [h.name for h in inv.select("workers", present_only=True)] == ["gpu-01", "gpu-02"]
    with pytest.raises(InventoryError) as exc:
        inv.select("gpu-03")
    assert "known hosts: cp-01, gpu-01, gpu-02, cpu-01" in exc.value.message
    assert exc.value.fix and "did you mean 'gpu-0" in exc.value.fix
    with pytest.raises(InventoryError):
        inv.select("rack-*")
    with pytest.raises(InventoryError):
        inv.vars_for("nope")
    assert inv.vars_for("gpu-01")["gpu_required"] is False


# --------------------------------------------------------------------------- broken inventories

_EXPECT = re.compile(r"# error(?: in (?P<file>\S+))?: line (?P<line>\d+|-): (?P<message>.*) "
                     r"\(fix: (?P<fix>.*)\)$")


def _bad_cases() -> list[Path]:
    files = [p for p in BAD.iterdir() if p.is_file()]
    files += [p / "hosts.yaml" for p in BAD.iterdir() if p.is_dir()]
    return sorted(files)


def _expectation(path: Path) -> tuple[Path, int | None, str, str]:
    m = _EXPECT.match(path.read_text().splitlines()[0])
    assert m, f"{path}: first line must be '# error[ in FILE]: line N: message (fix: fix)'"
    target = path.parent / m["file"] if m["file"] else path
    line = None if m["line"] == "-" else int(m["line"])
    return target, line, m["message"], m["fix"]


def test_there_are_enough_broken_inventories() -> None:
    assert len(_bad_cases()) >= 30


@pytest.mark.parametrize("path", _bad_cases(), ids=lambda p: p.relative_to(BAD).as_posix())
def test_broken_inventory(path: Path) -> None:
    target, line, message, fix = _expectation(path)
    with pytest.raises(InventoryError) as exc:
        load(path)
    err = exc.value
    assert err.path is not None and Path(err.path).resolve() == target.resolve(), str(err)
    assert err.line == line, str(err)
    assert message in err.message, str(err)
    assert err.fix and fix in err.fix, str(err)
    # validate_all reports the same first problem, and each fixture is broken in one place only.
    problems = validate_all(path, env={})
    assert str(problems[0]) == str(err)
    assert len(problems) == 1, [str(p) for p in problems]


def test_validate_all_collects_every_problem(tmp_path: Path) -> None:
    path = write(tmp_path, """\
all:
  vars:
    kubernets_version: "1.36"
    gpu_required: 1
    cni: weave
  children:
    workers:
      hosts:
        gpu-01:
          ansible_port: 0
""")
    problems = validate_all(path, env={})
    assert [p.line for p in problems] == [3, 4, 5, 10, None]
    assert "no control plane" in problems[-1].message
    with pytest.raises(InventoryError) as exc:
        load(path)
    assert exc.value.line == 3


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="not found"):
        load(tmp_path / "nope.yaml")
    with pytest.raises(InventoryError, match="inventory folder holds none of"):
        load(tmp_path)


def test_more_than_one_control_plane_is_allowed(tmp_path: Path) -> None:
    inv = load(write(tmp_path, MINIMAL.replace("cp-01: {ansible_host: 10.0.0.10}",
                                               "cp-0[1:3]:")))
    assert [h.name for h in inv.control_planes] == ["cp-01", "cp-02", "cp-03"]


# --------------------------------------------------------------------------- fuzzing

_WORDS = ["all", "children", "hosts", "vars", "control_plane", "workers", "kube_node", "gpu",
          "cp-01", "gpu-[01:03]", "gpu-[3:1]", "ansible_host", "ansible_port", "ansible_become",
          "ansible_become_password", "ansible_ssh_common_args", "ansible_connection",
          "kubernetes_version", "feature_gates", "Accelerators", "pod_cidr", "service_cidr",
          "reboot_timeout", "nvidia_driver_branch", "control_plane_endpoint", "absent", "x"]
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 70000),
                     st.floats(allow_nan=True), st.sampled_from(_WORDS),
                     st.sampled_from(["1.36", "10.0.0.1", "10.96.0.0/12", "-o ProxyJump=a",
                                      "-o 'x", "{{ x }}", "{{", "local", "winrm", ""]),
                     st.text(max_size=8))
_TREES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(_WORDS), inner, max_size=4)),
    max_leaves=25)
_INI_LINES = st.lists(st.one_of(
    st.sampled_from(["[all]", "[all:vars]", "[workers]", "[control_plane]", "[gpu:children]",
                     "[x:bad]", "[broken", "workers", "cp-01", "gpu-[01:02] ansible_port=2",
                     "cp-01 ansible_host=10.0.0.1", "a=b", "kubernetes_version=1.30",
                     "h 'unclosed", "feature_gates={'Accelerators': True}", "# c", ""]),
    st.text(max_size=20)), max_size=12)

_FUZZ = settings(max_examples=150, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _only_inventory_errors(text: str, name: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            load(path)
        except InventoryError as exc:
            assert exc.path and str(exc)
        validate_all(path, env={})


@_FUZZ
@given(st.text(max_size=300), st.sampled_from(["hosts.yaml", "hosts.ini", "inventory"]))
def test_fuzz_random_text(text: str, name: str) -> None:
    _only_inventory_errors(text.replace("\udcff", ""), name)


@_FUZZ
@given(_TREES)
def test_fuzz_yaml_structures(tree: object) -> None:
    _only_inventory_errors(yaml.safe_dump({"all": tree}), "hosts.yaml")
    _only_inventory_errors(yaml.safe_dump(tree), "hosts.yaml")


@_FUZZ
@given(_INI_LINES)
def test_fuzz_ini_lines(lines: list[str]) -> None:
    _only_inventory_errors("\n".join(lines), "hosts.ini")


def test_hosts_only_in_ignored_groups_are_dropped(tmp_path: Path) -> None:
    inv = load(write(tmp_path, """\
all:
  children:
    kube_control_plane:
      hosts:
        cp-01: {ansible_host: 10.0.0.10}
    etcd:
      hosts:
        cp-01:
        etcd-02: {ansible_host: 10.0.0.12}
      vars:
        etcd_deployment_type: host   # kubespray's, not ours: not read
    bastion:
      hosts:
        jump: {ansible_host: 10.0.0.99}
"""))
    assert list(inv.hosts) == ["cp-01", "jump"]  # the bastion is kept, as the jump host
    assert any("etcd-02" in n and "not used" in n for n in inv.notes)
    assert any("'jump' (group bastion) is the jump host" in n for n in inv.notes)
    assert inv.hosts["cp-01"].proxy_jump == "root@10.0.0.99:22"


def test_duplicate_keys_inside_a_value_are_reported(tmp_path: Path) -> None:
    path = write(tmp_path, """\
all:
  vars:
    feature_gates:
      DynamicResourceAllocation: true
      DynamicResourceAllocation: false
  hosts:
    cp-01:
  children:
    control_plane:
      hosts:
        cp-01:
""")
    with pytest.raises(InventoryError) as exc:
        load(path)
    assert exc.value.line == 5
    assert "duplicate key 'DynamicResourceAllocation' (first at line 4)" in exc.value.message


def test_group_vars_for_alias_names_apply_to_the_canonical_group(tmp_path: Path) -> None:
    write(tmp_path, "[kube-master]\ncp-01\n[kube-node]\ngpu-01\n", "hosts.ini")
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "kube-node.yml").write_text(
        'nvidia_driver_branch: "570"\ncuda_version: "12.8"\n')
    inv = load(tmp_path / "hosts.ini")
    assert inv.hosts["gpu-01"].vars["nvidia_driver_branch"] == "570"
    assert inv.hosts["cp-01"].vars["nvidia_driver_branch"] == "580"


def test_feature_gates_on_some_hosts_only_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL.replace(
        "        gpu-01: {ansible_host: 10.0.0.21}",
        "        gpu-01: {ansible_host: 10.0.0.21, feature_gates: {DynamicResourceAllocation: "
        "true}}"))
    with pytest.raises(InventoryError, match=r"feature_gates differs between hosts.*"
                       r"cluster-wide") as err:
        load(path)
    assert "set feature_gates once, under all: vars:" in str(err.value)
