"""JupyterHub for the lab's users (issue 35, second half), on the bootstrapped lab with the REAL
JupyterHub 5.5.0, KubeSpawner 7.0.0, jupyterhub-idle-culler 1.4.0, NativeAuthenticator 1.3.0 (the
hub image), the REAL configurable-http-proxy 5.2.0 on Debian's nodejs (the proxy image) and the
real jupyterhub-singleuser, Jupyter server and TensorFlow 2.21.0 (CPU build) in the notebook
image; all built by tests/lab/images.py from PyPI, npm and Debian. alice and bob sign up on the
hub's real HTTPS form, start 1-GPU servers in their own namespaces, run a notebook through their
server's API; bob's second GPU server is refused by his quota with the API server's text, shown
on the spawn's progress; an idle GPU server stops itself and frees its GPU.

What is emulated (tests/lab/standins/k8s/README.md): Kubernetes (API server with RBAC,
ResourceQuota and ServiceAccount tokens, scheduler, kubelet bookkeeping, kube-proxy's rules,
DNS), the GPUs and the NFS server (the lab host's shared folder)."""

from __future__ import annotations

import http.cookiejar
import io
import json
import os
import re
import secrets
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import api, workloads
from gpuk8s.report import Reporter
from tests.browser import FLAGS, chromium
from tests.lab import images
from tests.lab.lab import Lab
from tests.lab.paths import HOST_IP, REPO_ROOT, shared_dir
from tests.lab.product.runs import derived_inventory
from tests.lab.product.test_bootstrap import GATE_VARS
from tests.lab.product.test_day2 import restore_bootstrapped
from tests.lab.product.test_workloads import NODE_IPS, api_up, kubectl, run

pytestmark = pytest.mark.lab

USERS = {"alice": {"gpu_quota": 2, "admin": True}, "bob": {"gpu_quota": 1}}
IMAGES = ["quay.io/jupyterhub/k8s-hub:4.4.0", "quay.io/jupyterhub/configurable-http-proxy:5.2.0",
          "quay.io/jupyter/tensorflow-notebook:cuda-tensorflow-2.21.0"]
#: the lab's "NFS server" is the lab host's shared folder (see test_workloads)
EXPORT = Path(HOST_IP) / "srv/gpuk8s"
GPU_IDLE = 90
SETS = [f"homes.nfs.server={HOST_IP}", f"gpuIdleTimeout={GPU_IDLE}", "cpu=100m",
        "memory=1Gi"]
BASE = f"https://{NODE_IPS['cp-01']}:30443"
SHOTS = REPO_ROOT / "artifacts" / "jupyterhub"
PASSWORDS = {u: secrets.token_urlsafe(12) for u in USERS}


@pytest.fixture(scope="module")
def cluster(lab: Lab) -> Lab:
    restore_bootstrapped(lab)
    images.ensure_images(IMAGES)
    return api_up(lab)


@pytest.fixture(scope="module")
def inv(cluster: Lab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The users' namespaces and quotas (bootstrap's tenancy phase), and their homes made on
    the "NFS server" as its admin would: owned by the notebook user 1000:100, 0700."""
    path = derived_inventory(cluster, tmp_path_factory.mktemp("hub"), feature_gates=GATE_VARS,
                             lab_users=USERS)
    api.bootstrap(path, yes=True, reporter=Reporter(io.StringIO()))
    root = shared_dir() / EXPORT
    for folder, owner in [("jupyterhub", (1000, 1000)),
                          *((f"homes/{u}", (1000, 100)) for u in USERS)]:
        (root / folder).mkdir(parents=True, exist_ok=True)
        os.chown(root / folder, *owner)
        (root / folder).chmod(0o700)
    return path


@pytest.fixture(scope="module")
def ca(cluster: Lab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    rc, out, err = cluster.ssh("cp-01", "cat /etc/kubernetes/pki/ca.crt")
    assert rc == 0, err
    path = tmp_path_factory.mktemp("ca") / "ca.crt"
    path.write_text(out)
    return path


@pytest.fixture(scope="module")
def hub(inv: Path) -> dict[str, Any]:
    started = time.monotonic()
    result, text = run(workloads.deploy, inv, "jupyterhub", sets=SETS, timeout=600)
    print(f"\ndeploy jupyterhub: {time.monotonic() - started:.1f} s")
    assert f"JupyterHub: {BASE}/hub/" in text
    return result


class Browser:
    """A user at the hub over HTTPS, the server's certificate checked against the cluster CA:
    cookies kept, the _xsrf form field sent as the hub's pages do."""

    def __init__(self, ca: Path) -> None:
        self.jar = http.cookiejar.CookieJar()
        self.ctx = ssl.create_default_context(cafile=str(ca))
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPSHandler(context=self.ctx),
            urllib.request.HTTPCookieProcessor(self.jar))

    def get(self, path: str) -> str:
        with self.opener.open(BASE + path, timeout=60) as resp:
            return str(resp.read().decode())

    def form(self, path: str, fields: dict[str, str]) -> str:
        xsrf = next((c.value for c in self.jar if c.name == "_xsrf"), "")
        data = urllib.parse.urlencode({**fields, "_xsrf": xsrf or ""}).encode()
        with self.opener.open(urllib.request.Request(BASE + path, data=data), timeout=60) as r:
            return str(r.read().decode())

    def cookie_header(self) -> str:
        return "; ".join(f"{c.name}={c.value}" for c in self.jar)


