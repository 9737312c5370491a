# LAB STAND-IN: not the real kubectl. Test infrastructure for gpuk8s; never shipped to users.
"""kubectl stand-in: the subset of commands gpuk8s runs, with kubectl's flags and output formats."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import Any

from . import kubeconfig
from .client import ApiError, Client, TLSError, Unreachable
from .common import age, git_version, package_version, parse_duration, ts, yaml_dump, yaml_load_all
from .resources import BUILTIN, Registry, Resource

Obj = dict[str, Any]


class CmdError(Exception):
    """Printed as-is to stderr, exit 1."""


# ------------------------------------------------------------------ output helpers
def table(rows: list[list[str]], indent: str = "", pad: int = 3) -> str:
    """text/tabwriter with padding 3, as kubectl's printers use (describe uses 2)."""
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.ljust(widths[i] + pad) if i < len(r) - 1 else c for i, c in enumerate(r)]
        out.append(indent + "".join(cells))
    return "\n".join(out) + "\n"


def _jp_tokens(path: str) -> list[str]:
    toks, buf, i = [], "", 0
    while i < len(path):
        ch = path[i]
        if ch == "\\" and i + 1 < len(path):
            buf += path[i + 1]
            i += 2
            continue
        if ch == ".":
            if buf:
                toks.append(buf)
            buf = ""
        elif ch == "[":
            if buf:
                toks.append(buf)
            j = path.index("]", i)
            toks.append(path[i:j + 1])
            buf, i = "", j
        else:
            buf += ch
        i += 1
    if buf:
        toks.append(buf)
    return toks


def jp_eval(path: str, data: Any) -> list[Any]:
    cur = [data]
    for tok in _jp_tokens(path.strip()):
        nxt: list[Any] = []
        for c in cur:
            if tok.startswith("[?("):
                m = re.match(r"\[\?\(@\.([\w.]+)\s*==\s*['\"](.*)['\"]\)\]", tok)
                if m and isinstance(c, list):
                    nxt += [e for e in c if str(jp_eval(m.group(1), e)[:1] and
                                                jp_eval(m.group(1), e)[0]) == m.group(2)]
            elif tok == "[*]":
                nxt += list(c.values()) if isinstance(c, dict) else list(c or [])
            elif tok.startswith("["):
                inner = tok[1:-1].strip("'\"")
                if isinstance(c, list) and re.fullmatch(r"-?\d+", inner):
                    idx = int(inner)
                    if -len(c) <= idx < len(c):
                        nxt.append(c[idx])
                elif isinstance(c, dict) and inner in c:
                    nxt.append(c[inner])
            elif tok == "@":
                nxt.append(c)
            elif isinstance(c, dict) and tok in c:
                nxt.append(c[tok])
        cur = nxt
    return cur


def _jp_str(v: Any) -> str:
    if isinstance(v, dict | list):
        return json.dumps(v, separators=(",", ":"))
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)


def jsonpath(template: str, data: Any) -> str:
    """kubectl -o jsonpath subset: {.a.b}, [*], [n], [?(@.k=="v")], {range}/{end}, literals."""
    parts = re.split(r"(\{[^{}]*\})", template)

    def render(seq: list[str], ctx: Any) -> str:
        out, i = "", 0
        while i < len(seq):
            p = seq[i]
            if p.startswith("{") and p.endswith("}"):
                expr = p[1:-1].strip()
                if expr.startswith("range "):
                    depth, j = 1, i + 1
                    while j < len(seq):
                        e = seq[j][1:-1].strip() if seq[j].startswith("{") else ""
                        depth += e.startswith("range ")
                        depth -= e == "end"
                        if depth == 0:
                            break
                        j += 1
                    for item in jp_eval(expr[6:].lstrip("@"), ctx):
                        out += render(seq[i + 1:j], item)
                    i = j + 1
                    continue
                if expr.startswith('"') and expr.endswith('"'):
                    out += json.loads(expr)
                else:
                    out += " ".join(_jp_str(v) for v in jp_eval(expr.lstrip("@"), ctx))
            else:
                out += p
            i += 1
        return out

    return render([p for p in parts if p], data)


def role_names(node: Obj) -> str:
    roles = sorted(k.split("/", 1)[1] for k in node["metadata"].get("labels") or {}
                   if k.startswith("node-role.kubernetes.io/"))
    return ",".join(roles) or "<none>"


def node_status(node: Obj) -> str:
    st = "Unknown"
    for c in node.get("status", {}).get("conditions") or []:
        if c.get("type") == "Ready":
            st = "Ready" if c.get("status") == "True" else "NotReady"
    if node.get("spec", {}).get("unschedulable"):
        st += ",SchedulingDisabled"
    return st


