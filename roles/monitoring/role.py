"""monitoring: with ``gpu_monitoring``, NVIDIA's DCGM exporter on every GPU node (in its pod's
network: no port on the nodes) and one Prometheus scraping the exporter pods, found through
their headless Service's DNS name (no API access needed), and the kubelets at the node
addresses gpuk8s knows (a static target list rendered on every run); turned off, the namespace
and its cluster roles are deleted."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpuk8s.checks import Rule, check_positive, check_xyz, matching
from gpuk8s.facts import Fact
from gpuk8s.facts.kube import Cluster
from gpuk8s.ops import Op, change, noop, sha256
from gpuk8s.ops.kube import KUBECTL, apply, rollout_wait, then_wait
from gpuk8s.roles import HostContext

NAMESPACE = "gpuk8s-monitoring"
COMPONENT = "gpu-monitoring"


#: the nvcr.io tag of dcgm-exporter without its platform tail (-distroless):
#: <DCGM>-<exporter> (RELEASE.md@4.5.3-4.8.2)
check_dcgm_version = matching(r"\d+\.\d+\.\d+-\d+\.\d+\.\d+",
                              '<DCGM>-<exporter> like "4.5.3-4.8.2" (the nvcr.io tag without '
                              '-distroless)', '"4.5.3-4.8.2"')
check_retention = matching(r"([1-9]\d*(ms|s|m|h|d|w|y))+",
                           'a Prometheus duration like "7d" or "12h"', '"7d"')


RULES: dict[str, Rule] = {
    "gpu_monitoring": Rule(cluster_wide=True),
    "dcgm_exporter_version": Rule(check_dcgm_version, cluster_wide=True),
    "prometheus_version": Rule(check_xyz, cluster_wide=True),
    "prometheus_retention": Rule(check_retention, cluster_wide=True),
    "prometheus_scrape_interval": Rule(check_positive, cluster_wide=True),
    "monitoring_ready_timeout": Rule(check_positive, cluster_wide=True),
}


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [Cluster()]


def prometheus_config(nodes: Mapping[str, Mapping[str, Any]], interval: int,
                      domain: str = "cluster.local") -> str:
    """prometheus.yml: the DCGM exporter pods (the A records of the headless dcgm-exporter
    Service: pod IPs, port 9400; each series' node label from the exporter's own Hostname
    label, its pod's spec.nodeName) and every node's kubelet, labelled with its node name
    (JSON, which is YAML: node values are data here)."""
    def targets(port: int) -> list[dict[str, Any]]:
        out = []
        for n in sorted(nodes.values(), key=lambda n: str(n["name"])):
            address = str(n["address"])
            host = f"[{address}]" if ":" in address else address
            out.append({"targets": [f"{host}:{port}"], "labels": {"node": str(n["name"])}})
        return out

    config = {
        "global": {"scrape_interval": f"{interval}s", "evaluation_interval": f"{interval}s"},
        "scrape_configs": [
            {"job_name": "dcgm-exporter",
             "dns_sd_configs": [{"names": [f"dcgm-exporter.{NAMESPACE}.svc.{domain}"],
                                 "type": "A", "port": 9400,
                                 "refresh_interval": f"{interval}s"}],
             "metric_relabel_configs": [{"source_labels": ["Hostname"],
                                         "target_label": "node"}]},
            {"job_name": "kubelet", "scheme": "https", "metrics_path": "/metrics/resource",
             "tls_config": {"insecure_skip_verify": True},
             "authorization": {"credentials_file":
                               "/var/run/secrets/kubernetes.io/serviceaccount/token"},
             "static_configs": targets(10250)},
        ],
    }
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def plan(ctx: HostContext) -> list[Op]:
    cluster = ctx.facts[Cluster()]
    ours = sorted(k for k in cluster.managed if f"/{NAMESPACE}/" in k or
                  k.endswith("/gpuk8s-prometheus"))
    if not ctx.var("gpu_monitoring"):
        if not ours:
            return [noop("monitoring | off", "= gpu_monitoring is off")]
        return [change("monitoring | remove", f"+ delete namespace {NAMESPACE} and its "
                       "cluster roles (gpu_monitoring is off)",
                       f"{KUBECTL} delete namespace {NAMESPACE} --ignore-not-found "
                       f"--timeout=120s",
                       f"{KUBECTL} delete clusterrolebinding,clusterrole gpuk8s-prometheus "
                       "--ignore-not-found")]
    config = prometheus_config(ctx.cluster["nodes"], int(ctx.var("prometheus_scrape_interval")),
                               str(ctx.var("cluster_dns_domain")))
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "prometheus-config", "namespace": NAMESPACE},
                  "data": {"prometheus.yml": config}}
    manifest = ctx.template("monitoring/gpu-monitoring.yaml.j2",
                            prometheus_config_sha256=sha256(config.encode())).decode() + \
        "---\n" + json.dumps(config_map, indent=2) + "\n"
    op = apply(cluster, "monitoring | DCGM exporter and Prometheus", COMPONENT, manifest)
    if not op.changes:
        return [op]
    timeout = int(ctx.var("monitoring_ready_timeout"))
    # the pod selectors are the templates' matchLabels
    wait = rollout_wait(((NAMESPACE, "deployment/prometheus", "app.kubernetes.io/name=prometheus"),
                         (NAMESPACE, "daemonset/dcgm-exporter",
                          "app.kubernetes.io/name=dcgm-exporter")), timeout)
    return [then_wait(op, "Prometheus and every exporter are ready", wait, 2 * timeout + 60)]
