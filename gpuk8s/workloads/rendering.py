"""Rendering: the workload's templates with its values, every object stamped with gpuk8s's
labels, and checked against the kinds and namespace the workload may create."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import yaml

from gpuk8s.ops.kube import MANAGED_BY, label
from gpuk8s.workloads.dra import TEMPLATE, use_claims
from gpuk8s.workloads.values import WorkloadError, _namespace_problem, workloads_dir

LABEL = "gpuk8s.io/workload"


MANAGED = MANAGED_BY


#: per workload, the (apiVersion, kind) of every object its templates legitimately render; any
#: other object is refused before anything is applied (objects are applied as cluster-admin).
#: Every namespaced kind here is one undeploy deletes (NS_KINDS, plus TFJobs for distributed-tf).
KINDS: dict[str, frozenset[tuple[str, str]]] = {
    "storage": frozenset({("v1", "PersistentVolume"), ("v1", "PersistentVolumeClaim")}),
    # the Secret is the notebook token deploy adds (never a template)
    "jupyter": frozenset({("v1", "ConfigMap"), ("apps/v1", "Deployment"), ("v1", "Service"),
                          ("v1", "Secret")}),
    # its ClusterRole, users' RoleBindings and volumes: gpuk8s.workloads.hub (check_outside)
    "jupyterhub": frozenset({("v1", "ServiceAccount"), ("v1", "ConfigMap"),
                             ("v1", "PersistentVolumeClaim"), ("apps/v1", "Deployment"),
                             ("v1", "Service")}),
    "tensorflow-job": frozenset({("v1", "ConfigMap"), ("batch/v1", "Job")}),
    "distributed-tf": frozenset({("v1", "ConfigMap"), ("v1", "Service"), ("batch/v1", "Job"),
                                 ("kubeflow.org/v1", "TFJob")}),
    "tensorboard": frozenset({("apps/v1", "Deployment"), ("v1", "Service")}),
    "eval": frozenset({("v1", "ConfigMap"), ("batch/v1", "Job")}),
    "verify": frozenset({("batch/v1", "Job")}),
}


#: kinds in KINDS without a namespace; every other object must be in values.namespace
CLUSTER_SCOPED = frozenset({"PersistentVolume"})


# -- rendering ----------------------------------------------------------------------------------
def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(workloads_dir())),
                              undefined=jinja2.StrictUndefined, trim_blocks=True,
                              lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)


def _prune(obj: Any) -> Any:
    """Drop keys whose value is null or an empty list (lists emptied by disabled options)."""
    if isinstance(obj, dict):
        return {k: _prune(v) for k, v in obj.items() if v is not None and v != []}
    if isinstance(obj, list):
        return [_prune(v) for v in obj]
    return obj


def pod_templates(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec") or {}
    if "template" in spec:
        return [spec["template"]]
    return [r["template"] for r in (spec.get("tfReplicaSpecs") or {}).values()]


def stamp(doc: dict[str, Any], name: str) -> dict[str, Any]:
    """Label an object and its pod templates as this workload's."""
    return label(doc, {MANAGED: "gpuk8s", LABEL: name}, pod_templates(doc))


def context(name: str, values: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    ctx: dict[str, Any] = {**values, "workload": name}
    ctx["train_script"] = (workloads_dir() / "_train.py.j2").read_text()
    if name == "jupyter":
        ctx["starter_notebook"] = (workloads_dir() / "jupyter" / "gpus.ipynb").read_text()
    if name == "jupyterhub":
        # what gpuk8s.workloads.hub computes at deploy (from the inventory and the cluster)
        ctx.update({"hub_config_py": "", "hub_settings": "{}", "hub_config_digest": "",
                    "tls_secret": values["https"]["secret"] or "proxy-public-tls",
                    "hub_db_volume": "jupyterhub-hub-db"})
    if name == "storage":
        own = extra.pop("nfs_server", "CONTROL_PLANE")   # the first control plane's address
        ctx["nfs_server"] = values["nfs"]["server"] or own
    ctx.update(extra)
    return ctx


def render(name: str, values: Mapping[str, Any], **extra: Any) -> list[dict[str, Any]]:
    """The workload's objects, labelled; raises WorkloadError naming the template and value."""
    folder = workloads_dir() / name
    docs: list[dict[str, Any]] = []
    ctx = context(name, values, **extra)
    for path in sorted(folder.glob("*.yaml.j2")):
        rel = f"{name}/{path.name}"
        try:
            text = _env().get_template(rel).render(**ctx)
        except jinja2.UndefinedError as exc:
            raise WorkloadError(f"template {rel}: {exc.message}") from None
        except jinja2.TemplateSyntaxError as exc:
            raise WorkloadError(f"template {rel}:{exc.lineno}: {exc.message}") from None
        try:
            loaded = [d for d in yaml.safe_load_all(text) if d]
        except yaml.YAMLError as exc:
            raise WorkloadError(f"template {rel} rendered invalid YAML with these values: "
                                f"{exc}") from None
        docs += [_prune(d) for d in loaded]
    if not docs:
        raise WorkloadError(f"workload {name} rendered no objects")
    specs = [t.setdefault("spec", {}) for d in docs for t in pod_templates(d)] + \
        [d["spec"] for d in docs if d.get("kind") == "Pod" and "spec" in d]
    docs = [stamp(d, name) for d in use_claims(name, docs, specs, values)]
    check_objects(name, docs, values["namespace"])
    return docs


def check_objects(name: str, docs: Sequence[Mapping[str, Any]], namespace: str) -> None:
    """Refuse any object workload ``name`` does not legitimately create (KINDS), and any
    namespaced object outside ``namespace``: the manifest is applied with admin.conf."""
    problem = _namespace_problem(namespace)
    if problem:
        raise WorkloadError(f"workload {name}: namespace {namespace!r} is refused: {problem}")
    allowed = KINDS.get(name, frozenset()) | {TEMPLATE}
    for doc in docs:
        api, kind = doc.get("apiVersion"), doc.get("kind")
        meta: Mapping[str, Any] = doc.get("metadata") or {}
        what = f"{kind}/{meta.get('name')} ({api})"
        if (api, kind) not in allowed:
            kinds = ", ".join(f"{k} ({a})" for a, k in sorted(allowed, key=lambda x: x[1]))
            raise WorkloadError(
                f"workload {name}: refused to apply {what}: {name} only creates "
                f"{kinds or 'nothing'}. A template or a value added this object: check "
                f"templates/workloads/{name}/ and the values you passed")
        if kind in CLUSTER_SCOPED:
            ref = (doc.get("spec") or {}).get("claimRef") or {}
            if ref and ref.get("namespace") != namespace:
                raise WorkloadError(
                    f"workload {name}: refused to apply {what}: it is reserved for a claim in "
                    f"namespace {ref.get('namespace')!r}, not the workload's namespace "
                    f"{namespace!r} (values.namespace)")
        elif meta.get("namespace") != namespace:
            raise WorkloadError(
                f"workload {name}: refused to apply {what}: its namespace is "
                f"{meta.get('namespace')!r}, not the workload's namespace {namespace!r}; every "
                "object of a workload goes in values.namespace (--set namespace=NAME)")


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (scripts, notebooks) as literal blocks, so manifests stay readable."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(docs: Sequence[Mapping[str, Any]]) -> str:
    return yaml.dump_all(list(docs), Dumper=_Dumper, sort_keys=False, width=1000)
