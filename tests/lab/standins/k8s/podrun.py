# LAB STAND-IN: not the real kubelet or CRI. Test infrastructure for gpuk8s; never shipped.
"""One pod, run for real through the node's containerd: the part of the kubelet and of
containerd's CRI plugin that the lab cannot have, played with the real programs underneath.

The kubelet stand-in writes the pod's resolved spec (`spec.json`: images, argv, env, mounts,
limits, GPUs) and starts this module as a transient systemd unit per pod; it reports back
through `status.json` beside it (container states, pod IP, events), which the kubelet copies
into the pod's status. What is real: the image pull (`ctr images pull --hosts-dir
/etc/containerd/certs.d`, so the node's registry mirrors apply exactly as for the CRI plugin),
the containers (`ctr run` with runc: the command, env, mounts, memory limit and CPU quota in
their cgroups, exit codes, output), OOM kills (containerd's /tasks/oom event, as the CRI plugin
learns them) and the pod network (a network namespace per pod set up by the node's real CNI
plugins from /etc/cni/net.d). What is not: the "nvidia" runtime handler; GPU pods get the
node's nvidia-smi stand-in and fake GPU state bind-mounted, limited to their allocated GPUs,
the way the NVIDIA container toolkit injects the host driver's files."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

Obj = dict[str, Any]
CTR = ["ctr", "-n", "k8s.io"]
HOSTS_DIR = "/etc/containerd/certs.d"
CNI_CONF_DIR = "/etc/cni/net.d"
CNI_BIN_DIR = "/opt/cni/bin"
BACKOFF_MAX = 60.0
#: what the NVIDIA container toolkit would inject from the host driver, here the lab's stand-ins
GPU_MOUNTS = ("/usr/bin/nvidia-smi", "/usr/lib/gpuk8s-lab/nvidia", "/run/nvidia-lab",
              "/sys/bus/pci/devices")
#: nvidia-container-runtime's config, read at each container's creation
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
#: where the device plugin's volume-mounts strategy names the allocated devices
#: (internal/config/image/cuda_image.go@v1.20.0 DeviceListAsVolumeMountsRoot)
DEVICE_MOUNT_ROOT = "/var/run/nvidia-container-devices"


def toolkit_settings(text: str | None) -> tuple[bool, bool]:
    """(accept-nvidia-visible-devices-envvar-when-unprivileged,
    accept-nvidia-visible-devices-as-volume-mounts) from the runtime's config.toml; a key not
    set (or commented out) has the toolkit's default, true and false (api/config/v1/
    config.go@v1.20.0 GetDefault)."""
    import tomllib

    try:
        doc = tomllib.loads(text or "")
    except (tomllib.TOMLDecodeError, ValueError):
        doc = {}
    envvar = doc.get("accept-nvidia-visible-devices-envvar-when-unprivileged", True)
    mounts = doc.get("accept-nvidia-visible-devices-as-volume-mounts", False)
    return envvar is True, mounts is True


def runtime_devices(env: dict[str, str], mounts: list[Obj], privileged: bool,
                    settings: tuple[bool, bool]) -> list[str] | None:
    """The devices nvidia-container-runtime gives a container (CUDA.VisibleDevices,
    internal/config/image/cuda_image.go@v1.20.0): with volume mounts accepted, the names of
    the mounts under /var/run/nvidia-container-devices, if any; else NVIDIA_VISIBLE_DEVICES
    (the container's env: the device plugin's, then the pod's own over it, then the image's
    below both), honoured only in a privileged container (CAP_SYS_ADMIN) or with the
    envvar key true. Returns the requests as written ("all", indexes or UUIDs); [] for none.
    None: "all"."""
    accept_envvar, accept_mounts = settings
    if accept_mounts:
        names = [m["dst"][len(DEVICE_MOUNT_ROOT) + 1:] for m in mounts
                 if str(m.get("dst", "")).startswith(DEVICE_MOUNT_ROOT + "/")]
        names = [n for n in names if n and not n.startswith("imex/")]
        if names:
            return names
    value = env.get("NVIDIA_VISIBLE_DEVICES")
    requests = [] if value is None else [v.strip() for v in value.split(",") if v.strip()]
    if not requests or requests in (["void"], ["none"]) or not (privileged or accept_envvar):
        return []
    return None if "all" in requests else requests


def ts() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def image_ref(image: str) -> str:
    """A pod's image as containerd names it (docker.io/library/busybox:latest)."""
    name, _, digest = image.partition("@")
    first = name.split("/", 1)[0]
    if "/" not in name or ("." not in first and ":" not in first and first != "localhost"):
        name = f"docker.io/{name if '/' in name else 'library/' + name}"
    if not digest and ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return f"{name}@{digest}" if digest else name