def call(ca: Path, method: str, path: str, token: str | None = None,
         body: Any = None) -> tuple[int, Any]:
    req = urllib.request.Request(BASE + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"token {token}"} if token else {})
    ctx = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=60) as resp:
            text = resp.read().decode()
            return resp.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def progress(ca: Path, token: str, user: str, server: str = "",
             timeout: float = 420) -> list[dict[str, Any]]:
    """The spawn's progress events (the stream the hub's spawn-pending page shows), to the
    end: ready or failed."""
    path = f"/hub/api/users/{user}/server{'s/' + server if server else ''}/progress"
    req = urllib.request.Request(BASE + path, headers={"Authorization": f"token {token}"})
    events = []
    ctx = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(req, context=ctx, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            events.append(event)
            if event.get("ready") or event.get("failed"):
                break
    return events


def sign_up_and_token(ca: Path, user: str) -> tuple[Browser, str]:
    """The real sign-up form, the real login form, then a token from the REST API with the
    same password (the tokens route's auth body, JupyterHub 5.5.0 apihandlers/users.py)."""
    b = Browser(ca)
    page = b.get("/hub/signup")
    assert "signup_password" in page
    done = b.form("/hub/signup", {"username": user, "signup_password": PASSWORDS[user],
                                  "signup_password_confirmation": PASSWORDS[user]})
    assert "The signup was successful" in done or "Your information has been sent" in done
    b.get("/hub/login")
    home = b.form("/hub/login", {"username": user, "password": PASSWORDS[user]})
    assert "Start My Server" in home or "spawn" in home.lower(), home[:500]
    code, body = call(ca, "POST", f"/hub/api/users/{user}/tokens",
                      body={"auth": {"username": user, "password": PASSWORDS[user]},
                            "note": "gpuk8s lab test", "expires_in": 3600})
    assert code == 201, body
    return b, body["token"]


def pods_of(cluster: Lab, ns: str) -> list[dict[str, Any]]:
    data = json.loads(kubectl(cluster, f"get pods -n {ns} -l component=singleuser-server "
                                       "-o json"))
    return list(data["items"])


def used_gpus(cluster: Lab, ns: str, want: str | None = None, wait: float = 30) -> str:
    """The user's quota's used GPUs (the quota controller's status; waited for up to ``wait``
    seconds when ``want`` is given)."""
    deadline = time.monotonic() + wait
    while True:
        quota = json.loads(kubectl(cluster, f"get resourcequota gpuk8s-quota -n {ns} -o json"))
        used = str((quota.get("status") or {}).get("used", {}).get("requests.nvidia.com/gpu",
                                                                    ""))
        if want is None or used == want or time.monotonic() > deadline:
            return used
        time.sleep(2)


def start(ca: Path, token: str, user: str, profile: str, server: str = ""
          ) -> list[dict[str, Any]]:
    path = f"/hub/api/users/{user}/server{'s/' + server if server else ''}"
    code, body = call(ca, "POST", path, token, {"profile": profile})
    assert code in (201, 202), (code, body)
    return progress(ca, token, user, server)


def hub_log(cluster: Lab) -> str:
    _, out, err = cluster.ssh("cp-01", "kubectl --kubeconfig /etc/kubernetes/admin.conf logs "
                              "-n jupyterhub deployment/hub --tail=60")
    return out + err


@pytest.fixture(scope="module")
def users(hub: dict[str, Any], ca: Path, cluster: Lab) -> dict[str, tuple[Browser, str]]:
    try:
        return {u: sign_up_and_token(ca, u) for u in USERS}
    except (AssertionError, urllib.error.HTTPError) as e:
        raise AssertionError(f"{e}\nthe hub's log:\n{hub_log(cluster)}") from e


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the browser follows redirects itself


@pytest.fixture(scope="module")
def proxy_for(users: dict[str, tuple[Browser, str]], ca: Path) -> Iterator[str]:
    """A local HTTP port that forwards to the hub with alice's session cookie: headless
    Chromium sees the hub's pages as alice (it cannot be handed a cookie otherwise). Redirects
    and the cookies the hub and her server set (its OAuth round) go back to the browser."""
    session = users["alice"][0].cookie_header()
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(
        context=ssl.create_default_context(cafile=str(ca))), _NoRedirect)

    class Forward(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            cookies = "; ".join(c for c in (session, self.headers.get("Cookie", "")) if c)
            req = urllib.request.Request(BASE + self.path, headers={"Cookie": cookies})
            try:
                resp = opener.open(req, timeout=60)
                status, body, headers = resp.status, resp.read(), resp.headers
            except urllib.error.HTTPError as e:
                status, body, headers = e.code, e.read(), e.headers
            self.send_response(status)
            for k in ("Content-Type", "Location"):
                if headers.get(k):
                    self.send_header(k, headers[k].replace(BASE, ""))
            for cookie in headers.get_all("Set-Cookie") or []:
                self.send_header("Set-Cookie", cookie.replace("; Secure", ""))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def screenshot(url: str, name: str) -> tuple[Path, str]:
    SHOTS.mkdir(parents=True, exist_ok=True)
    shot = SHOTS / f"{name}.png"
    shot.unlink(missing_ok=True)
    proc = subprocess.run([chromium(), *FLAGS, f"--user-data-dir=/tmp/gpuk8s-hub-{name}",
                           "--window-size=1200,900", "--virtual-time-budget=20000",
                           f"--screenshot={shot}", "--dump-dom", url],
                          capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0 and shot.stat().st_size > 10_000, proc.stderr[-2000:]
    return shot, proc.stdout


def test_hub_runs_behind_https_with_the_cluster_ca(hub: dict[str, Any], cluster: Lab,
                                                   ca: Path) -> None:
    assert hub["ready"], hub["problems"]
    # the proxy's certificate verifies against the cluster CA for the node's address
    code, body = call(ca, "GET", "/hub/api/")
    assert code == 200 and body["version"] == "5.5.0", body
    # plain HTTP is not served on the hub's port
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(BASE.replace("https", "http") + "/hub/api/", timeout=10)
    # the hub can run pods in the users' namespaces and nowhere else
    answers = {}
    for ns in ("alice", "kube-system", "jupyterhub"):
        _, out, _ = cluster.ssh("cp-01", "kubectl --kubeconfig /etc/kubernetes/admin.conf auth "
                                f"can-i create pods -n {ns} --as "
                                "system:serviceaccount:jupyterhub:hub")
        answers[ns] = out.strip()
    assert answers == {"alice": "yes", "kube-system": "no", "jupyterhub": "no"}, answers


def test_only_inventory_users_sign_in(hub: dict[str, Any], ca: Path) -> None:
    b = Browser(ca)
    b.get("/hub/signup")
    b.form("/hub/signup", {"username": "mallory", "signup_password": "a-long-password-1",
                           "signup_password_confirmation": "a-long-password-1"})
    code, body = call(ca, "POST", "/hub/api/users/mallory/tokens",
                      body={"auth": {"username": "mallory", "password": "a-long-password-1"}})
    assert code == 403, (code, body)


def test_alice_and_bob_run_gpu_notebooks_in_their_namespaces(
        users: dict[str, tuple[Browser, str]], cluster: Lab, ca: Path, tf_venv: Path,
        proxy_for: str) -> None:
    # the profile list, as the spawn page shows it to alice
    _shot, dom = screenshot(f"{proxy_for}/hub/spawn", "profiles")
    for label in ("CPU only", "1 GPU", "2 GPUs"):
        assert label in dom, label
    started = time.monotonic()
    for user in USERS:
        events = start(ca, users[user][1], user, "gpu-1")
        assert events[-1].get("ready"), events[-3:]
        (pod,) = pods_of(cluster, user)
        assert pod["metadata"]["namespace"] == user
        assert pod["spec"]["nodeName"] in ("gpu-01", "gpu-02")
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "1"
        assert used_gpus(cluster, user, "1") == "1"
    print(f"\ntwo 1-GPU servers started: {time.monotonic() - started:.1f} s")
    # a notebook run through each server's API (through the proxy, over HTTPS)
    for user in USERS:
        token = users[user][1]
        base = f"{BASE}/user/{user}"
        code, _ = call(ca, "PUT", f"/user/{user}/api/contents/check.ipynb", token, {
            "type": "notebook", "format": "json", "content": {
                "nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{
                    "cell_type": "code", "metadata": {}, "outputs": [],
                    "execution_count": None, "id": "c1",
                    "source": "import tensorflow as tf, os\n"
                              "print('TensorFlow', tf.__version__)\n"
                              f"open('/home/jovyan/from-{user}.txt', 'w').write('hi')\n"
                              "print(os.getuid(), os.environ['HOME'])"}]}})
        assert code == 201, code
        out = subprocess.run([str(tf_venv / "bin" / "python"),
                              str(Path(__file__).with_name("notebook_run.py")), base, token,
                              "check.ipynb"], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "NOTEBOOK_CA": str(ca)})
        assert out.returncode == 0, out.stderr[-2000:]
        cells = json.loads(out.stdout)
        assert "TensorFlow 2.21.0" in cells[0]["output"], cells
        assert "1000 /home/jovyan" in cells[0]["output"]
        # the home is the user's folder on the NFS export
        assert (shared_dir() / EXPORT / "homes" / user / f"from-{user}.txt").read_text() == "hi"
    _shot, dom = screenshot(f"{proxy_for}/user/alice/tree", "notebook")
    assert "check.ipynb" in dom, dom[-3000:]