def pod_status(pod: Obj) -> str:
    st = pod.get("status", {})
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    reason = st.get("reason") or st.get("phase", "Pending")
    for cs in st.get("containerStatuses") or []:
        state = cs.get("state", {})
        if state.get("waiting", {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif state.get("terminated", {}).get("reason"):
            reason = state["terminated"]["reason"]
    if st.get("phase") == "Pending" and not st.get("containerStatuses") and \
            pod.get("spec", {}).get("nodeName"):
        reason = "ContainerCreating"
    return reason


def pod_ready_str(pod: Obj) -> str:
    cs = pod.get("status", {}).get("containerStatuses") or []
    total = len(pod.get("spec", {}).get("containers") or [])
    return f"{sum(1 for c in cs if c.get('ready'))}/{total}"


def address(node: Obj, kind: str) -> str:
    return next((a["address"] for a in node.get("status", {}).get("addresses") or []
                 if a.get("type") == kind), "<none>")


def columns(res: Resource, obj: Obj, wide: bool) -> tuple[list[str], list[str]]:
    md, st, spec = obj["metadata"], obj.get("status", {}), obj.get("spec", {})
    a = age(md.get("creationTimestamp"))
    p = res.plural
    if p == "nodes":
        info = st.get("nodeInfo", {})
        h = ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
        v = [md["name"], node_status(obj), role_names(obj), a, info.get("kubeletVersion", "")]
        if wide:
            h += ["INTERNAL-IP", "EXTERNAL-IP", "OS-IMAGE", "KERNEL-VERSION", "CONTAINER-RUNTIME"]
            v += [address(obj, "InternalIP"), address(obj, "ExternalIP"),
                  info.get("osImage", ""), info.get("kernelVersion", ""),
                  info.get("containerRuntimeVersion", "")]
        return h, v
    if p == "pods":
        restarts = sum(c.get("restartCount", 0) for c in st.get("containerStatuses") or [])
        h = ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
        v = [md["name"], pod_ready_str(obj), pod_status(obj), str(restarts), a]
        if wide:
            h += ["IP", "NODE", "NOMINATED NODE", "READINESS GATES"]
            v += [st.get("podIP", "<none>"), spec.get("nodeName", "<none>"), "<none>", "<none>"]
        return h, v
    if p == "daemonsets":
        sel = ",".join(f"{k}={v}" for k, v in (spec.get("template", {}).get("spec", {})
                                                .get("nodeSelector") or {}).items()) or "<none>"
        return (["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE",
                 "NODE SELECTOR", "AGE"],
                [md["name"], *(str(st.get(k, 0)) for k in (
                    "desiredNumberScheduled", "currentNumberScheduled", "numberReady",
                    "updatedNumberScheduled", "numberAvailable")), sel, a])
    if p == "deployments":
        return (["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"],
                [md["name"], f"{st.get('readyReplicas', 0)}/{spec.get('replicas', 1)}",
                 str(st.get("updatedReplicas", 0)), str(st.get("availableReplicas", 0)), a])
    if p == "jobs":
        conds = {c["type"]: c["status"] for c in st.get("conditions") or []}
        status = "Complete" if conds.get("Complete") == "True" else (
            "Failed" if conds.get("Failed") == "True" else "Running")
        return (["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"],
                [md["name"], status, f"{st.get('succeeded', 0)}/{spec.get('completions', 1)}",
                 age(st.get("startTime")) if st.get("startTime") else "", a])
    if p == "namespaces":
        return ["NAME", "STATUS", "AGE"], [md["name"], st.get("phase", "Active"), a]
    if p == "services":
        ports = ",".join(f"{x.get('port')}/{x.get('protocol', 'TCP')}"
                         for x in spec.get("ports") or []) or "<none>"
        return (["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"],
                [md["name"], spec.get("type", "ClusterIP"), spec.get("clusterIP", ""), "<none>",
                 ports, a])
    if p == "configmaps":
        return ["NAME", "DATA", "AGE"], [md["name"], str(len(obj.get("data") or {})), a]
    if p == "secrets":
        return (["NAME", "TYPE", "DATA", "AGE"],
                [md["name"], obj.get("type", "Opaque"), str(len(obj.get("data") or {})), a])
    if p == "runtimeclasses":
        return ["NAME", "HANDLER", "AGE"], [md["name"], obj.get("handler", ""), a]
    if p == "events":
        return (["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
                [age(obj.get("lastTimestamp")), obj.get("type", ""), obj.get("reason", ""),
                 f"{obj.get('involvedObject', {}).get('kind', '').lower()}/"
                 f"{obj.get('involvedObject', {}).get('name', '')}", obj.get("message", "")])
    return ["NAME", "AGE"], [md["name"], a]


# ------------------------------------------------------------------ the CLI
class Kubectl:
    def __init__(self, args: argparse.Namespace, version: str) -> None:
        self.args = args
        self.version = version
        self._client: Client | None = None
        self.registry = Registry(list(BUILTIN))
        self._gv_cache: dict[str, list[Obj] | None] = {}
        self.default_ns = "default"

    @property
    def client(self) -> Client:
        if self._client is None:
            path = self.args.kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser(
                "~/.kube/config")
            path = path.split(os.pathsep)[0]
            if not os.path.exists(path):
                raise Unreachable("localhost:8080", "no kubeconfig", True)
            try:
                creds = kubeconfig.load(path, self.args.context)
            except (ValueError, KeyError, StopIteration) as e:
                raise CmdError(f"error: {e}") from e
            if self.args.server:
                creds.server = self.args.server
            self._client = Client(creds, timeout=self._req_timeout())
        return self._client

    def _req_timeout(self) -> float:
        t = self.args.request_timeout
        if t and t != "0":
            return parse_duration(t if not t.isdigit() else t + "s")
        return 32.0

    @property
    def ns(self) -> str:
        return self.args.namespace or self.default_ns

    # -- resource mapping through discovery (like kubectl's RESTMapper)
    def gv_resources(self, api_version: str) -> list[Obj] | None:
        if api_version not in self._gv_cache:
            path = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
            try:
                self._gv_cache[api_version] = self.client.get(path).get("resources", [])
            except ApiError as e:
                if e.code != 404:
                    raise
                self._gv_cache[api_version] = None
        return self._gv_cache[api_version]

    def mapping(self, api_version: str, kind: str) -> Resource | None:
        for r in self.gv_resources(api_version) or []:
            if r.get("kind") == kind and "/" not in r["name"]:
                group, _, version = api_version.rpartition("/")
                return Resource(group, version, kind, r["name"], r["namespaced"],
                                tuple(r.get("shortNames") or ()))
        return None

    def resolve(self, name: str) -> Resource:
        r = self.registry.lookup(name)
        if r is not None:
            return r
        for g in self.client.get("/apis").get("groups", []):
            for gv in g.get("versions", [])[:1]:
                for rr in self.gv_resources(gv["groupVersion"]) or []:
                    self.registry.add(Resource(g["name"], gv["version"], rr["kind"], rr["name"],
                                               rr["namespaced"], tuple(rr.get("shortNames") or
                                                                       ())))
        r = self.registry.lookup(name)
        if r is None:
            kind = name.split(".")[0]
            raise CmdError(f'error: the server doesn\'t have a resource type "{kind}"')
        return r

    @staticmethod
    def kind_name(res: Resource) -> str:
        return f"{res.singular}.{res.group}" if res.group else res.singular

    def path(self, res: Resource, name: str = "", ns: str | None = None) -> str:
        p = res.base_path(ns if ns is not None else self.ns)
        return f"{p}/{name}" if name else p

    # -- output
    def emit(self, res: Resource | None, objs: list[Obj], single: bool) -> None:
        o = self.args.output or ""
        if o in ("json", "yaml"):
            data: Any = objs[0] if single else {"apiVersion": "v1", "items": objs, "kind": "List",
                                                "metadata": {"resourceVersion": ""}}
            sys.stdout.write(json.dumps(data, indent=4) + "\n" if o == "json" else
                             yaml_dump(data))
        elif o == "name":
            for obj in objs:
                r = res or self.registry.by_kind(obj.get("apiVersion", ""), obj.get("kind", ""))
                sys.stdout.write(f"{self.kind_name(r) if r else obj.get('kind', '').lower()}/"
                                 f"{obj['metadata']['name']}\n")
        elif o.startswith("jsonpath="):
            data = objs[0] if single else {"apiVersion": "v1", "items": objs, "kind": "List"}
            sys.stdout.write(jsonpath(o[len("jsonpath="):].strip("'"), data))
        elif o.startswith("custom-columns="):
            specs = [c.split(":", 1) for c in o[len("custom-columns="):].split(",")]
            rows = [[h for h, _ in specs]]
            for obj in objs:
                rows.append([" ".join(_jp_str(v) for v in jp_eval(p.strip("{}").lstrip("."),
                                                                  obj)) or "<none>"
                             for _, p in specs])
            sys.stdout.write(table(rows[1:] if self.args.no_headers else rows))
        elif o in ("", "wide"):
            assert res is not None
            rows: list[list[str]] = []
            for obj in objs:
                h, v = columns(res, obj, o == "wide")
                if self.args.all_namespaces and res.namespaced:
                    h, v = ["NAMESPACE", *h], [obj["metadata"].get("namespace", ""), *v]
                if not rows:
                    rows.append(h)
                rows.append(v)
            sys.stdout.write(table(rows[1:] if self.args.no_headers else rows))
        else:
            raise CmdError(f"error: unable to match a printer suitable for the output format "
                           f'"{o}", allowed formats are: custom-columns,custom-columns-file,'
                           "go-template,go-template-file,json,jsonpath,jsonpath-as-json,"
                           "jsonpath-file,name,template,templatefile,wide,yaml")

    # -- commands
    def cmd_get(self) -> None:
        a = self.args
        if a.raw:
            sys.stdout.buffer.write(self.client.get(a.raw, raw=True))
            return
        if not a.args:
            raise CmdError("You must specify the type of resource to get. Use \"kubectl "
                           "api-resources\" for a complete list of supported resources.\n\n"
                           "error: Required resource not specified.")
        targets: list[tuple[str, list[str]]] = []
        if "/" in a.args[0]:
            for t in a.args:
                kind, _, name = t.partition("/")
                targets.append((kind, [name]))
        else:
            for kind in a.args[0].split(","):
                targets.append((kind, a.args[1:]))
        failed = False
        # like the real kubectl, several types with a structured output make ONE List
        structured = (a.output or "").split("=")[0] in ("json", "yaml", "jsonpath")
        combine = structured and len(targets) > 1
        combined: list[Obj] = []
        for kind, names in targets:
            res = self.resolve(kind)
            ns = None if (a.all_namespaces or not res.namespaced) else self.ns
            if names:
                objs = []
                for n in names:
                    try:
                        objs.append(self.client.get(self.path(res, n, ns or "")))
                    except ApiError as e:
                        if e.code != 404:
                            raise
                        if not a.ignore_not_found:
                            sys.stderr.write(f"Error from server (NotFound): {e}\n")
                            failed = True
                if objs and combine:
                    combined.extend(objs)
                elif objs:
                    self.emit(res, objs, single=len(names) == 1 and len(targets) == 1)
            else:
                q = []
                if a.selector:
                    q.append("labelSelector=" + a.selector)
                if a.field_selector:
                    q.append("fieldSelector=" + a.field_selector)
                path = res.base_path(ns) + ("?" + "&".join(q) if q else "")
                objs = self.client.get(path.replace(" ", "%20")).get("items", [])
                if not objs and (a.output or "") in ("", "wide"):
                    where = "" if not ns else f" in {ns} namespace"
                    sys.stderr.write(f"No resources found{where}.\n")
                    continue
                if combine:
                    combined.extend(objs)
                else:
                    self.emit(res, objs, single=False)
        if combine:
            self.emit(None, combined, single=False)
        if failed:
            raise SystemExit(1)

    def read_docs(self) -> list[tuple[Obj, str]]:
        docs: list[tuple[Obj, str]] = []
        for f in self.args.filename or []:
            if f == "-":
                text, src = sys.stdin.read(), "STDIN"
            else:
                try:
                    with open(f) as fh:
                        text, src = fh.read(), f
                except OSError:
                    raise CmdError(f'error: the path "{f}" does not exist') from None
            for d in yaml_load_all(text):
                if isinstance(d, dict) and d.get("kind", "").endswith("List") and "items" in d:
                    docs += [(i, src) for i in d["items"]]
                elif isinstance(d, dict):
                    docs.append((d, src))
        if not docs:
            raise CmdError("error: no objects passed to " + self.args.cmd)
        return docs

    def _doc_target(self, doc: Obj, src: str) -> tuple[Resource, str, str]:
        kind, av = doc.get("kind", ""), doc.get("apiVersion", "")
        md = doc.get("metadata") or {}
        res = self.mapping(av, kind)
        if res is None:
            raise CmdError(f'error: resource mapping not found for name: "{md.get("name", "")}" '
                           f'namespace: "{md.get("namespace", "")}" from "{src}": no matches for '
                           f'kind "{kind}" in version "{av}"\nensure CRDs are installed first')
        ns = ""
        if res.namespaced:
            ns = md.get("namespace") or self.ns
            if self.args.namespace and md.get("namespace") and md["namespace"] != \
                    self.args.namespace:
                raise CmdError(f'error: the namespace from the provided object "{md["namespace"]}"'
                               f' does not match the namespace "{self.args.namespace}". You must '
                               f"pass '--namespace={md['namespace']}' to perform this operation.")
        return res, ns, md.get("name", "")

    def cmd_apply(self) -> None:
        errors = []
        for doc, src in self.read_docs():
            try:
                res, ns, name = self._doc_target(doc, src)
            except CmdError as e:
                errors.append(str(e))
                continue
            ref = f"{self.kind_name(res)}/{name}"
            try:
                if self.args.server_side:
                    mgr = self.args.field_manager or "kubectl"
                    q = f"?fieldManager={mgr}" + ("&force=true" if self.args.force_conflicts
                                                  else "")
                    self.client.request("PATCH", self.path(res, name, ns) + q, json.dumps(doc),
                                        content_type="application/apply-patch+yaml")
                    print(f"{ref} serverside-applied")
                    continue
                try:
                    old = self.client.get(self.path(res, name, ns))
                except ApiError as e:
                    if e.code != 404:
                        raise
                    self.client.request("POST", self.path(res, "", ns), doc)
                    print(f"{ref} created")
                    continue
                merged = json.loads(json.dumps(old))
                for k, v in doc.items():
                    if k != "metadata":
                        merged[k] = v
                for mk in ("labels", "annotations"):
                    if doc.get("metadata", {}).get(mk):
                        merged["metadata"][mk] = {**(old["metadata"].get(mk) or {}),
                                                  **doc["metadata"][mk]}
                if merged == old:
                    print(f"{ref} unchanged")
                    continue
                self.client.request("PUT", self.path(res, name, ns), merged)
                print(f"{ref} configured")
            except ApiError as e:
                errors.append(f"Error from server ({e.reason}): error when applying patch to "
                              f'"{src}": {e}' if e.code != 404 else
                              f"Error from server ({e.reason}): error when creating \"{src}\": {e}")
        if errors:
            raise CmdError("\n".join(errors))

    def _delete_one(self, res: Resource, ns: str, name: str, src: str | None) -> None:
        try:
            self.client.request("DELETE", self.path(res, name, ns))
        except ApiError as e:
            if e.code == 404 and self.args.ignore_not_found:
                return
            where = f'error when deleting "{src}": ' if src else ""
            raise CmdError(f"Error from server ({e.reason}): {where}{e}") from e
        suffix = f" from {ns} namespace" if res.namespaced else ""
        print(f'{self.kind_name(res)} "{name}" deleted{suffix}')

    def cmd_delete(self) -> None:
        errors = []
        if self.args.filename:
            for doc, src in self.read_docs():
                try:
                    res, ns, name = self._doc_target(doc, src)
                    self._delete_one(res, ns, name, src)
                except CmdError as e:
                    errors.append(str(e))
        else:
            if not self.args.args:
                raise CmdError("error: You must provide one or more resources by argument or "
                               "filename.")
            kind, names = self.args.args[0], self.args.args[1:]
            if "/" in kind:
                kind, _, n = kind.partition("/")
                names = [n, *names]
            if self.args.selector and not names:   # delete TYPE[,TYPE...] -l SELECTOR
                found = False
                for k in kind.split(","):
                    res = self.resolve(k)
                    ns = self.ns if res.namespaced else ""
                    path = res.base_path(ns or None) + "?labelSelector=" + self.args.selector
                    for obj in self.client.get(path.replace(" ", "%20")).get("items", []):
                        found = True
                        try:
                            self._delete_one(res, ns, obj["metadata"]["name"], None)
                        except CmdError as e:
                            errors.append(str(e))
                if not found:
                    print("No resources found" + (f" in {self.ns} namespace." if self.ns
                                                  else "."))
            res = self.resolve(kind.split(",")[0])
            for n in names:
                try:
                    self._delete_one(res, self.ns if res.namespaced else "", n, None)
                except CmdError as e:
                    errors.append(str(e))
        if errors:
            raise CmdError("\n".join(errors))

    def _node(self, name: str) -> Obj:
        return self.client.get(f"/api/v1/nodes/{name}")

    def _target(self) -> tuple[Resource, str]:
        a = self.args.args
        if not a:
            raise CmdError("error: resource(s) were provided, but no name was specified")
        if "/" in a[0]:
            kind, _, name = a[0].partition("/")
            self.args.args = [kind, name, *a[1:]]
            a = self.args.args
        res = self.resolve(a[0])
        if len(a) < 2:
            raise CmdError("error: resource(s) were provided, but no name was specified")
        return res, a[1]

    def cmd_label(self) -> None:
        res, name = self._target()
        ns = self.ns if res.namespaced else ""
        obj = self.client.get(self.path(res, name, ns))
        labels = dict(obj["metadata"].get("labels") or {})
        changed = removed = False
        for kv in self.args.args[2:]:
            if kv.endswith("-") and "=" not in kv:
                removed |= labels.pop(kv[:-1], None) is not None
                continue
            k, _, v = kv.partition("=")
            if k in labels and labels[k] != v and not self.args.overwrite:
                raise CmdError(f"error: '{k}' already has a value ({labels[k]}), and "
                               "--overwrite is false")
            changed |= labels.get(k) != v
            labels[k] = v
        ref = f"{self.kind_name(res)}/{name}"
        if not changed and not removed:
            print(f"{ref} not labeled")
            return
        patch = {"metadata": {"labels": {k: labels.get(k) for k in
                                         {*labels, *(obj["metadata"].get("labels") or {})}}}}
        self.client.request("PATCH", self.path(res, name, ns), patch,
                            content_type="application/merge-patch+json")
        print(f"{ref} {'labeled' if changed else 'unlabeled'}")

    def cmd_taint(self) -> None:
        res, name = self._target()
        if res.plural != "nodes":
            raise CmdError(f"error: invalid resource type {res.singular}, only node types are "
                           "supported")
        node = self._node(name)
        taints = list(node.get("spec", {}).get("taints") or [])
        added = False
        for spec in self.args.args[2:]:
            rm = spec.endswith("-")
            spec = spec.rstrip("-")
            kv, _, effect = spec.partition(":")
            key, _, value = kv.partition("=")
            if rm:
                keep = [t for t in taints if not (t["key"] == key and (
                    not effect or t.get("effect") == effect))]
                if len(keep) == len(taints):
                    raise CmdError(f'error: taint "{spec}" not found')
                taints, _removed = keep, True
                continue
            if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
                raise CmdError(f'error: invalid taint effect: {effect}, unsupported taint '
                               'effect')
            same = [t for t in taints if t["key"] == key and t.get("effect") == effect]
            if same and not self.args.overwrite:
                raise CmdError(f"error: node {name} already has {key} taint(s) with same "
                               "effect(s) and --overwrite is false")
            taints = [t for t in taints if t not in same]
            t: Obj = {"key": key, "effect": effect}
            if value:
                t["value"] = value
            if effect == "NoExecute":
                t["timeAdded"] = ts()
            taints.append(t)
            added = True
        node["spec"]["taints"] = taints
        self.client.request("PUT", f"/api/v1/nodes/{name}", node)
        print(f"node/{name} {'tainted' if added else 'untainted'}")

    def _cordon(self, name: str, on: bool) -> None:
        node = self._node(name)
        if bool(node.get("spec", {}).get("unschedulable")) == on:
            print(f"node/{name} already {'cordoned' if on else 'uncordoned'}")
            return
        self.client.request("PATCH", f"/api/v1/nodes/{name}",
                            {"spec": {"unschedulable": True if on else None}},
                            content_type="application/strategic-merge-patch+json")
        print(f"node/{name} {'cordoned' if on else 'uncordoned'}")

    def cmd_cordon(self) -> None:
        for n in self.args.args:
            self._cordon(n, True)

    def cmd_uncordon(self) -> None:
        for n in self.args.args:
            self._cordon(n, False)

    def cmd_drain(self) -> None:
        a = self.args
        timeout = parse_duration(a.timeout) if a.timeout and a.timeout != "0s" else 1e9
        for name in a.args:
            self._node(name)
            self._cordon(name, True)
            pods = self.client.get(f"/api/v1/pods?fieldSelector=spec.nodeName={name}")["items"]
            ds_pods, local, bare, evict = [], [], [], []
            for p in pods:
                owners = p["metadata"].get("ownerReferences") or []
                ref = f"{p['metadata']['namespace']}/{p['metadata']['name']}"
                if p["metadata"].get("annotations", {}).get("kubernetes.io/config.mirror"):
                    continue
                if p.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    evict.append(p)
                    continue
                if any(o.get("kind") == "DaemonSet" for o in owners):
                    ds_pods.append(ref)
                    continue
                if not owners and not a.force:
                    bare.append(ref)
                if any("emptyDir" in v for v in p["spec"].get("volumes") or []) and \
                        not a.delete_emptydir_data:
                    local.append(ref)
                evict.append(p)
            errs = []
            if ds_pods and not a.ignore_daemonsets:
                errs.append("cannot delete DaemonSet-managed Pods (use --ignore-daemonsets to "
                            f"ignore): {', '.join(ds_pods)}")
            if bare:
                errs.append("cannot delete Pods that declare no controller (use --force to "
                            f"override): {', '.join(bare)}")
            if local:
                errs.append("cannot delete Pods with local storage (use --delete-emptydir-data "
                            f"to override): {', '.join(local)}")
            if errs:
                msg = ", ".join(errs)
                raise CmdError(f'error: unable to drain node "{name}" due to error: {msg}, '
                               f"continuing command...\nThere are pending nodes to be drained:\n"
                               f" {name}\n" + "\n".join(errs))
            if ds_pods:
                sys.stderr.write("Warning: ignoring DaemonSet-managed Pods: "
                                 f"{', '.join(ds_pods)}\n")
            deadline = time.monotonic() + timeout
            pending = list(evict)
            for p in pending:
                print(f"evicting pod {p['metadata']['namespace']}/{p['metadata']['name']}")
            while pending:
                nxt = []
                for p in pending:
                    ns, pn = p["metadata"]["namespace"], p["metadata"]["name"]
                    try:
                        self.client.request("POST", f"/api/v1/namespaces/{ns}/pods/{pn}/eviction",
                                            {"apiVersion": "policy/v1", "kind": "Eviction",
                                             "metadata": {"name": pn, "namespace": ns}})
                        print(f"pod/{pn} evicted")
                    except ApiError as e:
                        if e.code == 404:
                            print(f"pod/{pn} evicted")
                            continue
                        if e.code != 429:
                            raise
                        if time.monotonic() >= deadline:
                            raise CmdError(
                                f'There are pending pods in node "{name}" when an error occurred:'
                                f' error when evicting pods/"{pn}" -n "{ns}": global timeout '
                                f"reached: {a.timeout}\npod/{pn}\nerror: unable to drain node "
                                f'"{name}" due to error: error when evicting pods/"{pn}" -n "{ns}"'
                                f": global timeout reached: {a.timeout}, continuing command...\n"
                                f"There are pending nodes to be drained:\n {name}\nerror when "
                                f'evicting pods/"{pn}" -n "{ns}": global timeout reached: '
                                f"{a.timeout}") from e
                        sys.stderr.write(f'error when evicting pods/"{pn}" -n "{ns}" (will retry '
                                         f"after 5s): {e}\n")
                        nxt.append(p)
                pending = nxt
                if pending:
                    time.sleep(min(5.0, max(0.1, deadline - time.monotonic())))
            print(f"node/{name} drained")

    def cmd_wait(self) -> None:
        a = self.args
        timeout = parse_duration(a.timeout or "30s")
        cond = a.for_ or ""
        m = re.match(r"^condition=([\w.-]+)(?:=(\w+))?$", cond)
        if not (m or cond == "delete" or cond.startswith("jsonpath=")):
            raise CmdError(f"error: unrecognized condition: \"{cond}\"")
        targets = []
        for t in a.args:
            kind, _, name = t.partition("/")
            res = self.resolve(kind)
            targets.append((res, name))
        deadline = time.monotonic() + timeout
        for res, name in targets:
            ns = self.ns if res.namespaced else ""
            ref = f"{self.kind_name(res)}/{name}"
            while True:
                try:
                    obj = self.client.get(self.path(res, name, ns))
                except ApiError as e:
                    if e.code == 404 and cond == "delete":
                        print(f"{ref} condition met")
                        break
                    raise
                if m:
                    want = m.group(2) or "True"
                    if any(c.get("type", "").lower() == m.group(1).lower() and
                           str(c.get("status")).lower() == want.lower()
                           for c in obj.get("status", {}).get("conditions") or []):
                        print(f"{ref} condition met")
                        break
                elif cond.startswith("jsonpath="):
                    expr, _, val = cond[len("jsonpath="):].partition("=")
                    if jsonpath(expr.strip("'"), obj) == val:
                        print(f"{ref} condition met")
                        break
                if time.monotonic() >= deadline:
                    raise CmdError(f"error: timed out waiting for the condition on "
                                   f"{res.qualified}/{name}")
                time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))

    def cmd_logs(self) -> None:
        a = self.args.args
        if not a:
            raise CmdError("error: expected 'logs [-f] [-p] (POD | TYPE/NAME) [-c CONTAINER]'.")
        pod = a[0].split("/", 1)[-1]
        q = f"?container={self.args.container}" if self.args.container else ""
        data = self.client.get(f"/api/v1/namespaces/{self.ns}/pods/{pod}/log{q}", raw=True)
        if self.args.tail >= 0:   # the last N lines (the API's tailLines)
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[len(lines) - self.args.tail:] if self.args.tail else [])
        sys.stdout.buffer.write(data)

    def cmd_version(self) -> None:
        gv = git_version(self.version)
        major, minor = gv[1:].split(".")[:2]
        client = {"major": major, "minor": minor, "gitVersion": gv,
                  "gitCommit": "lab-standin", "gitTreeState": "clean",
                  "buildDate": "2026-05-14T10:24:31Z", "goVersion": "go1.25.9",
                  "compiler": "gc", "platform": "linux/amd64"}
        out: Obj = {"clientVersion": client, "kustomizeVersion": "v5.7.1"}
        if not self.args.client:
            out["serverVersion"] = self.client.get("/version")
        if self.args.output == "json":
            print(json.dumps(out, indent=2))
        elif self.args.output == "yaml":
            sys.stdout.write(yaml_dump(out))
        else:
            print(f"Client Version: {gv}\nKustomize Version: v5.7.1")
            if "serverVersion" in out:
                print(f"Server Version: {out['serverVersion']['gitVersion']}")

    def cmd_cluster_info(self) -> None:
        self.client.get("/api")
        print(f"Kubernetes control plane is running at {self.client.creds.server}")
        try:
            svcs = self.client.get("/api/v1/namespaces/kube-system/services?labelSelector="
                                   "kubernetes.io/cluster-service=true")["items"]
        except ApiError:
            svcs = []
        for s in svcs:
            name = s["metadata"].get("labels", {}).get("kubernetes.io/name", s["metadata"]["name"])
            port = (s.get("spec", {}).get("ports") or [{}])[0].get("name", "")
            print(f"{name} is running at {self.client.creds.server}/api/v1/namespaces/kube-system"
                  f"/services/{s['metadata']['name']}:{port}/proxy")
        print("\nTo further debug and diagnose cluster problems, use 'kubectl cluster-info dump'.")

    def cmd_create(self) -> None:
        a = self.args.args
        if len(a) >= 2 and a[0] in ("namespace", "ns"):
            self.client.request("POST", "/api/v1/namespaces", {"metadata": {"name": a[1]}})
            print(f"namespace/{a[1]} created")
            return
        for doc, src in self.read_docs():
            res, ns, name = self._doc_target(doc, src)
            try:
                self.client.request("POST", self.path(res, "", ns), doc)
            except ApiError as e:
                raise CmdError(f'Error from server ({e.reason}): error when creating "{src}": '
                               f"{e}") from e
            print(f"{self.kind_name(res)}/{name} created")

    def cmd_describe(self) -> None:
        from .describe import describe

        res, name = self._target()
        ns = self.ns if res.namespaced else ""
        obj = self.client.get(self.path(res, name, ns))
        events = self.client.get(
            f"/api/v1/namespaces/{ns or 'default'}/events?fieldSelector=involvedObject.name="
            f"{name}")["items"]
        pods: list[Obj] = []
        if res.plural == "nodes":
            pods = self.client.get(f"/api/v1/pods?fieldSelector=spec.nodeName={name}")["items"]
        sys.stdout.write(describe(res, obj, events, pods))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubectl", add_help=False)
    p.add_argument("cmd", nargs="?")
    p.add_argument("args", nargs="*")
    p.add_argument("--kubeconfig")
    p.add_argument("--context")
    p.add_argument("-s", "--server")
    p.add_argument("-n", "--namespace")
    p.add_argument("-A", "--all-namespaces", action="store_true")
    p.add_argument("-o", "--output")
    p.add_argument("--no-headers", action="store_true",
                   help="when printing tables or custom-columns, print no header line")
    p.add_argument("-l", "--selector")
    p.add_argument("--field-selector")
    p.add_argument("-f", "--filename", action="append")
    p.add_argument("--server-side", action="store_true")
    p.add_argument("--force-conflicts", action="store_true")
    p.add_argument("--field-manager")
    p.add_argument("--ignore-not-found", nargs="?", const=True, default=False,
                   type=lambda s: s.lower() != "false")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--ignore-daemonsets", action="store_true")
    p.add_argument("--delete-emptydir-data", action="store_true")
    p.add_argument("--force", action="store_true")
    p.add_argument("--timeout")
    p.add_argument("--for", dest="for_")
    p.add_argument("--raw")
    p.add_argument("--client", action="store_true")
    p.add_argument("-c", "--container")
    p.add_argument("--tail", type=int, default=-1)
    p.add_argument("--request-timeout")
    p.add_argument("-v", "--v")
    p.add_argument("-h", "--help", action="store_true")
    p.add_argument("--grace-period")
    p.add_argument("--wait", nargs="?", const="true")
    p.add_argument("--now", action="store_true")
    return p


