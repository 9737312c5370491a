"""The workloads' scripts on the real TensorFlow 2.21.0 (Keras 3), run as their pods would run
them: each test renders the workload with `gpuk8s deploy NAME --render` (no host contacted),
takes the script from the rendered ConfigMap and the command and environment from the rendered
pod spec, and runs it. The shared volume is a temporary folder (--set storage.mountPath), so
the values reach the process through the manifest, never retyped here. Kubernetes' own parts
are played as Kubernetes plays them: JOB_COMPLETION_INDEX for an Indexed Job's pods, and each
distributed worker in its own network namespace whose /etc/hosts resolves the pods' DNS names
(what the headless Service does in a cluster)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "inventories" / "lab.yaml"
EPOCHS, BATCH = 6, 32   # real digits: about 0.9 test accuracy in a few seconds on 2 cores


def render(name: str, *sets: str) -> list[dict[str, Any]]:
    """`gpuk8s deploy NAME --render` (the real CLI), parsed."""
    argv = [sys.executable, "-m", "gpuk8s.cli", "deploy", name, "-i", str(INVENTORY),
            "--render", *(a for s in sets for a in ("--set", s))]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, [d["kind"] for d in docs]
    return found[0]


class Pod:
    """A rendered pod template as a local process: its ConfigMap volumes written out, its
    command and environment as the manifest gives them."""

    def __init__(self, docs: list[dict[str, Any]], workload: dict[str, Any], root: Path,
                 venv: Path) -> None:
        spec = workload["spec"]["template"]["spec"]
        self.container = spec["containers"][0]
        configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
        self.paths: dict[str, str] = {}   # mount path in the pod -> folder here
        for mount in self.container.get("volumeMounts", []):
            volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
            if "configMap" in volume:
                folder = root / mount["mountPath"].strip("/").replace("/", "_")
                folder.mkdir(parents=True, exist_ok=True)
                for fname, text in configmaps[volume["configMap"]["name"]]["data"].items():
                    (folder / fname).write_text(text)
                self.paths[mount["mountPath"]] = str(folder)
        self.venv = venv
        self.env = {e["name"]: str(e["value"]) for e in self.container.get("env", [])
                    if "value" in e}

    def argv(self) -> list[str]:
        out = []
        for word in self.container["command"] + self.container.get("args", []):
            for inside, here in self.paths.items():
                if word.startswith(inside + "/"):
                    word = here + word[len(inside):]
            if word in ("python3", "python"):
                word = str(self.venv / "bin" / "python")
            elif not word.startswith(("-", "/")) and (self.venv / "bin" / word).exists():
                word = str(self.venv / "bin" / word)
            out.append(word)
        return out

    def environ(self, **extra: str) -> dict[str, str]:
        return {"PATH": f"{self.venv / 'bin'}:/usr/bin:/bin", "HOME": os.environ["HOME"],
                "TF_CPP_MIN_LOG_LEVEL": "2", **self.env, **extra}

    def run(self, *prefix: str, timeout: float = 300, **extra: str
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*prefix, *self.argv()], env=self.environ(**extra),
                              capture_output=True, text=True, timeout=timeout)


def last_json(output: str) -> dict[str, Any]:
    lines = [ln for ln in output.splitlines() if ln.startswith("{")]
    assert lines, output[-3000:]
    return json.loads(lines[-1])


@pytest.fixture
def shared(tmp_path: Path, digits_npz: Path) -> Path:
    """The shared volume, holding real handwritten digits as <shared>/data/mnist.npz."""
    folder = tmp_path / "shared"
    (folder / "data").mkdir(parents=True)
    shutil.copyfile(digits_npz, folder / "data" / "mnist.npz")
    return folder


def test_training_on_real_digits_then_eval_of_its_checkpoint(
        tf_venv: Path, shared: Path, tmp_path: Path) -> None:
    sets = (f"storage.mountPath={shared}", f"epochs={EPOCHS}", f"batchSize={BATCH}",
            "run=digits")
    docs = render("tensorflow-job", *sets)
    pod = Pod(docs, one(docs, "Job"), tmp_path / "train-pod", tf_venv)
    assert pod.env["GPUK8S_SHARED"] == str(shared)
    trained = pod.run()
    assert trained.returncode == 0, trained.stderr[-4000:]
    summary = last_json(trained.stdout)
    assert summary["chief"] and summary["replicas"] == 1
    assert f"data: {shared}/data/mnist.npz: 1500 training and 297 test images" in trained.stdout
    checkpoint = shared / "checkpoints" / "digits" / "latest.keras"
    assert summary["checkpoint"] == str(checkpoint) and checkpoint.is_file()
    docs = render("eval", f"storage.mountPath={shared}", "run=digits")
    evaluated = Pod(docs, one(docs, "Job"), tmp_path / "eval-pod", tf_venv).run()
    assert evaluated.returncode == 0, evaluated.stderr[-4000:]
    result = last_json(evaluated.stdout)
    print(result)
    assert result["checkpoint"] == str(checkpoint)
    assert result["accuracy"] >= 0.85, result
    # the same weights on the same images (batched differently: at most a borderline image)
    assert abs(result["accuracy"] - summary["test_accuracy"]) <= 1 / 297 + 1e-9


def test_without_data_and_without_download_it_says_synthetic(
        tf_venv: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty-shared"
    empty.mkdir()
    docs = render("tensorflow-job", f"storage.mountPath={empty}", "epochs=1", "batchSize=256",
                  "datasetDownload=false")
    pod = Pod(docs, one(docs, "Job"), tmp_path / "pod", tf_venv)
    assert pod.env["GPUK8S_DOWNLOAD"] == "0"
    result = pod.run()
    assert result.returncode == 0, result.stderr[-3000:]
    assert "WARNING: no " in result.stderr and "SYNTHETIC random data" in result.stderr
    assert "data: synthetic" in result.stdout


# -- two workers, two network namespaces ------------------------------------------------------
def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def pod_network(hostnames: list[str]) -> Iterator[list[list[str]]]:
    """One network namespace per pod, joined by veth pairs on a bridge, each resolving every
    pod's DNS name through its own /etc/hosts (ip netns exec mounts /etc/netns/NS/hosts);
    yields the command prefix that runs a process in each."""
    tag = f"gk8tf{os.getpid() % 10000}"
    names = [f"{tag}-{i}" for i in range(len(hostnames))]
    bridge = f"{tag}br"
    addresses = [f"10.89.{os.getpid() % 200}.{i + 1}" for i in range(len(hostnames))]
    hosts = "127.0.0.1 localhost\n" + "".join(
        f"{a} {h.split(':')[0]}\n" for a, h in zip(addresses, hostnames, strict=True))
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("link", "set", bridge, "up")
        for i, (ns, addr) in enumerate(zip(names, addresses, strict=True)):
            _ip("netns", "add", ns)
            _ip("link", "add", f"{tag}h{i}", "type", "veth", "peer", "name", f"{tag}p{i}")
            _ip("link", "set", f"{tag}h{i}", "master", bridge, "up")
            _ip("link", "set", f"{tag}p{i}", "netns", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", f"{tag}p{i}")
            _ip("-n", ns, "link", "set", f"{tag}p{i}", "up")
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts)
        yield [["ip", "netns", "exec", ns] for ns in names]
    finally:
        for i, ns in enumerate(names):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            subprocess.run(["ip", "link", "del", f"{tag}h{i}"], capture_output=True)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def test_two_workers_synchronise_and_only_the_chief_writes(
        tf_venv: Path, shared: Path, tmp_path: Path) -> None:
    docs = render("distributed-tf", f"storage.mountPath={shared}", f"epochs={EPOCHS}",
                  f"batchSize={BATCH}", "workers=2")
    job = one(docs, "Job")
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2
    pod = Pod(docs, job, tmp_path / "pod", tf_venv)
    env = pod.env
    names = [f"{env['GPUK8S_JOB']}-{i}.{env['GPUK8S_SERVICE']}.{env['GPUK8S_NS']}.svc"
             for i in range(int(env["GPUK8S_WORKERS"]))]
    with pod_network(names) as prefixes:
        procs = [subprocess.Popen([*prefix, *pod.argv()], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True,
                                  env=pod.environ(JOB_COMPLETION_INDEX=str(i)))
                 for i, prefix in enumerate(prefixes)]
        outputs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, f"{out[-2000:]}\n{err[-4000:]}"
    results = [last_json(out) for out, _ in outputs]
    for i, r in enumerate(results):
        print(r)
        assert r["task"] == {"type": "worker", "index": i} and r["replicas"] == 2
    # the strategy really synchronised: both workers end with the very same weights
    assert results[0]["weights_sha256"] == results[1]["weights_sha256"]
    assert results[0]["test_accuracy"] >= 0.85
    # the chief (worker 0) alone wrote the checkpoint and the logs
    assert results[0]["chief"] and not results[1]["chief"]
    run = env["GPUK8S_RUN"]
    assert [p.name for p in (shared / "checkpoints").iterdir()] == [run]
    assert [p.name for p in (shared / "checkpoints" / run).iterdir()] == ["latest.keras"]
    events = list((shared / "logs" / run).iterdir())
    assert len(events) == 1 and events[0].name.startswith("events.out.tfevents.")
    assert "TF_CONFIG" in outputs[1][0] and names[0] in outputs[1][0]


# -- TensorBoard ------------------------------------------------------------------------------
def test_real_tensorboard_serves_the_training_scalars(tf_venv: Path, shared: Path,
                                                      tmp_path: Path) -> None:
    docs = render("tensorflow-job", f"storage.mountPath={shared}", "epochs=2",
                  f"batchSize={BATCH}", "run=tb")
    trained = Pod(docs, one(docs, "Job"), tmp_path / "train", tf_venv).run()
    assert trained.returncode == 0, trained.stderr[-3000:]
    docs = render("tensorboard", f"storage.mountPath={shared}")
    board = Pod(docs, one(docs, "Deployment"), tmp_path / "tb", tf_venv)
    port = next(str(p["containerPort"]) for p in board.container["ports"])
    fetch = ("import sys, urllib.request\n"
             "print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())")
    with pod_network(["tensorboard"]) as (prefix,):
        server = subprocess.Popen([*prefix, *board.argv()], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=board.environ())
        try:
            def get(path: str) -> Any:
                out = subprocess.run([*prefix, str(tf_venv / "bin" / "python"), "-c", fetch,
                                      f"http://127.0.0.1:{port}{path}"],
                                     capture_output=True, text=True, timeout=30)
                return json.loads(out.stdout) if out.returncode == 0 else None

            deadline = time.monotonic() + 120
            runs = None
            while time.monotonic() < deadline and not runs:
                assert server.poll() is None, server.stdout.read() if server.stdout else ""
                runs = get("/data/runs")
                time.sleep(0.5)
            assert runs is not None and "tb" in runs, runs
            scalars = get("/data/plugin/scalars/scalars?run=tb&tag=accuracy")
            assert [step for _, step, _ in scalars] == [0, 1]
            assert all(0 < value <= 1 for _, _, value in scalars)
        finally:
            server.terminate()
            server.wait(timeout=30)


# -- the starter notebook ---------------------------------------------------------------------
RUN_NOTEBOOK = """
import sys
import nbformat
from nbclient import NotebookClient

nb = nbformat.reads(sys.stdin.read(), as_version=4)
NotebookClient(nb, kernel_name="python3", timeout=300).execute()
for cell in nb.cells:
    for out in cell.get("outputs", []):
        print(out.get("text", ""), end="")
"""


def test_the_starter_notebook_runs_to_the_end(tf_venv: Path) -> None:
    docs = render("jupyter")
    notebooks = [text for d in docs if d["kind"] == "ConfigMap"
                 for name, text in d["data"].items() if name.endswith(".ipynb")]
    assert len(notebooks) == 1
    out = subprocess.run([str(tf_venv / "bin" / "python"), "-c", RUN_NOTEBOOK],
                         input=notebooks[0], capture_output=True, text=True, timeout=300,
                         env={"PATH": f"{tf_venv / 'bin'}:/usr/bin:/bin",
                              "HOME": os.environ["HOME"], "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "TensorFlow 2.21.0" in out.stdout
    assert "0 GPU(s):" in out.stdout   # this machine has none; the count line is printed