def ctr(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([*CTR, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, 124, "", "ctr: timed out\n")


def ctr_error(text: str) -> str:
    """containerd's message from ctr's stderr (its last `ctr: ` line)."""
    lines = [ln for ln in text.strip().splitlines() if ln.startswith("ctr: ")]
    return lines[-1][5:] if lines else text.strip().splitlines()[-1] if text.strip() else ""


def _device_uuid(request: str) -> str:
    """A device request as the runtime resolves it: a GPU index is the node's GPU of that
    index (its UUID, which the nvidia-smi stand-in filters on); a UUID stays."""
    if not request.isdigit():
        return request
    sys.path.insert(0, "/usr/lib/gpuk8s-lab/nvidia")
    try:
        import labgpu  # type: ignore[import-not-found]

        got = [g.uuid for g in labgpu.gpus() if g.index == int(request)]
    except (ImportError, OSError):
        got = []
    return got[0] if got else request


class CNI:
    """The pod's network namespace, made by the node's CNI config and plugins as the CRI
    plugin does: each plugin of the first conflist in turn, the previous one's result passed
    on (DEL in reverse order)."""

    def __init__(self, uid: str) -> None:
        self.netns = f"gpuk8s-{uid[:13]}"
        self.path = f"/var/run/netns/{self.netns}"
        self.container_id = uid.replace("-", "")

    def config(self) -> Obj:
        names = sorted(f for f in os.listdir(CNI_CONF_DIR)
                       if f.endswith((".conflist", ".conf", ".json")))
        if not names:
            raise RuntimeError("cni plugin not initialized")
        with open(os.path.join(CNI_CONF_DIR, names[0])) as f:
            conf: Obj = json.load(f)
        if "plugins" not in conf:  # a single-plugin .conf
            conf = {"name": conf.get("name"), "cniVersion": conf.get("cniVersion"),
                    "plugins": [conf]}
        return conf

    def _invoke(self, command: str, plugin: Obj, net: Obj, prev: Obj | None,
                ports: list[Obj]) -> Obj:
        conf = {**plugin, "name": net.get("name"), "cniVersion": net.get("cniVersion", "0.3.1")}
        if prev is not None:
            conf["prevResult"] = prev
        caps = plugin.get("capabilities") or {}
        if caps.get("portMappings") and ports:
            conf["runtimeConfig"] = {"portMappings": ports}
        env = {**os.environ, "CNI_COMMAND": command, "CNI_CONTAINERID": self.container_id,
               "CNI_NETNS": self.path, "CNI_IFNAME": "eth0", "CNI_PATH": CNI_BIN_DIR}
        binary = os.path.join(CNI_BIN_DIR, plugin["type"])
        if not os.access(binary, os.X_OK):
            raise RuntimeError(f'failed to find plugin "{plugin["type"]}" in path '
                               f"[{CNI_BIN_DIR}]")
        p = subprocess.run([binary], input=json.dumps(conf), capture_output=True, text=True,
                           env=env, timeout=60)
        out: Obj = json.loads(p.stdout) if p.stdout.strip().startswith("{") else {}
        if p.returncode != 0:
            msg = out.get("msg") or p.stderr.strip() or f"exit {p.returncode}"
            raise RuntimeError(f'plugin type="{plugin["type"]}" failed ({command.lower()}): '
                               f"{msg}")
        return out

    def add(self, ports: list[Obj]) -> str:
        subprocess.run(["ip", "netns", "add", self.netns], capture_output=True)
        subprocess.run(["ip", "-n", self.netns, "link", "set", "lo", "up"], capture_output=True)
        net = self.config()
        result: Obj | None = None
        for plugin in net["plugins"]:
            result = self._invoke("ADD", plugin, net, result, ports) or result
        ips = (result or {}).get("ips") or []
        if not ips:
            raise RuntimeError("the CNI result has no IP address")
        return str(ips[0]["address"]).split("/")[0]

    def delete(self, ports: list[Obj]) -> None:
        try:
            net = self.config()
            for plugin in reversed(net["plugins"]):
                try:
                    self._invoke("DEL", plugin, net, None, ports)
                except (RuntimeError, subprocess.SubprocessError) as e:
                    print(f"CNI DEL: {e}", file=sys.stderr)
        except (OSError, RuntimeError, ValueError) as e:
            print(f"CNI DEL: {e}", file=sys.stderr)
        subprocess.run(["ip", "netns", "delete", self.netns], capture_output=True)


class Pod:
    def __init__(self, state_dir: str) -> None:
        self.dir = state_dir
        with open(os.path.join(state_dir, "spec.json")) as f:
            self.spec: Obj = json.load(f)
        self.uid: str = self.spec["uid"]
        self.status: Obj = {"phase": "Pending", "podIP": None, "events": [],
                            "initContainers": {}, "containers": {}}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.tasks: dict[str, str] = {}   # container name -> running task id
        self.cni = None if self.spec.get("hostNetwork") else CNI(self.uid)

    # ---------------------------------------------------------------- reporting
    def save(self) -> None:
        with self.lock:
            tmp = os.path.join(self.dir, "status.json.tmp")
            with open(tmp, "w") as f:
                json.dump(self.status, f)
            os.replace(tmp, os.path.join(self.dir, "status.json"))

    def event(self, etype: str, reason: str, message: str) -> None:
        with self.lock:
            self.status["events"].append([etype, reason, message])
        self.save()

    def set_state(self, group: str, name: str, state: Obj, **extra: Any) -> None:
        with self.lock:
            entry = self.status[group].setdefault(name, {"restartCount": 0})
            if "terminated" in entry.get("state", {}) and "terminated" not in state:
                entry["lastState"] = entry["state"]
            entry["state"] = state
            entry.update(extra)
        self.save()

    def write_pod_files(self) -> None:
        """/etc/hosts, /etc/hostname and /etc/resolv.conf as the kubelet makes them for every
        container of the pod: its own names, the cluster DNS and the search path."""
        sp, ip = self.spec, self.status["podIP"]
        names = sp["hostname"]
        if sp.get("subdomain"):
            names = (f"{sp['hostname']}.{sp['subdomain']}.{sp['namespace']}.svc."
                     f"{sp['clusterDomain']}\t{sp['hostname']}")
        hosts = ("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost "
                 "ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\n"
                 "fe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n")
        if self.cni is not None:
            hosts += f"{ip}\t{names}\n"
        if self.cni is None or sp.get("dnsPolicy") == "Default":
            with open("/etc/resolv.conf") as f:   # the node's own resolver
                resolv = f.read()
        else:
            domain = sp["clusterDomain"]
            search = (f"{sp['namespace']}.svc.{domain} svc.{domain} {domain}")
            resolv = ("".join(f"nameserver {ns}\n" for ns in sp["clusterDNS"]) +
                      f"search {search}\noptions ndots:5\n")
        for name, text in (("hosts", hosts), ("hostname", sp["hostname"] + "\n"),
                           ("resolv.conf", resolv)):
            with open(os.path.join(self.dir, name), "w") as f:
                f.write(text)

    # ---------------------------------------------------------------- images
    def pull(self, group: str, c: Obj) -> bool:
        ref, image = image_ref(c["image"]), c["image"]
        policy = c.get("imagePullPolicy") or "IfNotPresent"
        have = ctr("images", "ls", "-q", f"name=={ref}").stdout.strip() != ""
        if have and policy != "Always":
            self.event("Normal", "Pulled", f'Container image "{image}" already present on '
                       "machine")
            return True
        if policy == "Never":
            msg = f'Container image "{image}" is not present with pull policy of Never'
            self.set_state(group, c["name"], {"waiting": {"reason": "ErrImageNeverPull",
                                                          "message": msg}})
            self.event("Warning", "ErrImageNeverPull", msg)
            return False
        delay = 10.0
        while not self.stopping.is_set():
            self.event("Normal", "Pulling", f'Pulling image "{image}"')
            start = time.monotonic()
            p = ctr("images", "pull", "--hosts-dir", HOSTS_DIR, ref)
            if p.returncode == 0:
                self.event("Normal", "Pulled", f'Successfully pulled image "{image}" in '
                           f"{time.monotonic() - start:.3f}s")
                return True
            err = (f'failed to pull and unpack image "{ref}": {ctr_error(p.stderr)}')
            msg = f'Failed to pull image "{image}": {err}'
            self.set_state(group, c["name"], {"waiting": {"reason": "ErrImagePull",
                                                          "message": msg}})
            self.event("Warning", "Failed", msg)
            self.event("Warning", "Failed", "Error: ErrImagePull")
            time.sleep(2)
            # the back-off keeps the pull's error in its message, as recent kubelets do
            self.set_state(group, c["name"], {"waiting": {
                "reason": "ImagePullBackOff",
                "message": f'Back-off pulling image "{image}": ErrImagePull: {msg}'}})
            self.event("Normal", "BackOff", f'Back-off pulling image "{image}"')
            self.stopping.wait(delay)
            delay = min(delay * 2, BACKOFF_MAX)
        return False

    @staticmethod
    def image_config(ref: str) -> Obj:
        """The image's config (Entrypoint, Cmd, WorkingDir) from the node's content store."""
        rows = ctr("images", "ls", f"name=={ref}").stdout.splitlines()[1:]
        if not rows:
            return {}
        digest = rows[0].split()[2]
        doc = json.loads(ctr("content", "get", digest).stdout or "{}")
        if "manifests" in doc:  # an index: the linux/amd64 manifest
            entry = next((m for m in doc["manifests"] if (m.get("platform") or {}).get(
                "architecture", "amd64") == "amd64"), doc["manifests"][0])
            doc = json.loads(ctr("content", "get", entry["digest"]).stdout or "{}")
        config = json.loads(ctr("content", "get", doc["config"]["digest"]).stdout or "{}")
        return dict(config.get("config") or {})

    # ---------------------------------------------------------------- containers
    def argv(self, c: Obj, ref: str) -> list[str]:
        """Kubernetes' rule: command replaces the image's Entrypoint, args its Cmd."""
        cfg = self.image_config(ref)
        entry = c["command"] if c.get("command") is not None else cfg.get("Entrypoint") or []
        if c.get("args") is not None:
            args = c["args"]
        elif c.get("command") is not None:
            args = []
        else:
            args = cfg.get("Cmd") or []
        return [*entry, *args]

    def run_container(self, group: str, c: Obj, restart: int) -> tuple[int, str, str]:
        """Run one container to its end; (exit code, reason, message)."""
        ref = image_ref(c["image"])
        argv = self.argv(c, ref)
        if not argv:
            return 128, "StartError", "no command specified"
        task = f"{c['name']}-{self.uid[:8]}-{restart}"
        flags = ["--snapshotter", "native", "--rm"]
        if self.cni is not None:
            flags += ["--with-ns", f"network:{self.cni.path}"]
        else:
            flags += ["--net-host"]
        if c.get("workingDir"):
            flags += ["--cwd", c["workingDir"]]
        flags += ["--hostname", self.spec["hostname"]]
        if c.get("user"):   # the pod's runAsUser:runAsGroup, as the CRI sets the process user
            flags += ["--user", c["user"]]
        env = dict(c.get("env") or {})
        mounts = list(c.get("mounts") or []) + [
            {"src": os.path.join(self.dir, name), "dst": f"/etc/{name}", "ro": False}
            for name in ("hosts", "hostname", "resolv.conf")]
        gpus = self.spec.get("gpus") or []
        visible: list[str] | None = []
        if gpus and self.spec.get("cdi"):
            # a DRA claim's devices come through CDI: NVIDIA's CDI spec sets "void"
            env.update({"NVIDIA_VISIBLE_DEVICES": "void"})
            visible = list(gpus)
        elif self.spec.get("gpuRuntime"):
            # the kubelet puts the device plugin's Allocate answer (envs, mounts) under the
            # container's own env (kubelet_pods.go: device envs first, the spec's after them,
            # so a pod's NVIDIA_VISIBLE_DEVICES wins); the image's env is below both
            alloc = self.spec.get("deviceAllocation") or {} if gpus else {}
            image_env = dict(e.partition("=")[::2] for e in
                             self.image_config(image_ref(c["image"])).get("Env") or [])
            env = {**alloc.get("envs", {}), **env}
            mounts += [{"src": m["hostPath"], "dst": m["containerPath"], "ro": True}
                       for m in alloc.get("mounts", [])]
            try:
                with open(TOOLKIT_CONFIG) as f:
                    config: str | None = f.read()
            except OSError:
                config = None
            visible = runtime_devices({**image_env, **env}, mounts, bool(c.get("privileged")),
                                      toolkit_settings(config))
            visible = None if visible is None else [_device_uuid(d) for d in visible]
        if visible is None or visible:
            if visible is not None:
                env["GPUK8S_LAB_VISIBLE_GPUS"] = ",".join(visible)
            mounts += [{"src": p, "dst": p, "ro": True} for p in GPU_MOUNTS
                       if os.path.exists(p)]
            # the GPUs' UUIDs derive from their host (labgpu.HOST_ID_FILE)
            mounts.append({"src": "/etc/machine-id", "dst": "/etc/gpuk8s-lab-gpu-host-id",
                           "ro": True})
        for k, v in env.items():
            flags += ["--env", f"{k}={v}"]
        for m in mounts:
            flags += ["--mount", f"type=bind,src={m['src']},dst={m['dst']},"
                                 f"options=rbind:{'ro' if m.get('ro') else 'rw'}"]
        if c.get("memory"):
            flags += ["--memory-limit", str(c["memory"])]
        if c.get("cpus"):
            flags += ["--cpus", str(c["cpus"])]
        log_dir = os.path.join(self.spec["logDir"], c["name"])
        os.makedirs(log_dir, exist_ok=True)
        log_path = os.path.join(log_dir, f"{restart}.log")
        oom = threading.Event()
        events = subprocess.Popen([*CTR, "events"], stdout=subprocess.PIPE, text=True,
                                  stderr=subprocess.DEVNULL)

        def watch() -> None:
            for line in events.stdout or []:
                if "/tasks/oom" in line and f'"{task}"' in line:
                    oom.set()

        threading.Thread(target=watch, daemon=True).start()
        started = ts()
        self.set_state(group, c["name"], {"running": {"startedAt": started}},
                       restartCount=restart)
        self.event("Normal", "Started", f"Started container {c['name']}")
        with open(log_path, "wb") as log:
            with self.lock:
                self.tasks[c["name"]] = task
            proc = subprocess.Popen([*CTR, "run", *flags, ref, task, *argv], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            code = proc.wait()
            with self.lock:
                self.tasks.pop(c["name"], None)
        time.sleep(0.3)  # the OOM event can trail the exit
        events.terminate()
        with open(log_path, "rb") as f:
            lines = f.read().decode(errors="replace").splitlines()
        if code != 0 and lines and lines[-1].startswith("ctr: "):
            # ctr's own failure (the task never ran): what the CRI reports as StartError
            with open(log_path, "w") as out:
                out.write("\n".join(lines[:-1]) + ("\n" if lines[:-1] else ""))
            return 128, "StartError", lines[-1][5:]
        if oom.is_set():
            return code, "OOMKilled", ""
        return code, ("Completed" if code == 0 else "Error"), ""

    def run_loop(self, group: str, c: Obj, policy: str) -> int:
        """A container and its restarts (restartPolicy), until it is done or the pod stops."""
        restart, delay = 0, 10.0
        while not self.stopping.is_set():
            started = ts()
            code, reason, message = self.run_container(group, c, restart)
            term = {"exitCode": code, "reason": reason, "startedAt": started,
                    "finishedAt": ts(), **({"message": message} if message else {})}
            self.set_state(group, c["name"], {"terminated": term}, restartCount=restart)
            if self.stopping.is_set() or policy == "Never" or (
                    policy == "OnFailure" and code == 0):
                return code
            self.event("Warning", "BackOff", f"Back-off restarting failed container "
                       f"{c['name']} in pod {self.spec['name']}_{self.spec['namespace']}"
                       f"({self.uid})")
            self.set_state(group, c["name"], {"waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {delay:.0f}s restarting failed container={c['name']} "
                           f"pod={self.spec['name']}_{self.spec['namespace']}({self.uid})"}},
                restartCount=restart)
            self.stopping.wait(delay)
            delay = min(delay * 2, BACKOFF_MAX)
            restart += 1
        return 137

    # ---------------------------------------------------------------- the pod
    def run(self) -> None:
        policy = self.spec.get("restartPolicy") or "Always"
        try:
            self.status["podIP"] = (self.spec["nodeIP"] if self.cni is None
                                    else self.cni.add(self.spec.get("hostPorts") or []))
        except (OSError, RuntimeError, ValueError) as e:
            self.event("Warning", "FailedCreatePodSandBox", "Failed to create pod sandbox: rpc "
                       "error: code = Unknown desc = failed to setup network for sandbox "
                       f'"{self.uid}": {e}')
            return
        self.write_pod_files()
        self.save()
        for group in ("initContainers", "containers"):
            for c in self.spec.get(group) or []:
                if not self.pull(group, c):
                    return
        for c in self.spec.get("initContainers") or []:
            code = self.run_loop("initContainers", c, "Never" if policy == "Never"
                                 else "OnFailure")
            if code != 0:
                self.status["phase"] = "Failed"
                self.save()
                return
        with self.lock:
            self.status["phase"] = "Running"
        self.save()
        codes: dict[str, int] = {}
        threads = [threading.Thread(target=lambda c=c: codes.__setitem__(
            c["name"], self.run_loop("containers", c, policy))) for c in self.spec["containers"]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if not self.stopping.is_set():
            with self.lock:
                self.status["phase"] = ("Succeeded" if all(v == 0 for v in codes.values())
                                        else "Failed")
            self.save()

    def stop(self, grace: float) -> None:
        """SIGTERM to the running tasks, SIGKILL after the grace period (kubectl delete)."""
        self.stopping.set()
        with self.lock:
            tasks = list(self.tasks.values())
        for task in tasks:
            ctr("tasks", "kill", "-s", "SIGTERM", task, timeout=10)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(
                ctr("tasks", "ls", "-q").stdout.split().count(t) for t in tasks):
            time.sleep(0.5)
        for task in tasks:
            ctr("tasks", "kill", "-s", "SIGKILL", task, timeout=10)

    def cleanup(self) -> None:
        if self.cni is not None:
            self.cni.delete(self.spec.get("hostPorts") or [])


def main(argv: list[str]) -> int:
    pod = Pod(argv[0])
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(
        target=pod.stop, args=(float(pod.spec.get("grace", 30)),), daemon=True).start())
    try:
        pod.run()
    finally:
        # a pod that has ended gives its network back at once, as the kubelet stops the
        # sandbox of a terminated pod; the unit ends and the kubelet reads status.json
        pod.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
