"""The workload commands: deploy (and --render), undeploy and verify."""

from __future__ import annotations

import base64
import binascii
import json
import secrets
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gpuk8s.workloads.hub as hub
from gpuk8s.errors import Gpuk8sError
from gpuk8s.inventory import load_inventory
from gpuk8s.lockfile import lock_path, pinned_image, read_image_pins
from gpuk8s.ops import Op
from gpuk8s.report import Reporter, untrusted
from gpuk8s.session import DEFAULT_OPENER, Opener, Session
from gpuk8s.sinks import shell
from gpuk8s.workloads.cluster import (
    KUBECTL,
    NS_KINDS,
    Remote,
    WaitResult,
    _control_plane,
    open_control_plane,
    pod_table,
    progress_printer,
    wait,
)
from gpuk8s.workloads.nfs import _setup_nfs
from gpuk8s.workloads.rendering import LABEL, MANAGED, check_objects, dump, render, stamp
from gpuk8s.workloads.values import WorkloadError, load_values


# -- deploy / undeploy --------------------------------------------------------------------------
def _prechecks(remote: Remote, name: str, values: Mapping[str, Any]) -> dict[str, str]:
    """Fail with a clear message on a missing claim, storage class or CRD; return the
    existing notebook token if any (already registered with the redactor)."""
    ns = values["namespace"]
    checks: dict[str, str] = {}
    found: dict[str, str] = {}
    if name != "storage" and values["storage"]["enabled"]:
        claim = shell(values["storage"]["claimName"])
        checks["pvc"] = (f"$k get persistentvolumeclaim {claim} -n {shell(ns)} "
                         "-o jsonpath='{.status.phase}'")
    if name == "storage" and values["storageClassName"]:
        checks["sc"] = f"$k get storageclass {shell(values['storageClassName'])} -o name"
    if name == "distributed-tf" and values["tfjob"]:
        checks["crd"] = "$k get customresourcedefinition tfjobs.kubeflow.org -o name"
    if name == "jupyter":
        token = _existing_token(remote, values)
        if token:
            found["token"] = token
    if not checks:
        return found
    res = remote.probe(checks)
    if "pvc" in res:
        rc, out = res["pvc"]
        claim = f"{ns}/{values['storage']['claimName']}"
        if rc != 0 and "NotFound" in out:
            raise WorkloadError(
                f"PersistentVolumeClaim {claim} does not exist: deploy the shared volume first "
                f"(invoke deploy storage), name an existing claim with --set "
                f"storage.claimName=NAME, or run without it (--set storage.enabled=false)")
        if rc != 0:
            raise WorkloadError(f"cannot read PersistentVolumeClaim {claim}: {out.strip()}")
        if out.strip() != "Bound":
            remote.session.reporter.print(
                f"  ! PersistentVolumeClaim {claim} is {out.strip() or 'Pending'}, not Bound: "
                "pods that mount it wait until it is", style="magenta")
    if "sc" in res and res["sc"][0] != 0:
        raise WorkloadError(f"StorageClass {values['storageClassName']!r} does not exist "
                            f"(kubectl get storageclass lists them); leave storageClassName "
                            f"empty for gpuk8s' NFS volume")
    if "crd" in res and res["crd"][0] != 0:
        raise WorkloadError("tfjob: true needs the Kubeflow training operator (CRD "
                            "tfjobs.kubeflow.org is not installed); the default Indexed Job "
                            "form needs no operator")
    return found


