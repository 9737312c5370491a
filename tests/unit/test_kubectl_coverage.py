"""Every kubectl command line gpuk8s builds runs through the REAL kubectl somewhere in the lab
suite (issue 15): the lab's kubectl package carries Debian's build of kubectl 1.36, so a lab test
that makes gpuk8s run a command runs the real binary. This test lists the subcommands from the
code and checks each is named here with the lab test that exercises it, and that the test exists.
A new kubectl subcommand in gpuk8s fails here until a lab test covers it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: kubectl subcommand -> lab tests (file::function under tests/lab/product/) in which gpuk8s
#: runs it
EXERCISED = {
    "apply": ["test_bootstrap.py::test_bootstrap_as_sudo_user_with_password",
              "test_workloads.py::test_tensorflow_job_trains_on_real_digits_then_eval_reads_its_accuracy"],
    "get": ["test_bootstrap.py::test_bootstrap_as_sudo_user_with_password",
            "test_workloads.py::test_tensorflow_job_trains_on_real_digits_then_eval_reads_its_accuracy"],
    "wait": ["test_bootstrap.py::test_bootstrap_as_sudo_user_with_password",
             "test_k8s_upgrade.py::test_next_minor_control_plane_first_then_one_worker_at_a_time"],
    "label": ["test_bootstrap.py::test_bootstrap_as_sudo_user_with_password"],
    "taint": ["test_real_kubectl.py::test_gpuk8s_untaints_the_control_plane_with_the_real_kubectl"],
    "drain": ["test_day2.py::test_reprovision_touches_only_the_target_and_the_control_plane"],
    "uncordon": ["test_day2.py::test_reprovision_touches_only_the_target_and_the_control_plane"],
    "delete": ["test_day2.py::test_remove_live_node",
               "test_workloads.py::test_undeploy_removes_everything"],
    "version": [
        "test_k8s_upgrade.py::test_next_minor_control_plane_first_then_one_worker_at_a_time"],
    "api-resources": ["test_workloads.py::test_undeploy_removes_everything"],
    "rollout": ["test_monitoring.py::test_gpu_monitoring_scrapes_every_lab_gpu"],
    "cordon": ["test_accept.py::test_a_fault_on_one_gpu_quarantines_that_node_until_release"],
    "annotate": ["test_accept.py::test_a_fault_on_one_gpu_quarantines_that_node_until_release"],
    "create": ["test_jupyterhub.py::test_hub_runs_behind_https_with_the_cluster_ca"],
    "logs": ["test_workloads.py::"
             "test_tensorflow_job_trains_on_real_digits_then_eval_reads_its_accuracy"],
}
PREFIX = re.compile(r'(?:\{KUBECTL\}|\{kube\.KUBECTL\}|\{kubectl\}|\$k\b|"\$k")')
SKIP_VALUE = {"-n", "--namespace", "-l", "--selector", "-o", "--output", "--kubeconfig"}


def subcommands() -> dict[str, set[str]]:
    """kubectl subcommand -> the files that build it."""
    found: dict[str, set[str]] = {}
    for path in sorted([*ROOT.glob("gpuk8s/**/*.py"), *ROOT.glob("roles/**/*.py")]):
        text = path.read_text()
        for m in PREFIX.finditer(text):
            words = re.split(r"[ \t]+", text[m.end():m.end() + 200].split("\n", 1)[0].strip())
            i = 0
            while i < len(words) and words[i].startswith("-"):
                i += 2 if words[i] in SKIP_VALUE else 1
            if i < len(words) and re.fullmatch(r"[a-z][a-z-]+", words[i]):
                found.setdefault(words[i], set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_code_builds_kubectl_commands() -> None:
    found = subcommands()
    # the scan itself works: these are certainly built (bootstrap, drain, upgrade)
    assert {"apply", "get", "wait", "label", "drain", "uncordon", "version"} <= set(found)


def test_every_kubectl_subcommand_gpuk8s_builds_runs_in_a_lab_test() -> None:
    missing = {verb: files for verb, files in subcommands().items() if verb not in EXERCISED}
    assert not missing, f"kubectl subcommands no lab test runs with the real kubectl: {missing}"


def test_the_named_lab_tests_exist() -> None:
    for verb, tests in EXERCISED.items():
        for ref in tests:
            file, func = ref.split("::")
            text = (ROOT / "tests" / "lab" / "product" / file).read_text()
            assert re.search(rf"^def {func}\(", text, re.M), f"{verb}: {ref} does not exist"
