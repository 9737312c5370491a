"""An inventory shared with other playbooks, on the built-in lab (issue 16): a DeepOps-style
Slurm login node that is not booted, kubespray's names and other playbooks' variables. gpuk8s
bootstraps the cluster, reads kubespray's settings, ignores the rest with a warning and never
connects to the login node (its address answers nothing: one attempt would fail the run)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from gpuk8s import api
from gpuk8s.report import Reporter
from tests.lab.lab import Lab
from tests.lab.product.test_bootstrap import GATES
from tests.lab.product.test_day2 import restore_bootstrapped

pytestmark = pytest.mark.lab


@pytest.mark.smoke  # scripts/test --quick: the snapshot boots back and a bootstrap is a no-op
def test_a_host_outside_the_cluster_is_never_contacted(lab: Lab, tmp_path: Path) -> None:
    cluster = restore_bootstrapped(lab)
    data = yaml.safe_load(cluster.inventory_path.read_text())
    data["all"]["vars"]["feature_gates"] = yaml.safe_load(GATES.split("=", 1)[1])
    data["all"]["vars"].update({"kube_network_plugin": "flannel", "ntp_servers": ["pool.ntp.org"],
                                "slurm_version": "24.05"})
    data["all"]["children"]["slurm-node"] = {"hosts": {"login01": {
        "ansible_host": "10.88.0.99", "ip": "10.88.0.99"}}}
    inv = tmp_path / "shared.yaml"
    inv.write_text(yaml.safe_dump(data, sort_keys=False))
    out = io.StringIO()
    api.bootstrap(inv, yes=True, reporter=Reporter(out))
    text = out.getvalue()
    assert "skipping login01: in neither control_plane nor workers" in text
    assert "3 variables gpuk8s does not use (ignored): ip, ntp_servers, slurm_version" in text
    assert "no changes" in text  # kube_network_plugin: flannel is the cluster's cni already