def _existing_token(remote: Remote, values: Mapping[str, Any]) -> str | None:
    """The notebook token kept in an existing Secret (a redeploy reuses it), or None.

    The Secret is read by an op marked secret, so its output (the token's base64) is never
    logged, and the token, raw and base64, is registered with the redactor before anything
    can print it. A Secret whose data is not base64 of a text token is a WorkloadError."""
    ns, secret_name = values["namespace"], values["tokenSecret"]
    op = Op("workload | token", (f'set +e\nk="{KUBECTL}"\n$k get secret {shell(secret_name)} '
                                 f"-n {shell(ns)} -o jsonpath='{{.data.token}}'",),
            f"? the notebook token in Secret {ns}/{secret_name}", timeout=120, secret=True)
    rc, out = remote.session.runner(remote.host).run_now([op], keep_going=True)[0]
    encoded = "".join(out.split()) if rc == 0 else ""
    if not encoded:
        return None  # no Secret yet (or no token in it): deploy makes one
    redact = remote.session.redact
    redact.add(encoded)
    try:
        token = base64.b64decode(encoded, validate=True).decode("utf-8").strip()
    except (binascii.Error, UnicodeDecodeError):
        token = ""
    if not token or any(c.isspace() or not c.isprintable() for c in token):
        raise WorkloadError(
            f"Secret {ns}/{secret_name} holds no usable notebook token: its data.token is not "
            "the base64 of a one-line text token; fix: delete it (kubectl -n "
            f"{shell(ns)} delete secret {shell(secret_name)}) and deploy again, which makes "
            "a new token, or put a token there (kubectl -n "
            f"{shell(ns)} create secret generic {shell(secret_name)} --from-literal=token=...)")
    redact.add(token, base64.b64encode(token.encode()).decode())
    return token


def _notebook_token(remote: Remote, values: Mapping[str, Any], existing: str | None
                    ) -> tuple[str, dict[str, Any] | None]:
    """Reuse the Secret's token (already registered with the redactor), or generate one
    locally and register it."""
    if existing:
        return existing, None
    token = secrets.token_hex(24)
    remote.session.redact.add(token, base64.b64encode(token.encode()).decode())
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
              "metadata": {"name": values["tokenSecret"], "namespace": values["namespace"]},
              "stringData": {"token": token}}
    return token, secret


def _namespace_doc(namespace: str) -> dict[str, Any]:
    # shared by every workload: labelled managed-by only, so undeploy never removes it
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {MANAGED: "gpuk8s"}}}


def _delete_script(namespace: str, selector: str, kinds: str, wait_s: int) -> str:
    ns, sel = shell(namespace), shell(selector)
    return (f'k="{KUBECTL}"\n'
            f"$k delete {kinds} -n {ns} -l {sel} --ignore-not-found --wait=false\n"
            f"i=0; while [ $i -lt {wait_s} ]; do\n"
            f"  left=$($k get {kinds},pods -n {ns} -l {sel} -o name 2>/dev/null)\n"
            f'  [ -z "$left" ] && exit 0; sleep 1; i=$((i+1)); done\n'
            f'echo "still present after {wait_s}s: $left"; exit 1\n')


def render_manifests(inventory: str | Path, name: str, *, values_files: Sequence[str] = (),
                     sets: Sequence[str] = ()) -> str:
    """The manifests ``deploy`` would apply (after values files and --set), as YAML documents,
    as ``helm template`` shows them. No host is contacted: the inventory is only read, for the
    control plane's address that the storage workload's NFS volume names. Jupyter's token
    Secret is made at deploy time and is not shown."""
    values = load_values(name, values_files, sets)
    extra: dict[str, Any] = {}
    if name == "storage" and not values["nfs"]["server"] and not values["storageClassName"]:
        inv = load_inventory(inventory)
        cp = _control_plane(inventory)
        extra["nfs_server"] = next(h.address for h in inv.control_planes if h.name == cp)
    outside: list[dict[str, Any]] = []
    if name == "jupyterhub":
        prepared = hub.offline(values, load_inventory(inventory))
        extra.update(prepared.context)
        outside = prepared.outside
    docs = pin_images(render(name, values, **extra), inventory)
    head = f"# gpuk8s deploy {name} --render: what deploy would apply (no host was contacted)\n"
    if name == "jupyter":
        head += f"# (plus Secret {values['tokenSecret']}, made at deploy time)\n"
    if name == "jupyterhub":
        head += ("# (plus Secrets hub and proxy-public-tls, made on the control plane at deploy "
                 "time; profiles\n# list only what the nodes offer, which deploy reads from the "
                 "cluster: none here)\n")
    return head + "---\n" + dump([_namespace_doc(values["namespace"]), *docs, *outside])


