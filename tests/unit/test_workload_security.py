"""Workload values cannot reach past their own workload (security review findings 3 and 4).

- every value reaches a manifest as one JSON scalar (``| tojson``); a newline or any other
  control character in a value is refused, with the key named;
- each workload renders only its own kinds (``KINDS``), every namespaced object in
  ``values.namespace``, which must be a DNS-1123 label;
- the NFS export: ``nfs.path``, ``nfs.exportClients`` and ``nfs.exportOptions`` are validated and
  quoted; by default the export goes to the cluster nodes' addresses with root_squash, and its
  folders are 2770, owned by the uid/gid root is squashed to."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import workloads as w
from gpuk8s.report import Reporter
from gpuk8s.transport import CommandResult, Counters
from gpuk8s.workloads import commands
from gpuk8s.workloads.cluster import WaitResult
from gpuk8s.workloads.values import WorkloadError
from tests.unit.fakes import op_bodies, runner_for, sectioned

#: a new object (with newlines), and a new key in a flow or block mapping (without any)
NEWLINE_PAYLOAD = ("x\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\n"
                   "metadata: {name: pwn}\nroleRef: {apiGroup: rbac.authorization.k8s.io, "
                   "kind: ClusterRole, name: cluster-admin}\nsubjects: [{kind: Group, "
                   "name: system:authenticated, apiGroup: rbac.authorization.k8s.io}]\n")
QUOTE_PAYLOAD = 'x", injected: "1'
NODES = ["10.88.0.11", "10.88.0.12", "10.88.0.13", "10.88.0.14"]


def extra(name: str) -> dict[str, Any]:
    if name == "storage":
        return {"nfs_server": "10.88.0.11"}
    if name == "verify":
        return {"gpu_nodes": [{"name": "gpu-01", "gpus": 1}], "stage": "smi"}
    return {}


def string_leaves(tree: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from string_leaves(v, (*prefix, k))
    elif isinstance(tree, str):
        yield prefix


def keys_in(tree: Any) -> Iterator[str]:
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield str(k)
            yield from keys_in(v)
    elif isinstance(tree, list):
        for v in tree:
            yield from keys_in(v)


def strings_in(tree: Any) -> Iterator[str]:
    if isinstance(tree, dict):
        for v in tree.values():
            yield from strings_in(v)
    elif isinstance(tree, list):
        for v in tree:
            yield from strings_in(v)
    elif isinstance(tree, str):
        yield tree


# -- 1. values reach manifests as JSON scalars; control characters are refused ---------------
def test_newline_in_a_set_value_is_refused_not_an_extra_object() -> None:
    with pytest.raises(w.WorkloadError) as exc:
        w.load_values("jupyter", sets=[f"images.jupyter={NEWLINE_PAYLOAD}"])
    message = str(exc.value)
    assert "--set images.jupyter=...: images.jupyter holds a newline" in message
    assert "single-line" in message   # the fix
    assert NEWLINE_PAYLOAD not in message   # shown escaped and cut, not pasted raw


@pytest.mark.parametrize("name, text, key", [
    ("jupyter", f"images: {{jupyter: {json.dumps(NEWLINE_PAYLOAD)}}}\n", "images.jupyter"),
    ("jupyter", 'extraEnv: {"A\\nB": "1"}\n', "extraEnv.A\nB"),
    ("jupyter", 'nodeSelector: {pool: "a\\r---"}\n', "nodeSelector.pool"),
    ("tensorflow-job", 'command: [python3, "-c", "print(1)\\n---"]\n', "command[2]"),
    ("jupyter", 'service: {type: "NodePort\\u2028x"}\n', "service.type"),
    ("storage", 'nfs: {exportClients: "10.0.0.1\\t*"}\n', "nfs.exportClients"),
])
def test_control_characters_in_a_values_file_are_refused(tmp_path: Path, name: str, text: str,
                                                         key: str) -> None:
    f = tmp_path / "v.yaml"
    f.write_text(text)
    with pytest.raises(w.WorkloadError) as exc:
        w.load_values(name, [f])
    assert f"values file {f}: {key} holds a newline or control character" in str(exc.value)


@pytest.mark.parametrize("name", [*w.WORKLOADS, "verify"])
@pytest.mark.parametrize("payload", [NEWLINE_PAYLOAD, QUOTE_PAYLOAD], ids=["newline", "quote"])
def test_every_string_value_stays_one_scalar(name: str, payload: str) -> None:
    """Past validation (values set directly), a hostile value in any string-valued key still
    renders as that one string: no new object, no new key (the templates' | tojson)."""
    base = w.load_values(name)
    default_kinds = [d["kind"] for d in w.render(name, base, **extra(name))]
    for path in string_leaves(base):
        if path in (("namespace",), ("gpuAllocation",)):
            continue   # validated again at render time (check_objects, dra.use_claims)
        values = w.load_values(name)
        node = values
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = payload
        values["extraEnv"] = {payload: payload}
        docs = w.render(name, values, **extra(name))
        kinds = [d["kind"] for d in docs]
        assert set(kinds) <= set(default_kinds) and len(kinds) <= len(default_kinds), (path, kinds)
        for doc in docs:
            assert "injected" not in set(keys_in(doc)), path
            # the payload only ever appears whole, inside one string (maybe with a suffix)
            assert all(payload in s for s in strings_in(doc) if "cluster-admin" in s), path


def test_a_quote_in_a_value_stays_inside_its_string() -> None:
    """No control character, so validation lets it through: the template must quote it."""
    values = w.load_values("tensorflow-job", sets=[f"run={QUOTE_PAYLOAD}",
                                                   f"images.tensorflow=reg/tf:1{QUOTE_PAYLOAD}"])
    job = w.render("tensorflow-job", values)[1]
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["GPUK8S_RUN"] == {"name": "GPUK8S_RUN", "value": QUOTE_PAYLOAD}
    assert container["image"] == f"reg/tf:1{QUOTE_PAYLOAD}"


def test_rendered_templates_paste_no_bare_value() -> None:
    """Every {{ ... }} in a manifest template goes through tojson (or int / indent of repo
    text), so a future template cannot quietly paste a value as raw YAML."""
    import re

    allowed = re.compile(r"\|\s*tojson\s*$|\|\s*int\s*$|\|\s*indent\(\d+\)\s*$|^role$|"
                         r"^m\.shared_volume\(\)$")
    for path in sorted(w.workloads_dir().rglob("*.j2")):
        if path.name == "_train.py.j2":
            continue
        for expr in re.findall(r"{{-?\s*(.*?)\s*-?}}", path.read_text()):
            assert allowed.search(expr), f"{path.name}: {{{{ {expr} }}}} is not | tojson"


# -- 2. kinds and namespace are allow-listed ----------------------------------------------
@pytest.fixture
def templates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of templates/workloads, used by render()."""
    copy = tmp_path / "workloads"
    shutil.copytree(w.workloads_dir(), copy)
    # render() (gpuk8s/workloads/rendering.py) is where the templates are looked up
    monkeypatch.setattr("gpuk8s.workloads.rendering.workloads_dir", lambda: copy)
    return copy


CRB = """apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: pwn
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects: [{kind: Group, name: "system:authenticated", apiGroup: rbac.authorization.k8s.io}]
"""


def test_a_cluster_role_binding_is_refused(templates: Path) -> None:
    (templates / "jupyter" / "zz-extra.yaml.j2").write_text(CRB)
    with pytest.raises(w.WorkloadError) as exc:
        w.render("jupyter", w.load_values("jupyter"))
    message = str(exc.value)
    assert message.startswith("workload jupyter: refused to apply ClusterRoleBinding/pwn "
                              "(rbac.authorization.k8s.io/v1): jupyter only creates ")
    assert "Deployment (apps/v1)" in message and "templates/workloads/jupyter/" in message


def test_a_kind_of_another_workload_is_refused(templates: Path) -> None:
    (templates / "tensorboard" / "zz-extra.yaml.j2").write_text(
        "apiVersion: v1\nkind: Secret\nmetadata: {name: s, namespace: {{ namespace|tojson }}}\n")
    with pytest.raises(w.WorkloadError, match=r"workload tensorboard: refused to apply "
                                              r"Secret/s \(v1\): tensorboard only creates"):
        w.render("tensorboard", w.load_values("tensorboard"))
    # the notebook token Secret that deploy adds to jupyter is allowed
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "jupyter-token",
                                                                 "namespace": "ml"}}
    w.check_objects("jupyter", [secret], "ml")


@pytest.mark.parametrize("namespace_line, shown", [
    ("  namespace: kube-system\n", "'kube-system'"),
    ("", "None"),
])
def test_an_object_in_another_namespace_is_refused(templates: Path, namespace_line: str,
                                                   shown: str) -> None:
    (templates / "eval" / "zz-extra.yaml.j2").write_text(
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: other\n{namespace_line}")
    with pytest.raises(w.WorkloadError) as exc:
        w.render("eval", w.load_values("eval", sets=["namespace=team-a"]))
    assert str(exc.value).startswith(
        f"workload eval: refused to apply ConfigMap/other (v1): its namespace is {shown}, not "
        "the workload's namespace 'team-a'")


def test_a_volume_reserved_for_another_namespace_is_refused() -> None:
    pv, pvc = w.render("storage", w.load_values("storage"), nfs_server="10.88.0.11")
    pv["spec"]["claimRef"]["namespace"] = "kube-system"
    with pytest.raises(w.WorkloadError, match="reserved for a claim in namespace 'kube-system'"):
        w.check_objects("storage", [pv, pvc], "ml")


@pytest.mark.parametrize("namespace, why", [
    ("Team_A", "DNS-1123 label"),
    ("a" * 64, "DNS-1123 label"),
    ("-ml", "DNS-1123 label"),
    ("kube-system", "kube-* namespaces belong to Kubernetes"),
])
def test_the_namespace_must_be_a_dns_label_of_our_own(namespace: str, why: str) -> None:
    with pytest.raises(w.WorkloadError) as exc:
        w.load_values("jupyter", sets=[f"namespace={namespace}"])
    assert f"--set namespace={namespace}: namespace {namespace!r} is refused: " in str(exc.value)
    assert why in str(exc.value)
    values = w.load_values("jupyter")
    values["namespace"] = namespace   # past load_values: render refuses it too
    with pytest.raises(w.WorkloadError, match=r"workload jupyter: namespace .* is refused"):
        w.render("jupyter", values)


def test_every_allowed_namespaced_kind_is_one_undeploy_deletes() -> None:
    plural = {"Deployment": "deployments", "Job": "jobs", "Service": "services",
              "ConfigMap": "configmaps", "Secret": "secrets",
              "PersistentVolumeClaim": "persistentvolumeclaims",
              "ServiceAccount": "serviceaccounts"}
    deleted = set(w.NS_KINDS.split(","))
    for name, kinds in w.KINDS.items():
        for _api, kind in kinds:
            if kind in w.CLUSTER_SCOPED or (name, kind) == ("distributed-tf", "TFJob"):
                continue
            assert plural[kind] in deleted, (name, kind)


# -- 3. NFS: path, clients and options are validated and quoted ---------------------------
@pytest.mark.parametrize("expr", [
    "nfs.path=/srv/g$(id -un>/tmp/x)",
    "nfs.path=/srv/g`id`",
    "nfs.path=/srv/a b",
    "nfs.path=srv/gpuk8s",
    "nfs.path=/srv/../etc",
    "nfs.path=/srv/gpuk8s/",
    "nfs.path=/srv/g;reboot",
    "nfs.path=/srv/g\"x",
])
def test_nfs_path_injection_is_refused(expr: str) -> None:
    with pytest.raises(w.WorkloadError) as exc:
        w.load_values("storage", sets=[expr])
    assert "nfs.path" in str(exc.value)
    assert "absolute path of letters, digits" in str(exc.value) or \
        "holds a newline" in str(exc.value)


def test_nfs_path_is_quoted_and_matched_literally(tmp_path: Path) -> None:
    values = w.load_values("storage", sets=["nfs.path=/srv/ml+data.v2"])
    script = w.nfs_server_script(values, NODES)
    last = script.rstrip().splitlines()[-1]
    assert last == ("exportfs -v | awk '{print $1}' | grep -qxF -- /srv/ml+data.v2 || "
                    "{ echo '/srv/ml+data.v2 not in exportfs -v'; exit 4; }")
    # the check itself, with a stub exportfs: the exact path passes, a longer one does not
    stub = tmp_path / "bin"
    stub.mkdir()
    for listed, rc in (("/srv/ml+data.v2", 0), ("/srv/ml+data.v22", 4), ("/srv/mlXdata.v2", 4)):
        (stub / "exportfs").write_text(
            f"#!/bin/sh\nprintf '%s\\t10.88.0.12(sync,root_squash)\\n' '{listed}'\n")
        (stub / "exportfs").chmod(0o755)
        res = subprocess.run(["sh", "-c", last], env={"PATH": f"{stub}:/usr/bin:/bin"},
                             capture_output=True, text=True, check=False)
        assert res.returncode == rc, (listed, res.stdout, res.stderr)
    # validation skipped (values set directly): the script still refuses the path
    values["nfs"]["path"] = "/srv/g$(id -un>/tmp/x)"
    with pytest.raises(w.WorkloadError, match=r"nfs\.path .* is refused"):
        w.nfs_server_script(values, NODES)


def test_nfs_root_is_never_gpuk8s_own_export() -> None:
    values = w.load_values("storage", sets=["nfs.path=/"])   # an existing server's v4 root
    with pytest.raises(w.WorkloadError, match=r"nfs\.path '/' is refused for gpuk8s' own export"):
        w.nfs_server_script(values, NODES)


@pytest.mark.parametrize("expr, key", [
    ('nfs.exportClients="10.0.0.0/24(ro)\\n/ *"', "nfs.exportClients"),
    ("nfs.exportClients=10.0.0.0/24(ro) *", "nfs.exportClients"),
    ("nfs.exportClients=host;reboot", "nfs.exportClients"),
    ("nfs.exportClients=-o", "nfs.exportClients"),
    ('nfs.exportOptions="rw\\n/ *(rw"', "nfs.exportOptions"),
    ("nfs.exportOptions=rw) *(rw,no_root_squash", "nfs.exportOptions"),
    ("nfs.exportOptions=rw anonuid=0", "nfs.exportOptions"),
    ("nfs.exportOptions=rw,anonuid=nobody", "nfs.exportOptions"),
])
def test_export_line_injection_is_refused(expr: str, key: str) -> None:
    with pytest.raises(w.WorkloadError) as exc:
        w.load_values("storage", sets=[expr])
    assert f": {key} " in str(exc.value)


def test_export_line_injection_is_refused_past_validation() -> None:
    for key, bad in (("exportClients", "10.0.0.0/24(ro)\n/ *"),
                     ("exportOptions", "rw)\n/ *(rw")):
        values = w.load_values("storage")
        values["nfs"][key] = bad
        with pytest.raises(w.WorkloadError, match=rf"nfs\.{key} .* is refused"):
            w.nfs_server_script(values, NODES)


@pytest.mark.parametrize("clients", [
    "10.88.0.0/24", "10.88.0.0/255.255.255.0", "*.lab.example gpu-0?", "@gpu-nodes",
    "fd00::/64", "10.88.0.11,10.88.0.12", "*",
])
def test_legitimate_export_clients_are_accepted(clients: str) -> None:
    values = w.load_values("storage", sets=[f"nfs.exportClients={clients}"])
    line = w.export_line(values, NODES)
    want = " ".join(f"{c}({values['nfs']['exportOptions']})"
                    for c in clients.replace(",", " ").split())
    assert line == f"/srv/gpuk8s {want}"


# -- 4. the default export: the nodes only, root squashed, folders 2770 ---------------------
def test_default_export_is_the_nodes_with_root_squash() -> None:
    nfs = w.load_values("storage")["nfs"]
    assert nfs["exportClients"] == ""
    options = nfs["exportOptions"].split(",")
    assert "root_squash" in options and "no_root_squash" not in options
    script = w.nfs_server_script(w.load_values("storage"), [*NODES, NODES[0]])
    (want,) = [ln for ln in script.splitlines() if ln.startswith("want=")]
    line = want[len("want='"):-1]
    opts = nfs["exportOptions"]
    assert line == "/srv/gpuk8s " + " ".join(f"{a}({opts})" for a in NODES)
    assert "*" not in line and "no_root_squash" not in line
    assert "0777" not in script
    assert 'chown 65534:65534 "$d" && chmod 2770 "$d"' in script
    assert "for d in /srv/gpuk8s/data /srv/gpuk8s/checkpoints /srv/gpuk8s/logs; do" in script


def test_folder_owner_follows_anonuid_and_anongid() -> None:
    values = w.load_values("storage", sets=[
        "nfs.exportOptions=rw,sync,no_subtree_check,all_squash,anonuid=1000,anongid=2000"])
    script = w.nfs_server_script(values, NODES)
    assert 'chown 1000:2000 "$d" && chmod 2770 "$d"' in script
    assert '"1000:2000:2770"' in script


def test_default_export_needs_node_addresses() -> None:
    values = w.load_values("storage")
    with pytest.raises(w.WorkloadError, match=r"no node addresses .* nfs\.exportClients="):
        w.nfs_server_script(values)
    with pytest.raises(w.WorkloadError, match=r"'evil\(rw\) \*' \(an inventory address\)"):
        w.nfs_server_script(values, ["10.88.0.11", "evil(rw) *"])


def test_setup_nfs_exports_to_every_inventory_node() -> None:
    """deploy storage (gpuk8s' own export): the clients are the session's hosts' addresses."""
    sent: dict[str, list[str]] = {}

    class T:
        def __init__(self, name: str) -> None:
            self.name = name

        def run(self, script: str, timeout: float | None = None) -> CommandResult:
            sent.setdefault(self.name, []).append(script)
            return sectioned(script, "changed: /etc/exports.d/gpuk8s.exports")

    class H:
        def __init__(self, address: str) -> None:
            self.address = address

    hosts = {"cp-01": "10.88.0.11", "gpu-01": "10.88.0.12", "gpu-02": "gpu-02.lab.example"}

    class S:
        first_cp = "cp-01"
        scope = ["gpu-01", "gpu-02", "cp-01"]
        transports = {h: T(h) for h in hosts}
        runner = staticmethod(runner_for(transports))

        class runlog:
            @staticmethod
            def host_logger(host: str) -> Any:
                return lambda text: None

        class reporter:
            @staticmethod
            def print(*args: Any, **kwargs: Any) -> None:
                pass

        @staticmethod
        def redact(text: str) -> str:
            return text

        @staticmethod
        def host(name: str) -> H:
            return H(hosts[name])

    values = w.load_values("storage", sets=["nfs.installClients=false"])
    assert w._setup_nfs(S(), values) == "10.88.0.11"  # type: ignore[arg-type]
    (script,) = sent["cp-01"]
    (want,) = [ln for ln in script.splitlines() if ln.startswith("want=")]
    opts = values["nfs"]["exportOptions"]
    assert want == (f"want='/srv/gpuk8s 10.88.0.11({opts}) 10.88.0.12({opts}) "
                    f"gpu-02.lab.example({opts})'")


def test_one_apply_for_cluster_and_workloads_and_its_heredoc_cannot_be_ended_early(
        tmp_path: Path) -> None:
    """Cluster add-ons and workloads share ops.kube.apply_script; a value holding a line that
    looks like a heredoc end stays data."""
    from gpuk8s.ops.kube import apply_script
    from gpuk8s.workloads import cluster

    text = "data:\n  x: |\n    GPUK8S_EOF\n    GPUK8S_EOF_0\n    echo pwned\n"
    fake = tmp_path / "kubectl"
    fake.write_text(f"#!/bin/sh\ncat > {tmp_path / 'got'}\n")
    fake.chmod(0o755)
    script = apply_script(text, kubectl=str(fake))
    subprocess.run(["sh", "-c", script], check=True)
    assert (tmp_path / "got").read_text() == text
    assert apply_script(text) == apply_script(text)  # deterministic: plans compare equal
    assert cluster.KUBECTL.startswith("kubectl --kubeconfig /etc/kubernetes/admin.conf ")


# -- the notebook token never reaches the run folder (review 2, L2) -----------------------------

NB_TOKEN = "3f1c2a9b8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e"
NB_B64 = base64.b64encode(NB_TOKEN.encode()).decode()


def _one_op(script: str, index: int) -> str:
    """The begin-marker line of op ``index`` alone (what sectioned() answers to)."""
    marker = re.search(r"@@GPUK8S-OP-[0-9a-f]+", script)
    assert marker
    return f'echo "{marker[0]} B {index} $(date +%s.%N)"\n'


class _RedeployCP:
    """A control plane where jupyter was deployed before: the Secret holds a token; the claim
    is Bound; the apply fails and echoes what it was given (as a verbose error would)."""

    def __init__(self, spec: Any, redact: Any, secret_data: str = NB_B64) -> None:
        self.name, self.counters, self.data = spec.name, Counters(), secret_data
        self.scripts: list[str] = []

    def run(self, script: str, *, timeout: float | None = None) -> CommandResult:
        self.scripts.append(script)
        out, rc = [], 0
        for i, body in enumerate(op_bodies(script)):  # each op answered on its own
            text, rc = ((self.data, 0) if "get secret" in body else ("Bound", 0)
                        if "persistentvolumeclaim" in body else
                        (f"error: apply refused: token {NB_TOKEN} ({NB_B64})", 1))
            out.append(sectioned(_one_op(script, i), text, rc).stdout)
        return CommandResult(rc, "".join(out))

    def close(self) -> None:
        pass


def _deploy_jupyter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: str = NB_B64
                    ) -> tuple[str, Path, list[_RedeployCP]]:
    monkeypatch.setenv("GPUK8S_RUNS_DIR", str(tmp_path / "runs"))
    inv = tmp_path / "hosts.yaml"
    inv.write_text("all:\n  children:\n    control_plane:\n      hosts:\n        cp-01: "
                   "{ansible_host: 10.0.0.11}\n    workers:\n      hosts:\n        gpu-01: "
                   "{ansible_host: 10.0.0.21}\n")
    out = io.StringIO()
    cps: list[_RedeployCP] = []

    def opener(spec: Any, redact: Any) -> _RedeployCP:
        cps.append(_RedeployCP(spec, redact, data))
        return cps[-1]

    with pytest.raises(WorkloadError) as err:
        w.deploy(inv, "jupyter", reporter=Reporter(out), opener=opener)
    return str(err.value) + out.getvalue(), tmp_path / "runs", cps


def test_a_redeploy_keeps_the_existing_token_out_of_the_run_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shown, runs, cps = _deploy_jupyter(tmp_path, monkeypatch)
    assert any("get secret jupyter-token" in s for s in cps[0].scripts)  # the Secret was read
    assert "apply refused" in shown  # the deploy went on to the apply with that token
    files = [p for p in runs.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"cp-01.log", "report.json"}
    for path in files:
        text = path.read_text()
        assert NB_TOKEN not in text and NB_B64 not in text, path.name
    log = next(p for p in files if p.name == "cp-01.log").read_text()
    assert "workload | token" in log and "<redacted>" in log
    assert NB_TOKEN not in shown and NB_B64 not in shown


@pytest.mark.parametrize("data", ["not base64!", base64.b64encode(b"\xff\xfe").decode(),
                                  base64.b64encode(b"two\nlines").decode()])
def test_a_secret_that_is_not_a_base64_token_is_a_clear_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: str) -> None:
    shown, _, _ = _deploy_jupyter(tmp_path, monkeypatch, data)
    assert "Secret ml/jupyter-token holds no usable notebook token" in shown
    assert "kubectl -n ml delete secret jupyter-token" in shown
    assert "apply refused" not in shown  # nothing applied over it


def test_the_non_tty_hint_names_the_token_secret() -> None:
    out = io.StringIO()

    class S:
        reporter = Reporter(out)
        first_cp = "cp-01"

        def host(self, name: str) -> Any:
            return type("H", (), {"address": "10.0.0.11"})()

    svc = {"metadata": {"name": "jupyter", "namespace": "team-a"},
           "spec": {"type": "NodePort", "ports": [{"nodePort": 30888, "port": 8888}]}}
    result = WaitResult(True, [], [], {}, [svc])
    commands._print_service(S(), svc, result, NB_TOKEN, False,  # type: ignore[arg-type]
                            token_secret="nb-token")
    text = out.getvalue()
    assert "kubectl -n team-a get secret nb-token -o jsonpath='{.data.token}'" in text
    assert NB_TOKEN not in text and "jupyter-token" not in text
