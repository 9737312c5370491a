"""Variable specs from the defaults files, value checks, the precedence merge and rendering."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuk8s.checks import SUPPORTED_KUBERNETES
from gpuk8s.errors import InventoryError, PlanError
from gpuk8s.templating import render_value
from gpuk8s.variables import (
    MergedVars,
    Origin,
    VarLayer,
    check_combination,
    check_value,
    defaults_layer,
    load_variable_specs,
    merge_vars,
    parse_override_value,
)

SPECS = load_variable_specs()


def defaults(**changes: Any) -> dict[str, Any]:
    values = {name: spec.default for name, spec in SPECS.items()}
    values.update(changes)
    return values


# --------------------------------------------------------------------------- specs


def test_specs_cover_every_defaults_file() -> None:
    roles = {spec.role for spec in SPECS.values()}
    role_dirs = {p.parent.name for p in Path("roles").glob("*/defaults.yaml")} \
        if Path("roles").is_dir() else set()
    assert "cluster" in roles
    assert role_dirs <= roles | {d for d in role_dirs if not SPECS}
    k = SPECS["kubernetes_version"]
    assert (k.role, k.source, k.type, k.type_name) == (
        "kubernetes", "roles/kubernetes/defaults.yaml", str, "str")
    assert k.help.startswith("Kubernetes minor version to install")
    assert SPECS["gpu_required"].role == "cluster"
    assert SPECS["gpu_required"].source == "gpuk8s/defaults.yaml"
    assert SPECS["reboot_timeout"].type is int
    assert SPECS["feature_gates"].type is dict
    assert SPECS["preflight_ignore"].type is list
    assert SPECS["gpu_required"].type is bool
    # a Jinja default stays a string
    assert SPECS["kubernetes_repo_url"].type is str


def test_help_joins_the_comment_lines_above_the_key() -> None:
    help_text = SPECS["control_plane_endpoint"].help
    assert help_text.startswith('Stable "host:port" for the API server')
    assert help_text.endswith("if you may add control planes later.")
    # the file header, separated by a blank line, is not part of the first variable's help
    assert "Cluster-wide" not in SPECS["gpu_required"].help


def test_choices() -> None:
    assert SPECS["container_runtime"].choices == ("containerd", "docker")
    assert SPECS["cni"].choices == ("flannel", "calico")
    assert SPECS["nvidia_driver_source"].choices == ("auto", "ubuntu", "cuda")
    assert SPECS["nvidia_driver_flavor"].choices == ("auto", "open", "proprietary")
    assert SPECS["nvidia_fabricmanager"].choices == ("auto", True, False)
    assert SPECS["kubernetes_version"].choices is None


def test_specs_are_cached_but_callers_get_their_own_dict() -> None:
    a, b = load_variable_specs(), load_variable_specs()
    assert a == b and a is not b
    a.pop("cni")
    assert "cni" in load_variable_specs()


def test_every_default_passes_its_own_checks() -> None:
    for name, spec in SPECS.items():
        value, problem = check_value(spec, spec.default)
        assert problem is None, (name, problem)
        assert value == spec.default
    assert check_combination(defaults()) == []


def test_other_project_root(tmp_path: Path) -> None:
    (tmp_path / "gpuk8s").mkdir()
    (tmp_path / "gpuk8s" / "defaults.yaml").write_text("# Say hi.\ngreeting: hi\n")
    (tmp_path / "roles" / "a").mkdir(parents=True)
    (tmp_path / "roles" / "a" / "defaults.yaml").write_text("a_count: 3\n")
    specs = load_variable_specs(tmp_path)
    assert list(specs) == ["greeting", "a_count"]
    assert specs["greeting"].help == "Say hi."
    assert specs["a_count"].role == "a"
    other = tmp_path / "other"
    (other / "roles" / "a").mkdir(parents=True)
    (other / "roles" / "a" / "defaults.yaml").write_text("a_count: 3\n")
    (other / "roles" / "b").mkdir()
    (other / "roles" / "b" / "defaults.yaml").write_text("\n\na_count: 4\n")
    with pytest.raises(InventoryError) as exc:
        load_variable_specs(other)
    assert exc.value.path == "roles/b/defaults.yaml" and exc.value.line == 3
    assert "defined twice" in exc.value.message


# --------------------------------------------------------------------------- single values

GOOD = [
    ("kubernetes_version", "1.34"), ("kubernetes_version", "1.37"),
    ("kubernetes_package_version", "1.36.2-1.1"), ("kubernetes_package_version", ""),
    ("nvidia_driver_branch", "570"), ("nvidia_driver_branch", 580),
    ("nvidia_driver_version", "580.159.04-1"), ("cuda_version", "12.8"),
    ("nvidia_container_toolkit_version", "1.19.0"), ("containerd_version", "2.1.4-1"),
    ("pod_cidr", "192.168.0.0/16"), ("service_cidr", "fd00:10:96::/108"),
    ("feature_gates", {"DynamicResourceAllocation": True, "NodeSwap": False}),
    ("control_plane_endpoint", ""), ("control_plane_endpoint", "k8s-api.lab:6443"),
    ("control_plane_endpoint", "10.0.0.5:6443"), ("control_plane_endpoint", "[fd00::5]:6443"),
    ("docker_repo_url", "http://10.88.0.1:8081/download.docker.com/linux/{{ os_id }}"),
    ("apt_proxy", ""), ("apt_proxy", "http://10.0.0.1:3142"),
    ("reboot_timeout", 1), ("join_token_ttl", "1h30m"), ("join_token_ttl", "0"),
    ("nvidia_fabricmanager", True), ("nvidia_fabricmanager", "auto"),
    ("cni", "calico"), ("container_runtime", "docker"), ("preflight_ignore", ["time_sync"]),
    ("base_sysctls", {"vm.max_map_count": 262144}), ("cluster_dns_domain", "lab.internal"),
    ("kubernetes_repo_url", "{{ mirror }}/core:/stable:/v{{ kubernetes_version }}/deb/"),
]


@pytest.mark.parametrize("name, value", GOOD)
def test_good_values(name: str, value: Any) -> None:
    _, problem = check_value(SPECS[name], value)
    assert problem is None, problem


def test_int_given_to_a_string_variable_becomes_its_text() -> None:
    assert check_value(SPECS["nvidia_driver_branch"], 580) == ("580", None)
    assert check_value(SPECS["nvidia_fabricmanager"], "false") == (False, None)


BAD = [
    ("kubernetes_version", 1.3, 'YAML reads the unquoted 1.3 as the number 1.3',
     'quote it: kubernetes_version: "1.3"'),
    ("kubernetes_version", "1.36.2", "minor version", 'kubernetes_package_version: "1.36.2-1.1"'),
    ("kubernetes_version", "v1.36", "without the v", 'kubernetes_version: "1.36"'),
    ("kubernetes_version", "1.33", "Kubernetes 1.33 is not supported", "1.36"),
    ("kubernetes_version", "latest", "major.minor", "1.36"),
    ("kubernetes_package_version", "1.36.2", 'apt version like "1.36.2-1.1"', "1.36.2-1.1"),
    ("nvidia_driver_branch", "58", "3 digits", '"580"'),
    ("nvidia_driver_branch", "560", "branch 560 is not supported", '"580"'),
    ("nvidia_driver_branch", 5.8, "quoted string", 'nvidia_driver_branch: "5.8"'),
    ("nvidia_driver_version", "latest", "driver package version", "580.159.04-1"),
    ("cuda_version", 13.0, "quoted string", 'cuda_version: "13.0"'),
    ("cuda_version", "13.0.1", "major.minor", '"13.0"'),
    ("nvidia_container_toolkit_version", "v1.20.0", "without the v", '"1.20.0"'),
    ("flannel_version", "0.28", "x.y.z", "three numbers"),
    ("containerd_version", "two", 'version like "2.1.4"', '"2.1.4"'),
    ("pod_cidr", "10.244.0.0", "", ""),  # a /32: too small for nodes
    ("pod_cidr", "10.244.0.0/33", "not a network in CIDR form", '"10.244.0.0/16"'),
    ("pod_cidr", "10.244.1.0/16", "host bits set", 'pod_cidr: "10.244.0.0/16"'),
    ("service_cidr", "10.0.0.0/8", "too large", '"10.96.0.0/12"'),
    ("feature_gates", ["A"], "must be a mapping, got list", "YAML mapping"),
    ("feature_gates", {"Accelerators": True}, "removed in Kubernetes 1.11", "nvidia.com/gpu"),
    ("feature_gates", {"DevicePlugins": True}, "GA in Kubernetes 1.26", "remove DevicePlugins"),
    ("feature_gates", {"dynamic-resource-allocation": True}, "not CamelCase", "{Dynamic"),
    ("feature_gates", {"NodeSwap": "true"}, "must be true or false", "NodeSwap: true"),
    ("control_plane_endpoint", "k8s-api.lab", 'must be "host:port"', ":6443"),
    ("control_plane_endpoint", "k8s-api.lab:99999", 'must be "host:port"', ":6443"),
    ("docker_repo_url", "download.docker.com/linux/{{ os_id }}", "http(s) URL", "https://"),
    ("apt_proxy", "10.0.0.1:3142", "http(s) URL", 'http://10.0.0.1:3142" or ""'),
    ("docker_repo_url", "https://x/{{ os_id }", "broken Jinja placeholder", "{{ variable }}"),
    ("reboot_timeout", -5, "positive", "greater than 0"),
    ("reboot_timeout", True, "must be a whole number, got boolean True", "reboot_timeout: 600"),
    ("reboot_timeout", "600", "must be a whole number, got string '600'", "without quotes"),
    ("gpu_required", 1, "must be a boolean, got whole number 1", "gpu_required: true"),
    ("gpu_required", "yes", "must be a boolean, got string 'yes'", "without quotes"),
    ("gpu_required", None, "has no value (null)", "gpu_required: true"),
    ("join_token_ttl", "15 minutes", "duration", '"15m0s"'),
    ("cluster_dns_domain", "Cluster.Local", "DNS domain", "cluster.local"),
    ("preflight_ignore", ["ok", 3], "list of strings", '["time_sync"]'),
    ("base_sysctls", {"vm.swappiness": [1]}, "must be a number or string", "vm.swappiness: 1"),
    ("cni", "Calico", "must be one of flannel|calico", "cni: calico"),
    ("nvidia_driver_flavor", True, "must be a string, got boolean", "nvidia_driver_flavor"),
    ("nvidia_fabricmanager", "yes", "one of auto|true|false", "auto"),
    ("container_runtime", "crio", "one of containerd|docker", "containerd|docker"),
]


@pytest.mark.parametrize("name, value, message, fix", BAD)
def test_bad_values(name: str, value: Any, message: str, fix: str) -> None:
    _, problem = check_value(SPECS[name], value)
    assert problem is not None, f"{name}={value!r} should be rejected"
    assert problem.key == name
    assert message in problem.message
    assert fix in problem.fix


def test_float_message_names_the_digits_as_written() -> None:
    _, problem = check_value(SPECS["kubernetes_version"], 1.3, raw="1.30")
    assert problem is not None
    assert "unquoted 1.30 as the number 1.3" in problem.message
    assert problem.fix == 'quote it: kubernetes_version: "1.30"'


def test_removed_feature_gates_point_at_the_gate() -> None:
    _, problem = check_value(SPECS["feature_gates"], {"X": True, "Accelerators": True})
    assert problem is not None and problem.subkey == "Accelerators"
    assert "NVIDIA device plugin" in problem.message and "enabled by default" in problem.message


@given(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=30),
                 st.lists(st.text(max_size=5), max_size=3),
                 st.dictionaries(st.text(max_size=5), st.one_of(st.booleans(), st.text()),
                                 max_size=3)))
@settings(max_examples=300, deadline=None)
def test_check_value_never_raises(value: Any) -> None:
    for spec in SPECS.values():
        check_value(spec, value)
        check_combination(defaults(**{spec.name: value}))


# --------------------------------------------------------------------------- combinations


@pytest.mark.parametrize("changes, key, fragment", [
    ({"pod_cidr": "10.96.0.0/16"}, "service_cidr", "overlap"),
    ({"containerd_version": "1.7.28"}, "containerd_version", "1.35 was the last release"),
    ({"kubernetes_package_version": "1.35.4-1.1"}, "kubernetes_package_version",
     "is not a 1.36 release"),
    ({"nvidia_driver_version": "570.86.15-1"}, "nvidia_driver_version", "not on branch 580"),
    ({"nvidia_driver_branch": "570"}, "cuda_version", "needs driver branch 580 or newer"),
])
def test_combination_problems(changes: dict[str, Any], key: str, fragment: str) -> None:
    problems = check_combination(defaults(**changes))
    assert [p.key for p in problems] == [key]
    assert fragment in problems[0].message


@pytest.mark.parametrize("changes", [
    {"kubernetes_version": "1.35", "containerd_version": "1.7.28"},  # 1.x still fine on 1.35
    {"container_runtime": "docker"},
    {"containerd_version": "2.2.0"},
    {"nvidia_driver_branch": "570", "cuda_version": "12.8"},
    {"nvidia_driver_branch": "570", "cuda_toolkit_enabled": False},
    {"pod_cidr": "fd00:244::/56", "service_cidr": "10.96.0.0/12"},
    {"kubernetes_version": "{{ k }}", "containerd_version": "1.7.0"},
])
def test_combinations_that_are_fine(changes: dict[str, Any]) -> None:
    assert check_combination(defaults(**changes)) == []


# --------------------------------------------------------------------------- merge


def test_merge_precedence_origins_and_history() -> None:
    merged = merge_vars([
        defaults_layer({"cni": SPECS["cni"], "reboot_timeout": SPECS["reboot_timeout"]}),
        VarLayer({"cni": "calico"}, {"cni": Origin("inv.yaml:3 (all.vars)", "inv.yaml", 3)}),
        VarLayer({"reboot_timeout": 900}, label="--set"),
        VarLayer({"cni": "flannel"}, {"cni": Origin("group_vars/workers.yaml:1",
                                                    "group_vars/workers.yaml", 1)}),
    ])
    assert isinstance(merged, MergedVars)
    assert dict(merged) == {"cni": "flannel", "reboot_timeout": 900}
    assert merged.origin("cni") == "group_vars/workers.yaml:1"
    assert merged.origin_of("cni").line == 1
    assert merged.origin("reboot_timeout") == "--set"
    assert [v for _, v in merged.history("cni")] == ["flannel", "calico", "flannel"]
    assert str(merged.history("cni")[0][0]) == "role default (roles/cni/defaults.yaml)"
    assert merged.subset(["cni"]) == {"cni": "flannel"}
    assert merged == {"cni": "flannel", "reboot_timeout": 900}
    with pytest.raises(KeyError):
        merged.origin("nope")


def test_merge_replaces_mappings_instead_of_deep_merging() -> None:
    merged = merge_vars([VarLayer({"feature_gates": {"A": True}}),
                         VarLayer({"feature_gates": {"B": True}})])
    assert merged["feature_gates"] == {"B": True}


def test_cluster_defaults_say_default_not_role_default() -> None:
    layer = defaults_layer(SPECS)
    assert str(layer.origin("absent")) == "default (gpuk8s/defaults.yaml)"
    assert str(layer.origin("cni")) == "role default (roles/cni/defaults.yaml)"


# --------------------------------------------------------------------------- --set values


@pytest.mark.parametrize("name, text, expected", [
    ("kubernetes_version", "1.30", "1.30"),
    ("kubernetes_version", "1.36", "1.36"),
    ("nvidia_driver_branch", "580", "580"),
    ("control_plane_endpoint", "10:30", "10:30"),  # YAML 1.1 would read 630
    ("apt_proxy", "", ""),
    ("reboot_timeout", "900", 900),
    ("gpu_required", "true", True),
    ("gpu_required", "no", False),
    ("preflight_ignore", "[time_sync]", ["time_sync"]),
    ("feature_gates", "{A: true}", {"A": True}),
    ("cni", "calico", "calico"),
    ("reboot_timeout", "[unclosed", "[unclosed"),
])
def test_parse_override_value(name: str, text: str, expected: Any) -> None:
    assert parse_override_value(SPECS[name], text) == expected


# --------------------------------------------------------------------------- rendering


def test_render_value() -> None:
    ctx = {"kubernetes_version": "1.36", "os_id": "debian", "mirror": "http://m/{{ os_id }}"}
    assert render_value(SPECS["kubernetes_repo_url"].default, ctx) == \
        "https://pkgs.k8s.io/core:/stable:/v1.36/deb/"
    assert render_value("{{ mirror }}/x", ctx) == "http://m/debian/x"  # values render too
    assert render_value(["{{ os_id }}", {"k": "{{ os_id }}"}], ctx) == ["debian", {"k": "debian"}]
    assert render_value(600, ctx) == 600
    assert render_value("no placeholders {", ctx) == "no placeholders {"


def test_render_value_undefined_and_loops() -> None:
    with pytest.raises(PlanError, match="docker_repo_url: 'os_idd' is undefined"):
        render_value("https://x/{{ os_idd }}", {"os_id": "debian"}, name="docker_repo_url")
    with pytest.raises(PlanError, match="loop"):
        render_value("{{ a }}", {"a": "{{ b }}", "b": "{{ a }}"})
    with pytest.raises(PlanError):
        render_value("{{ a }", {})


def test_supported_versions() -> None:
    assert SUPPORTED_KUBERNETES == ("1.34", "1.35", "1.36", "1.37")
    assert SPECS["kubernetes_version"].default in SUPPORTED_KUBERNETES