def pin_images(docs: list[dict[str, Any]], inventory: str | Path,
               reporter: Reporter | None = None) -> list[dict[str, Any]]:
    """With a lock beside the inventory, every container image it names is pulled by the
    digest it pins (``image:tag@sha256:...``); an image it does not name is said once."""
    path = lock_path(inventory)
    if not path.is_file():
        return docs
    pins = read_image_pins(path)
    loose: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("containers", "initContainers") and isinstance(value, list):
                    for c in value:
                        if isinstance(c, dict) and isinstance(c.get("image"), str):
                            c["image"] = pinned_image(c["image"], pins)
                            if "@" not in c["image"] and c["image"] not in loose:
                                loose.append(c["image"])
                else:
                    visit(value)
        elif isinstance(node, list):
            for item in node:
                visit(item)

    for doc in docs:
        visit(doc)
    if reporter is not None:
        reporter.print(f"  images pulled by the digests {path.name} pins"
                       + (f"; not in it (pulled by tag; add the workload to lock_workloads "
                          f"and lock again): {', '.join(loose)}" if loose else ""))
    return docs


def deploy(inventory: str | Path, name: str, *, values_files: Sequence[str] = (),
           sets: Sequence[str] = (), reporter: Reporter | None = None,
           timeout: float = 600, pending_grace: float = 20,
           show_secret: bool | None = None, render_only: bool = False,
           opener: Opener = DEFAULT_OPENER) -> dict[str, Any]:
    """Render, apply and wait for one workload; print its pods; raise WorkloadError when it is
    not ready (unschedulable pods are named with the scheduler's reason). With ``render_only``
    (``--render``) print the manifests deploy would apply and contact no host."""
    if render_only:
        sys.stdout.write(render_manifests(inventory, name, values_files=values_files,
                                          sets=sets))
        sys.stdout.flush()
        return {"workload": name, "rendered": True}
    values = load_values(name, values_files, sets)
    render(name, values)   # fail on a bad value before any host is contacted
    needs_all = name == "storage" and not values["nfs"]["server"] and \
        not values["storageClassName"]
    session = open_control_plane(inventory, f"deploy-{name}", reporter, all_hosts=needs_all,
                                 opener=opener)
    rep, remote = session.reporter, Remote(session)
    ns = values["namespace"]
    started = time.monotonic()
    try:
        rep.phase(f"deploy {name} (namespace {ns}, through {session.first_cp})")
        found = _prechecks(remote, name, values)
        extra: dict[str, Any] = {}
        if needs_all:
            extra["nfs_server"] = _setup_nfs(session, values)
        elif name == "storage" and not values["storageClassName"]:
            rep.print(f"  using the existing NFS export {values['nfs']['server']}:"
                      f"{values['nfs']['path']}")
        prepared = hub.prepare(session, remote, values) if name == "jupyterhub" else None
        if prepared:
            extra.update(prepared.context)
        docs = pin_images(render(name, values, **extra), inventory, rep)
        token = None
        if name == "jupyter":
            token, secret = _notebook_token(remote, values, found.get("token"))
            if secret:
                docs.append(stamp(secret, name))
        check_objects(name, docs, ns)
        selector = f"{LABEL}={name}"
        if any(d["kind"] in ("Job", "TFJob") for d in docs):
            # a Job's pod template is immutable: running it again means a new Job
            res = remote.run(_delete_script(ns, selector, "jobs", 120), timeout=180)
            if not res.ok:
                raise WorkloadError(f"cannot remove the previous {name} Job: "
                                    + session.redact(res.stdout.strip()[-300:]))
        out = remote.apply([_namespace_doc(ns), *docs, *(prepared.outside if prepared else [])])
        for line in out.splitlines():
            rep.print(f"  {line}", style="dim")
        result = wait(remote, ns, selector, timeout, pending_grace, progress_printer(rep))
        pod_table(rep, f"{name}: pods", result)
        results = _job_results(session, remote, ns, result) if any(
            k.startswith("Job/") for k in result.objects) else {}
        summary: dict[str, Any] = {
            "workload": name, "ready": result.ready, "problems": result.problems,
            "objects": result.objects,
            "pods": [{"name": p.name, "node": p.node, "phase": p.phase, "gpus": p.gpus,
                      "detail": p.detail} for p in result.pods],
            "results": results, "run_dir": str(session.runlog.path)}
        session.runlog.write_report(**{k: v for k, v in summary.items() if k != "run_dir"},
                                    wall_time=round(time.monotonic() - started, 3))
        if not result.ready:
            raise WorkloadError(f"{name} is not ready:\n  " + "\n  ".join(
                session.redact(p) for p in result.problems))
        if prepared:
            hub.print_access(session, values, prepared)
        for svc in ([] if prepared else result.services):
            _print_service(session, svc, result, token, show_secret,
                           token_secret=values.get("tokenSecret", "jupyter-token"))
        # two lines: a run folder's path is long, and a line of the default view fits 80
        rep.print(f"{name} ready ({time.monotonic() - started:.1f}s)", style="green")
        rep.print(f"  run folder: {session.runlog.path}", style="dim")
        return summary
    except Gpuk8sError as exc:
        session.runlog.write_report(workload=name, error=session.redact(str(exc)))
        raise
    finally:
        for t in session.transports.values():
            t.close()


