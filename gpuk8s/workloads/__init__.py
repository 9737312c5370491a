"""Workloads on a bootstrapped cluster: deploy, undeploy and verify.

``templates/workloads/<name>/*.yaml.j2`` are rendered with Helm-style values (the shared
``templates/workloads/values.yaml``, the workload's ``values.yaml``, then ``--values`` files, then
``--set key.sub=value``; Jinja2 StrictUndefined), every object is labelled
``app.kubernetes.io/managed-by=gpuk8s`` and ``gpuk8s.io/workload=<name>``, and the manifest is
applied with ``kubectl apply --server-side`` on the first control plane, sent in a heredoc inside
the script (never on a command line). Deploy then waits for the workload's own readiness
(Deployments available, Jobs complete, claims bound) and prints one table of its pods; a pod the
scheduler cannot place is reported with the scheduler's FailedScheduling message.

Values never add YAML: templates emit every value with ``| tojson`` (one JSON scalar, which YAML
reads as the same value), control characters are refused in every value and key, and RULES check
the values that name things (namespace, claim, NFS path, clients, options). The manifest is
applied as cluster-admin, so render() also refuses any object whose kind the workload does not
create (KINDS) and any namespaced object outside ``values.namespace``.

- values: defaults, --values/--set, checks (load_values, RULES, WorkloadError)
- rendering: templates to labelled, checked objects (render, check_objects, dump)
- cluster: kubectl through the first control plane; apply and wait (Remote, wait, pod_table)
- nfs: the storage workload's NFS export
- commands: deploy (and --render), undeploy
- verify: invoke verify (GPUs per node, with sharing, MIG, DRA and monitoring)
- dra: gpuAllocation=dra (pods claim GPUs through ResourceClaimTemplates)
"""

from __future__ import annotations

from gpuk8s.workloads.cluster import (
    KUBECTL,
    NS_KINDS,
    PodRow,
    Remote,
    WaitResult,
    open_control_plane,
    pod_table,
    snapshot,
    wait,
)
from gpuk8s.workloads.commands import deploy, render_manifests, undeploy
from gpuk8s.workloads.nfs import NFS_CLIENT_SCRIPT, _setup_nfs, export_line, nfs_server_script
from gpuk8s.workloads.rendering import (
    CLUSTER_SCOPED,
    KINDS,
    LABEL,
    MANAGED,
    check_objects,
    context,
    dump,
    pod_templates,
    render,
    stamp,
)
from gpuk8s.workloads.values import (
    RULES,
    WORKLOADS,
    WorkloadError,
    check_values,
    defaults,
    load_values,
    parse_set,
    workloads_dir,
)
from gpuk8s.workloads.verify import NodeCheck, gpu_nodes, verify

__all__ = [
    "CLUSTER_SCOPED", "KINDS", "KUBECTL", "LABEL", "MANAGED", "NFS_CLIENT_SCRIPT", "NS_KINDS",
    "RULES", "WORKLOADS", "NodeCheck", "PodRow", "Remote", "WaitResult", "WorkloadError",
    "_setup_nfs", "check_objects", "check_values", "context", "defaults", "deploy", "dump",
    "export_line", "gpu_nodes", "load_values", "nfs_server_script", "open_control_plane",
    "parse_set", "pod_table", "pod_templates", "render", "render_manifests", "snapshot", "stamp",
    "undeploy", "verify", "wait", "workloads_dir",
]
