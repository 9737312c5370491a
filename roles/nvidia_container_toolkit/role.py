"""nvidia_container_toolkit: the pinned toolkit, the nvidia runtime in containerd, and the
runtime's GPU isolation settings (a pod's own NVIDIA_VISIBLE_DEVICES is ignored; the device
plugin's volume mounts name the GPUs a container gets)."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from typing import Any

from gpuk8s.checks import Rule, check_fingerprint, check_xyz, pinned_key
from gpuk8s.facts import Fact
from gpuk8s.facts.kube import Containerd
from gpuk8s.facts.system import Files, FileState, Packages, PciDevices
from gpuk8s.ops import Op, change, files, noop
from gpuk8s.ops.apt import packages, repo
from gpuk8s.ops.services import restart_containerd
from gpuk8s.roles import HostContext

LIST = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
KEYRING = "/etc/apt/keyrings/nvidia-container-toolkit-keyring.gpg"
DROP_IN = "/etc/containerd/conf.d/99-nvidia.toml"
#: nvidia-container-runtime's config (config.GetConfigFilePath()@v1.20.0)
RUNTIME_CONFIG = "/etc/nvidia-container-runtime/config.toml"
#: GPU isolation: an unprivileged container's NVIDIA_VISIBLE_DEVICES (its pod's env or its
#: image's) is ignored, and the devices come from the mounts under
#: /var/run/nvidia-container-devices that the device plugin's volume-mounts strategy adds for
#: the GPUs the kubelet allocated (internal/config/image/cuda_image.go@v1.20.0 VisibleDevices:
#: mounts first when accepted, the variable only for a container with CAP_SYS_ADMIN or with
#: the first key true; the toolkit's defaults are true and false: api/config/v1/config.go and
#: toml.go commentDefaults@v1.20.0). Set with `nvidia-ctk config --set` (cmd/nvidia-ctk/config/
#: config.go@v1.20.0), which the package's postinst keeps on upgrades (it runs `nvidia-ctk
#: config --in-place` on the same file: packaging/debian/nvidia-container-toolkit-base.postinst).
ISOLATION = {"accept-nvidia-visible-devices-envvar-when-unprivileged": False,
             "accept-nvidia-visible-devices-as-volume-mounts": True}
#: NVIDIA's fix for containers that lose their GPUs ("Failed to initialize NVML: Unknown
#: Error") after `systemctl daemon-reload` under the systemd cgroup driver: runc needs a
#: /dev/char/MAJOR:MINOR link for each NVIDIA device node, which udev does not make for them.
#: The rule and its file are NVIDIA's, word for word, from the workaround of the NOTICE issue
#: NVIDIA/nvidia-container-toolkit#48 (also NVIDIA/nvidia-docker#1671 and #1730,
#: NVIDIA/gpu-operator#485): at each load of the nvidia driver, `nvidia-ctk system
#: create-dev-char-symlinks --create-all` (flags as cmd/nvidia-ctk/system/
#: create-dev-char-symlinks/create-dev-char-symlinks.go@v1.20.0 defines them; an existing
#: link is a warning and exit 0, so running it again is harmless). The same text says to run
#: the command once after the modules are loaded: the op does, when the driver is loaded.
#: With the toolkit's default runtime mode (auto, jit-cdi since v1.18) containerd's path is
#: not the affected hook path, so this is defence in depth (docs/research/
#: issue-32-upstream-facts.md section 1).
DEV_CHAR_RULES = "/lib/udev/rules.d/71-nvidia-dev-char.rules"
DEV_CHAR_RULE = ('ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", '
                 'RUN+="/usr/bin/nvidia-ctk system create-dev-char-symlinks --create-all"\n')
PACKAGES = ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
            "libnvidia-container-tools", "libnvidia-container1")


#: this role's variables beyond their type (their defaults are in defaults.yaml)
RULES: dict[str, Rule] = {
    "nvidia_container_toolkit_repo_key_fingerprint": Rule(check_fingerprint, across=pinned_key(
        "nvidia_container_toolkit_repo_key_url",
        "nvidia_container_toolkit_repo_key_fingerprint")),
    "nvidia_container_toolkit_version": Rule(check_xyz),
}


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [PciDevices(), Containerd(), Packages(*PACKAGES), Files(LIST, "+" + KEYRING, DROP_IN),
            Files("+" + RUNTIME_CONFIG), Files(DEV_CHAR_RULES)]


def isolation_settings(content: bytes | None) -> dict[str, object]:
    """The isolation keys the runtime's config.toml sets (a commented default is unset)."""
    try:
        got = tomllib.loads((content or b"").decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return {}
    return {k: got[k] for k in ISOLATION if k in got}


def isolation_op(content: bytes | None, exists: bool) -> Op:
    title = "nvidia_container_toolkit | GPU isolation"
    if exists and isolation_settings(content) == ISOLATION:
        return noop(title, "= an unprivileged container's NVIDIA_VISIBLE_DEVICES is ignored; "
                    "GPUs come from the device plugin's volume mounts")
    sets = " ".join(f"--set {k}={str(v).lower()}" for k, v in ISOLATION.items())
    return change(title, f"+ {RUNTIME_CONFIG}: ignore NVIDIA_VISIBLE_DEVICES of unprivileged "
                  "containers, take the device list from volume mounts",
                  f"nvidia-ctk config --config-file={RUNTIME_CONFIG} --in-place {sets}")


def plan(ctx: HostContext) -> list[Op]:
    f = ctx.facts
    if not any(d.is_gpu for d in f[PciDevices()]):
        return []
    states = f[Files(LIST, "+" + KEYRING, DROP_IN)]
    ops = [repo(states[LIST], states[KEYRING], "nvidia_container_toolkit | apt repo",
                name="nvidia-container-toolkit",
                url=ctx.var("nvidia_container_toolkit_repo_url"),
                suite="/", components="",
                key_url=ctx.var("nvidia_container_toolkit_repo_key_url"),
                fingerprint=ctx.var("nvidia_container_toolkit_repo_key_fingerprint"),
                fingerprint_var="nvidia_container_toolkit_repo_key_fingerprint",
                apt=ctx.apt)]
    version = f"{ctx.var('nvidia_container_toolkit_version')}-"
    pkg_op = packages(f[Packages(*PACKAGES)], "nvidia_container_toolkit | packages",
                      dict.fromkeys(PACKAGES, version), hold=True,
                      apt=ctx.apt)
    ops.append(pkg_op)
    runtime_config = f[Files("+" + RUNTIME_CONFIG)][RUNTIME_CONFIG]
    ops.append(isolation_op(runtime_config.content, runtime_config.exists))
    ops.append(dev_char_op(f[Files(DEV_CHAR_RULES)][DEV_CHAR_RULES]))
    containerd = f[Containerd()]
    default = bool(ctx.var("nvidia_container_runtime_default"))
    configured = "nvidia" in containerd.runtimes and states[DROP_IN].exists and \
        (containerd.default_runtime == "nvidia") == default
    if configured and not pkg_op.changes:
        ops.append(noop("nvidia_container_toolkit | containerd runtime",
                        "= nvidia runtime configured in containerd"
                        + (" (default)" if default else "")))
    else:
        flag = " --set-as-default" if default else ""
        ops.append(change("nvidia_container_toolkit | containerd runtime",
                          f"+ nvidia-ctk runtime configure --runtime=containerd{flag}",
                          f"rm -f {DROP_IN}",
                          f"nvidia-ctk runtime configure --runtime=containerd{flag}",
                          notify=("restart containerd",)))
    return ops


def dev_char_op(state: FileState) -> Op:
    """NVIDIA's udev rule, then the links made once for the driver loaded now (none yet on a
    fresh node: the rule makes them when the driver loads at the reboot)."""
    op = files.content(state, "nvidia_container_toolkit | /dev/char links",
                       DEV_CHAR_RULE.encode())
    if not op.changes:
        return noop(op.id, f"= {DEV_CHAR_RULES}: nvidia-ctk links /dev/char/MAJOR:MINOR "
                    "for the NVIDIA devices at each driver load")
    return change(op.id, op.reason + " (nvidia-ctk links /dev/char/MAJOR:MINOR for the "
                  "NVIDIA devices at each driver load)", *op.commands,
                  "[ ! -e /dev/nvidiactl ] || "
                  "/usr/bin/nvidia-ctk system create-dev-char-symlinks --create-all",
                  diff=op.diff)


HANDLERS = {
    "restart containerd": lambda ctx: restart_containerd(
        "nvidia_container_toolkit | restart containerd"),
}