def _job_results(session: Session, remote: Remote, ns: str, result: WaitResult
                 ) -> dict[str, dict[str, Any]]:
    """What the Job's finished pods said: the workload scripts end with one JSON line of
    results (accuracy, checkpoint, data), printed here and returned per pod; a failed pod's
    last log lines are printed instead, so the reason is on screen."""
    done = [p for p in result.pods if p.phase in ("Succeeded", "Failed")]
    if not done:
        return {}
    logs = remote.probe({p.name: f"$k logs {shell(p.name)} -n {shell(ns)} --tail=200"
                         for p in done})
    out: dict[str, dict[str, Any]] = {}
    for p in done:
        rc, text = logs.get(p.name, (1, ""))
        lines = [ln for ln in text.splitlines() if ln.strip()]
        parsed = [_json_line(ln) for ln in lines]
        last = next((d for d in reversed(parsed) if d), None)
        if p.phase == "Succeeded" and last is not None:
            out[p.name] = last
            shown = ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                              for k, v in last.items())
            session.reporter.print(f"  {p.name}: " + session.redact(shown))
        elif p.phase == "Failed" and rc == 0:
            session.reporter.print(f"  {p.name} failed; the end of its log:")
            for ln in lines[-10:]:
                session.reporter.print("    " + session.redact(ln), style="dim")
    return out


def _json_line(line: str) -> dict[str, Any] | None:
    if not line.startswith("{"):
        return None
    try:
        data = json.loads(line)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _print_service(session: Session, svc: Mapping[str, Any], result: WaitResult,
                   token: str | None, show_secret: bool | None, *,
                   token_secret: str = "jupyter-token") -> None:
    spec = svc.get("spec", {})
    name = svc.get("metadata", {}).get("name", "")
    ports = spec.get("ports") or []
    if spec.get("type") != "NodePort" or not ports or not ports[0].get("nodePort"):
        session.reporter.print(f"  service {name}: {spec.get('clusterIP', '')}:"
                               f"{ports[0].get('port') if ports else ''} (inside the cluster)")
        if not ports:
            return
        # not on the network (security review 2, L5): through the API server to this machine
        port = ports[0].get("port")
        # two lines: the command stays whole (copy-pastable) within 80 columns
        session.reporter.print("  open it from your machine (runs until Ctrl-C):")
        session.reporter.print(f"    kubectl -n {svc['metadata'].get('namespace')} "
                               f"port-forward service/{name} {port}:{port}")
        url = f"http://127.0.0.1:{port}/"
    else:
        ip = next((p.host_ip for p in result.pods if p.host_ip), "") or \
            session.host(session.first_cp).address
        url = f"http://{ip}:{ports[0]['nodePort']}/"
    if token is None:
        session.reporter.print(f"  {name}: {url}")
        return
    console = session.reporter.console
    if show_secret is None:
        show_secret = console.is_terminal
    if show_secret:
        # the one deliberate appearance of the token: on the terminal only, never in the run
        # folder (its logs and report.json go through the redactor)
        console.print(untrusted(f"  {name}: {url}?token={token}"), markup=False,
                      highlight=False)
        console.print(untrusted("  (the token is shown this once; it is kept in the Secret "
                                f"{svc['metadata'].get('namespace')}/{token_secret})"),
                      style="dim", markup=False)
    else:
        ns = svc["metadata"].get("namespace")
        session.reporter.print(
            f"  {name}: {url}?token=<redacted> (output is not a terminal; read the token with "
            f"kubectl -n {shell(str(ns))} get secret {shell(token_secret)} -o "
            "jsonpath='{.data.token}' | base64 -d)")