def main(argv: list[str], version_raw: str) -> int:
    args, unknown = build_parser().parse_known_args(argv)
    bad = [u for u in unknown if u.startswith("-")]
    if bad:
        sys.stderr.write(f"error: unknown flag: {bad[0].split('=')[0]}\nSee 'kubectl "
                         f"{args.cmd or ''} --help' for usage.\n")
        return 1
    args.args += unknown
    version = package_version(version_raw)
    k = Kubectl(args, version)
    cmd = (args.cmd or "").replace("-", "_")
    fn = getattr(k, f"cmd_{cmd}", None)
    if fn is None:
        sys.stderr.write(f'error: unknown command "{args.cmd}" for "kubectl"\n'
                         if args.cmd else "kubectl controls the Kubernetes cluster manager.\n")
        return 1
    try:
        fn()
    except CmdError as e:
        sys.stderr.write(f"{e}\n")
        return 1
    except ApiError as e:
        if e.code == 401:
            sys.stderr.write("error: You must be logged in to the server (Unauthorized)\n")
        else:
            sys.stderr.write(f"Error from server ({e.reason or 'InternalError'}): {e}\n")
        return 1
    except Unreachable as e:
        if e.refused:
            sys.stderr.write(f"The connection to the server {e.hostport} was refused - did you "
                             "specify the right host or port?\n")
        else:
            sys.stderr.write(f"Unable to connect to the server: dial tcp {e.hostport}: {e}\n")
        return 1
    except TLSError as e:
        sys.stderr.write(f"Unable to connect to the server: {e}\n")
        return 1
    except ValueError as e:
        sys.stderr.write(f"error: {e}\n")
        return 1
    return 0