def test_bobs_second_gpu_server_is_refused_by_his_quota(
        users: dict[str, tuple[Browser, str]], cluster: Lab, ca: Path) -> None:
    events = start(ca, users["bob"][1], "bob", "gpu-1", server="second")
    assert events[-1].get("failed"), events[-3:]
    message = events[-1]["message"]
    assert "exceeded quota: gpuk8s-quota" in message, message
    assert "requested: requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=1, limited: " \
           "requests.nvidia.com/gpu=1" in message, message
    assert used_gpus(cluster, "bob", "1") == "1"
    # alice's quota is 2: her second GPU server starts
    events = start(ca, users["alice"][1], "alice", "gpu-1", server="second")
    assert events[-1].get("ready"), events[-3:]
    assert used_gpus(cluster, "alice", "2") == "2"


def test_idle_gpu_servers_stop_themselves_and_free_their_gpus(
        users: dict[str, tuple[Browser, str]], cluster: Lab) -> None:
    """gpuIdleTimeout: jupyter_server shuts down after GPU_IDLE s with no kernel and no
    activity (checked each minute), the hub's poll (30 s) sees it and KubeSpawner deletes the
    pod."""
    started = time.monotonic()
    deadline = started + GPU_IDLE + 300
    while time.monotonic() < deadline:
        left = {u: len(pods_of(cluster, u)) for u in USERS}
        if not any(left.values()):
            break
        time.sleep(10)
    assert not any(left.values()), left
    print(f"\nidle GPU servers culled {time.monotonic() - started:.1f} s after the test's "
          "last request")
    assert used_gpus(cluster, "alice", "0") == "0"
    assert used_gpus(cluster, "bob", "0") == "0"


