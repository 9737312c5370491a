"""invoke upgrade: the NVIDIA driver here, Kubernetes releases in day2.kubernetes, kernels in
day2.kernelupgrade."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from gpuk8s.backups import before_change
from gpuk8s.day2.kernelupgrade import upgrade_kernel
from gpuk8s.day2.kubernetes import upgrade_kubernetes
from gpuk8s.day2.steps import (
    ask_confirmation,
    chunks,
    node_name,
    run_batches,
)
from gpuk8s.drain import drain, uncordon
from gpuk8s.errors import InventoryError
from gpuk8s.facts.nvidia import Nvidia
from gpuk8s.gather import gathered_session
from gpuk8s.report import Reporter
from gpuk8s.runner import converge
from gpuk8s.session import DEFAULT_OPENER, Opener


# -- upgrade ----------------------------------------------------------------------------------
def upgrade(inventory: str | Path, *, driver: str | None = None, kubernetes: str | None = None,
            kernel: str | bool | None = None,
            limit: str | None = None, serial: int = 1, drain_timeout: int = 300,
            yes: bool = False, reporter: Reporter | None = None,
            confirm: Callable[[str], bool] | None = None,
            opener: Opener = DEFAULT_OPENER, backup: bool = True) -> dict[str, Any]:
    """Upgrade the NVIDIA driver (``driver``), Kubernetes to the next minor or a patch release
    (``kubernetes``) or GPU nodes' kernel (``kernel``: a release, or True for the newest the
    nodes' kernel meta-packages offer), ``serial`` nodes at a time; see upgrade_driver,
    upgrade_kubernetes and upgrade_kernel."""
    if sum(x is not None and x is not False for x in (driver, kubernetes, kernel)) != 1:
        raise InventoryError("say what to upgrade: --driver VERSION, --kubernetes VERSION or "
                             "--kernel [RELEASE] (one of them)",
                             fix="e.g. invoke upgrade --kubernetes 1.36.2, "
                             "invoke upgrade --driver 580.159.04, or invoke upgrade --kernel")
    kwargs: dict[str, Any] = {"limit": limit, "serial": serial, "drain_timeout": drain_timeout,
                              "yes": yes, "reporter": reporter, "confirm": confirm,
                              "opener": opener, "backup": backup}
    if kubernetes is not None:
        return upgrade_kubernetes(inventory, kubernetes, **kwargs)
    if kernel is not None and kernel is not False:
        return upgrade_kernel(inventory, None if kernel is True else str(kernel), **kwargs)
    assert driver is not None
    return upgrade_driver(inventory, driver, **kwargs)


def upgrade_driver(inventory: str | Path, driver: str, *, limit: str | None = None,
                   serial: int = 1, drain_timeout: int = 300, yes: bool = False,
                   reporter: Reporter | None = None,
                   confirm: Callable[[str], bool] | None = None,
                   opener: Opener = DEFAULT_OPENER, backup: bool = True) -> dict[str, Any]:
    """Move GPU nodes to NVIDIA driver ``driver`` (e.g. 580.159.04), ``serial`` nodes at a time:
    drain, install, reboot if needed, verify (nvidia-smi and allocatable GPUs), uncordon. Stops
    at the first node that fails and leaves the rest untouched."""
    if not re.fullmatch(r"\d{3}\.\d+(\.\d+)?(-[\w.~+]+)?", driver):
        raise InventoryError(f"--driver {driver!r} is not a driver version",
                             fix="give the full version, e.g. --driver 580.159.04")
    first = gathered_session(inventory, limit, "upgrade", reporter=reporter, opener=opener)
    with closing(first):
        rep = first.reporter
        gpu_hosts = [h for h in first.scope if first.cluster["nodes"][h]["gpus"]]
        todo = [h for h in gpu_hosts
                if first.facts[h][Nvidia()].loaded_version != driver.split("-")[0]]
        rep.phase(f"upgrade the NVIDIA driver to {driver}, {serial} node(s) at a time")
        for h in gpu_hosts:
            now = first.facts[h][Nvidia()].loaded_version or "none"
            rep.print(f"  {'+' if h in todo else '='} {h}: {now} -> {driver}")
        if not todo:
            rep.print("nothing to upgrade")
            return {"upgraded": [], "remaining": []}
        ask_confirmation(f"upgrade {len(todo)} node(s)? [y/N] ", yes, confirm)
        cps = [h for h in todo if first.host(h).is_control_plane]
        if cps:
            before_change(first, f"the driver upgrade of {', '.join(cps)}", backup)

    def one_batch(batch: Sequence[str]) -> Reporter:
        session = gathered_session(inventory, ",".join(batch), "upgrade", reporter=reporter,
                                   opener=opener, sets=[f"nvidia_driver_version={driver}"])
        with closing(session):
            names = [node_name(session, h) for h in batch]
            for node in names:
                drain(session, node, drain_timeout)
            converge(session, yes=True,
                     backup="taken before the driver upgrade" if backup else False)
            for node in names:
                uncordon(session, node)
        return session.reporter

    done = run_batches(todo, chunks(todo, serial), one_batch, to=driver,
                       left="stays cordoned for inspection")
    return {"upgraded": done, "remaining": []}
