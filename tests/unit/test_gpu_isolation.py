"""GPU isolation (security review 2, L6): a pod's own NVIDIA_VISIBLE_DEVICES must not give it
GPUs the scheduler did not allocate. The toolkit ignores the variable in unprivileged
containers and takes the device list from the device plugin's volume mounts; the device plugin
passes its allocations that way; gpuk8s's workloads refuse NVIDIA_* in extraEnv."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s import workloads as w
from gpuk8s.facts import HostFacts
from gpuk8s.facts.system import Files, FileState
from gpuk8s.roles import HostContext, load_role, render
from gpuk8s.workloads.values import WorkloadError
from tests.unit.scenarios import default_vars, fresh_facts

ROOT = Path(__file__).resolve().parents[2]
CTK = ROOT / "tests" / "lab" / "standins" / "nvidia" / "nvidia-ctk"
CONFIG = "/etc/nvidia-container-runtime/config.toml"
STANDIN_CONFIG = ROOT / "tests" / "lab" / "standins" / "nvidia" / \
    "nvidia-container-runtime-config.toml"


def toolkit_plan(content: bytes | None) -> list[Any]:
    v = default_vars()
    facts = fresh_facts("debian12", 2, "gpu", v)
    values = dict(facts.items())
    if content is not None:
        fact = next(f for f in values if isinstance(f, Files) and f.args == ("+" + CONFIG,))
        values[fact] = {CONFIG: FileState(CONFIG, True, "644", "root", "x", content)}
    ctx = HostContext("gpu", "nvidia_container_toolkit", v, HostFacts("gpu", values), {},
                      ("workers",))
    return [op for op in load_role("nvidia_container_toolkit").plan(ctx)
            if op.id == "nvidia_container_toolkit | GPU isolation"]


def run_ctk(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CTK), *args], capture_output=True, text=True,
                          env={**os.environ, "GPUK8S_LAB_ROOT": str(root)}, check=False)


def test_toolkit_is_told_to_ignore_the_variable_and_accept_mounts() -> None:
    [fresh] = toolkit_plan(None)
    assert fresh.changes
    assert list(fresh.commands) == [
        f"nvidia-ctk config --config-file={CONFIG} --in-place "
        "--set accept-nvidia-visible-devices-envvar-when-unprivileged=false "
        "--set accept-nvidia-visible-devices-as-volume-mounts=true"]
    # the package's config: both keys commented out (the toolkit's defaults: true, false)
    [packaged] = toolkit_plan(STANDIN_CONFIG.read_bytes())
    assert packaged.changes


def test_second_run_after_nvidia_ctk_config_is_a_noop(tmp_path: Path) -> None:
    """What the (lab's) nvidia-ctk config --set writes is what the role then reads as done."""
    dest = tmp_path / CONFIG.lstrip("/")
    dest.parent.mkdir(parents=True)
    dest.write_bytes(STANDIN_CONFIG.read_bytes())
    [op] = toolkit_plan(None)
    argv = op.commands[0].split()[1:]
    p = run_ctk(tmp_path, *argv)
    assert p.returncode == 0, p.stderr
    text = dest.read_text()
    assert "\naccept-nvidia-visible-devices-as-volume-mounts = true\n" in "\n" + text
    assert "\naccept-nvidia-visible-devices-envvar-when-unprivileged = false\n" in "\n" + text
    [again] = toolkit_plan(dest.read_bytes())
    assert not again.changes, again.reason
    # and it is a fixed point: a second nvidia-ctk run (the postinst's) keeps the keys
    before = dest.read_bytes()
    assert run_ctk(tmp_path, "--quiet", "config", f"--config-file={CONFIG}",
                   "--in-place").returncode == 0
    assert dest.read_bytes() == before


def test_one_key_reverted_is_set_again() -> None:
    content = (b"accept-nvidia-visible-devices-as-volume-mounts = true\n"
               b"accept-nvidia-visible-devices-envvar-when-unprivileged = true\n")
    [op] = toolkit_plan(content)
    assert op.changes


def plugin_container(**overrides: Any) -> dict[str, Any]:
    text = render("gpu_cluster", "gpu/nvidia-device-plugin.yaml.j2", default_vars(**overrides))
    ds = next(d for d in yaml.safe_load_all(text) if d and d["kind"] == "DaemonSet")
    return next(c for c in ds["spec"]["template"]["spec"]["containers"]
                if c["name"] == "nvidia-device-plugin-ctr")


@pytest.mark.parametrize("mig", [False, True], ids=["plain", "mig"])
def test_device_plugin_passes_devices_as_volume_mounts(mig: bool) -> None:
    c = plugin_container(device_plugin_mig=mig)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["DEVICE_LIST_STRATEGY"] == "volume-mounts"
    # the plugin itself still sees its node's GPUs: CAP_SYS_ADMIN counts as privileged
    sc = c["securityContext"]
    assert sc.get("privileged") is True or "SYS_ADMIN" in sc["capabilities"]["add"]


@pytest.mark.parametrize("key", ["NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
                                 "nvidia_visible_devices"])
def test_extra_env_refuses_nvidia_variables(key: str) -> None:
    with pytest.raises(WorkloadError, match=f"extraEnv {key} is refused"):
        w.load_values("tensorflow-job", sets=[f"extraEnv.{key}=all"])


def test_extra_env_refuses_nvidia_variables_from_a_values_file(tmp_path: Path) -> None:
    f = tmp_path / "v.yaml"
    f.write_text("extraEnv: {NVIDIA_VISIBLE_DEVICES: all}\n")
    with pytest.raises(WorkloadError, match="NVIDIA_VISIBLE_DEVICES=all would ask for every"):
        w.load_values("jupyter", values_files=[f])


def test_other_extra_env_still_passes() -> None:
    values = w.load_values("tensorflow-job", sets=["extraEnv.CUDA_CACHE_PATH=abc"])
    assert values["extraEnv"] == {"CUDA_CACHE_PATH": "abc"}


# ------------------------------------------------------------------ the lab plays it as upstream
def test_lab_runtime_honours_the_strategy_and_the_toolkit_settings() -> None:
    """The lab's pod runner (podrun) gives a container the devices nvidia-container-runtime
    v1.20.0 would: a pod's own NVIDIA_VISIBLE_DEVICES=all wins with the toolkit's defaults and
    the envvar strategy (the attack), and is ignored once hardened with volume mounts."""
    from tests.lab.standins.k8s import podrun, programs

    uuid = "GPU-11111111-2222-3333-4444-555555555555"
    hardened = podrun.toolkit_settings(
        "accept-nvidia-visible-devices-as-volume-mounts = true\n"
        "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n")
    defaults = podrun.toolkit_settings(STANDIN_CONFIG.read_text())
    assert (hardened, defaults) == ((False, True), (True, False))
    plugin = plugin_container()

    def devices(container: dict[str, Any], settings: tuple[bool, bool],
                privileged: bool = False) -> list[str] | None:
        alloc = programs.device_plugin_allocation(container, [uuid])
        env = {**alloc["envs"], "NVIDIA_VISIBLE_DEVICES": "all"}   # the pod's env wins
        mounts = [{"src": m["hostPath"], "dst": m["containerPath"]} for m in alloc["mounts"]]
        return podrun.runtime_devices(env, mounts, privileged, settings)

    assert devices(plugin, hardened) == [uuid]
    assert devices({}, defaults) is None            # envvar strategy, defaults: every GPU
    assert devices({}, hardened) == []              # a strategy the toolkit no longer takes
    assert devices({}, hardened, privileged=True) is None   # CAP_SYS_ADMIN: still honoured
    # the plugin still offers its GPUs (SYS_ADMIN); without it, hardened, it would see none
    assert programs.device_plugin_sees_gpus(plugin, STANDIN_CONFIG.read_text())
    hardened_text = ("accept-nvidia-visible-devices-envvar-when-unprivileged = false\n")
    assert programs.device_plugin_sees_gpus(plugin, hardened_text)
    assert not programs.device_plugin_sees_gpus({"securityContext": {}}, hardened_text)