def undeploy(inventory: str | Path, name: str, *, values_files: Sequence[str] = (),
             sets: Sequence[str] = (), reporter: Reporter | None = None, timeout: int = 180,
             purge: bool = False, opener: Opener = DEFAULT_OPENER
             ) -> dict[str, Any]:
    """Delete every object labelled gpuk8s.io/workload=<name> (the NFS export stays). For
    jupyterhub the users' homes and the hub's database stay unless ``purge``."""
    values = load_values(name, values_files, sets)
    if purge and name != "jupyterhub":
        raise WorkloadError(f"--purge is for jupyterhub (its users' homes); undeploy {name} "
                            "never deletes data")
    session = open_control_plane(inventory, f"undeploy-{name}", reporter, opener=opener)
    rep, remote = session.reporter, Remote(session)
    ns, selector = values["namespace"], f"{LABEL}={name}"
    try:
        rep.phase(f"undeploy {name} (namespace {ns})")
        if name == "jupyterhub":
            deleted = hub.undeploy(session, remote, values, purge=purge, timeout=timeout)
            rep.print(f"{name} removed ({deleted} object(s) deleted)", style="green")
            session.runlog.write_report(workload=name, deleted=deleted, purge=purge)
            return {"workload": name, "deleted": deleted, "run_dir": str(session.runlog.path)}
        kinds = NS_KINDS
        if name == "distributed-tf":
            has_crd = remote.probe({"crd": "$k get customresourcedefinition "
                                           "tfjobs.kubeflow.org -o name"})["crd"][0] == 0
            kinds += ",tfjobs.kubeflow.org" if has_crd else ""
        # a workload deployed with gpuAllocation=dra has ResourceClaimTemplates (clusters
        # that serve resource.k8s.io only)
        has_dra = remote.probe({"dra": "$k api-resources --api-group=resource.k8s.io "
                                       "-o name"})["dra"][1]
        kinds += ",resourceclaimtemplates.resource.k8s.io" if "resourceclaimtemplates" in \
            has_dra else ""
        res = remote.run(_delete_script(ns, selector, kinds, timeout), timeout=timeout + 60)
        if name == "storage" and res.ok:
            res = remote.run(f"{KUBECTL} delete persistentvolumes -l {shell(selector)} "
                             "--ignore-not-found", timeout=120)
        for line in res.stdout.splitlines():
            rep.print(f"  {line}", style="dim")
        if not res.ok:
            raise WorkloadError(f"undeploy {name} failed: "
                                + session.redact(res.stdout.strip()[-500:]))
        left = remote.probe({"left": f"$k get {kinds},pods -n {shell(ns)} -l "
                                     f"{shell(selector)} -o name"})["left"][1].strip()
        if left:
            raise WorkloadError(f"undeploy {name}: still present: {left}")
        deleted = sum(1 for ln in res.stdout.splitlines() if ln.rstrip().endswith("deleted")
                      or " deleted " in ln)
        rep.print(f"{name} removed ({deleted} object(s) deleted)", style="green")
        session.runlog.write_report(workload=name, deleted=deleted)
        return {"workload": name, "deleted": deleted, "run_dir": str(session.runlog.path)}
    finally:
        for t in session.transports.values():
            t.close()


# -- verify -------------------------------------------------------------------------------------