def test_undeploy_keeps_homes_unless_purge(users: dict[str, tuple[Browser, str]],
                                           cluster: Lab, inv: Path, ca: Path) -> None:
    _result, text = run(workloads.undeploy, inv, "jupyterhub", sets=SETS)
    assert "kept: the users' homes" in text
    assert kubectl(cluster, "get deployments,services -n jupyterhub -o name").strip() == ""
    assert "claim-alice" in kubectl(cluster, "get pvc -n alice -o name")
    assert "jupyterhub-home-alice" in kubectl(cluster, "get pv -o name")
    assert kubectl(cluster, "get rolebindings -A -l gpuk8s.io/workload=jupyterhub "
                            "-o name").strip() == ""
    # deployed again, alice's sign-up (the hub's database) and her files are still there
    run(workloads.deploy, inv, "jupyterhub", sets=SETS, timeout=600)
    assert (shared_dir() / EXPORT / "homes/alice/from-alice.txt").exists()
    code, body = call(ca, "POST", "/hub/api/users/alice/tokens",
                      body={"auth": {"username": "alice", "password": PASSWORDS["alice"]}})
    assert code == 201, body
    _result, text = run(workloads.undeploy, inv, "jupyterhub", sets=SETS, purge=True)
    assert kubectl(cluster, "get pv -l gpuk8s.io/workload=jupyterhub -o name").strip() == ""
    assert kubectl(cluster, "get pvc -A -l gpuk8s.io/workload=jupyterhub -o name").strip() == ""
    assert re.search(r"the folders on 10\.88\.0\.1 stay", text), text
