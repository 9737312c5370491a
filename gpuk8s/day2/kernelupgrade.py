"""invoke upgrade --kernel: GPU nodes onto a new kernel one at a time, the NVIDIA module for
the new kernel built (DKMS) or installed (Ubuntu's prebuilt linux-modules-nvidia-*) and
checked before any reboot; a kernel the module does not build for is refused and the node's
packages put back as they were. Then drain, reboot, the new boot checked (kernel, loaded module
= library, every GPU), the lock made again on the new kernel's packages, uncordon."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from gpuk8s.backups import before_change
from gpuk8s.day2.steps import (
    ask_confirmation,
    chunks,
    node_name,
    run_batches,
)
from gpuk8s.drain import drain, uncordon, wait_ready
from gpuk8s.errors import Gpuk8sError, InventoryError
from gpuk8s.executor import HostResult
from gpuk8s.facts import HostFacts
from gpuk8s.facts.kernel import (
    GpuKernel,
    GpuKernelState,
    LockedPackages,
    LockPackages,
)
from gpuk8s.facts.nvidia import Nvidia
from gpuk8s.facts.system import PciDevices
from gpuk8s.gather import gather, gathered_session
from gpuk8s.ops import Op
from gpuk8s.ops.apt import Apt
from gpuk8s.report import Reporter
from gpuk8s.runner import converge
from gpuk8s.session import DEFAULT_OPENER, Opener, Session, run_step
from gpuk8s.sinks import shell

#: a kernel release as `uname -r` prints it (6.8.0-60-generic, 6.1.0-28-amd64)
RELEASE = re.compile(r"[0-9][A-Za-z0-9._+~-]*")
#: a package for one kernel release carries it in its name; a meta-package does not
#: (linux-image-generic, linux-generic-hwe-24.04, linux-modules-nvidia-580-server-open-generic)
_VERSIONED = re.compile(r"\d+\.\d+\.\d+")
#: where the upgrade leaves its marks on the node (the build logs it reads are newer)
MARK = "/var/lib/gpuk8s/kernel-upgrade.started"


def _state_script() -> str:
    """Every package dpkg has unpacked as LockPackages prints one ("P name version ..."),
    half-configured ones too (a kernel whose postinst failed on its DKMS build): what the
    kernel's install may add (its dependencies too) is what a refusal takes away again."""
    return ("dpkg-query -W -f='P ${binary:Package} ${Version} ${db:Status-Abbrev} "
            "${Status}\\n' 2>/dev/null | awk '$4 !~ /^.[nc]/'; true")


def package_state(session: Session, host: str) -> LockedPackages:
    return LockPackages().parse(run_step(session, host, _state_script(),
                                         "read the kernel and driver packages"), 0)


def metas(pkgs: LockedPackages) -> list[str]:
    """The installed kernel meta-packages (what brings a new kernel)."""
    return sorted(n for n in pkgs.kernel if not _VERSIONED.search(n))


def wanted_packages(pkgs: LockedPackages, running: str, target: str | None) -> list[str]:
    """What to install: the kernel metas at their candidates (no target), or the target
    release's counterpart of every package the running kernel has installed (image,
    headers, modules, modules-extra, Ubuntu's prebuilt NVIDIA modules), headers at least."""
    if target is None:
        return [n for n in metas(pkgs) if n in pkgs.waiting]
    names = {n.replace(running, target) for n in pkgs.kernel if running in n}
    return sorted(names | {f"linux-image-{target}", f"linux-headers-{target}"})


def release_of_meta(depends: str) -> str:
    """The kernel release an image meta-package's candidate depends on, from ``apt-cache
    depends`` (linux-image-generic -> linux-image-6.8.0-60-generic: "6.8.0-60-generic");
    "" when none."""
    for line in depends.splitlines():
        key, _, dep = line.strip().partition(": ")
        dep = dep.strip()
        if key.endswith("Depends") and dep.startswith("linux-image-"):
            release = dep.removeprefix("linux-image-")
            if RELEASE.fullmatch(release) and _VERSIONED.search(release):
                return release
    return ""


def _module_ok(state: GpuKernelState, release: str, library: str) -> tuple[bool, str]:
    k = state.kernel(release)
    if k is None:
        return False, f"kernel {release} is not installed (/boot/vmlinuz-{release} missing)"
    if not k.module:
        return False, f"no NVIDIA module was built or installed for kernel {release}"
    if library and k.module_version and k.module_version != library:
        return False, (f"the NVIDIA module for kernel {release} is {k.module_version}, the "
                       f"driver's library is {library}")
    if state.newest != release:
        return False, (f"kernel {state.newest} is installed too and newer: the boot loader "
                       f"would start it, not {release} (remove it first)")
    return True, f"NVIDIA module {k.module_version or '(version unknown)'} for {release}"


def _library(facts: HostFacts) -> str:
    state, nv = facts[GpuKernel()], facts[Nvidia()]
    return state.library or (nv.loaded_version if nv.exit_code == 0 else "")


# -- one node -----------------------------------------------------------------------------------
def target_release(session: Session, host: str, kernel: str | None) -> str:
    """``kernel``, or the release the node's waiting image meta-package would bring."""
    if kernel is not None:
        return kernel
    pkgs = session.facts[host][LockPackages()]
    for meta in wanted_packages(pkgs, "", None):
        if meta.startswith("linux-image-"):
            out = run_step(session, host, f"apt-cache depends {shell(meta)}="
                           f"{shell(pkgs.waiting[meta])}", f"what {meta} brings")
            if release := release_of_meta(out):
                return release
    raise Gpuk8sError(f"{host}: cannot tell which kernel its meta-packages would bring "
                      f"({', '.join(metas(pkgs)) or 'none installed'}): name it, "
                      "invoke upgrade --kernel RELEASE")


def install_new_kernel(session: Session, host: str, kernel: str | None
                       ) -> tuple[str, LockedPackages]:
    """Install the new kernel and check its NVIDIA module, before any reboot: first the
    target release's own packages, then (no release named) the metas that wait with it, so
    a refusal only has new packages to take away. Returns the new release and the package
    state before. A missing or wrong module, or a failed install: the packages are put back
    as they were and Gpuk8sError names the kernel, the driver and the build log."""
    rep = session.reporter
    facts = session.facts[host]
    state, pkgs = facts[GpuKernel()], facts[LockPackages()]
    library = _library(facts)
    new = target_release(session, host, kernel)
    names = wanted_packages(pkgs, state.running, new)
    then = wanted_packages(pkgs, state.running, None) if kernel is None else []
    before = package_state(session, host)
    apt = Apt.for_host(session.host(host).vars)
    rep.print(f"  [{host}] install {', '.join(names)} (kernel {state.running} -> {new})")

    def refuse(why: str) -> Gpuk8sError:
        log = run_step(session, host, (
            f"for f in $(find /var/lib/dkms -path '*/build/make.log' -newer {MARK} "
            "2>/dev/null); do echo \"$f:\"; tail -n 8 \"$f\"; done"), "read the build log")
        _put_back(session, host, before)
        return Gpuk8sError(
            f"{host}: kernel {new} refused before any reboot: {why} (driver "
            f"{library or 'unknown'}); the packages are back as they were and the node still "
            f"runs {state.running}" + (f"\n  the build log's last lines:\n{_indent(log)}"
                                       if log.strip() else ""))

    # no --allow-change-held-packages: the held driver must not move with the kernel (a
    # prebuilt module package pinning another nvidia-kernel-common is refused here)
    try:
        run_step(session, host, apt.script(
            f"mkdir -p /var/lib/gpuk8s && : > {MARK}\n"
            f"{apt.update()} || exit $?\n"
            f"{apt.cmd} install {' '.join(shell(n) for n in names)}"),
            f"install kernel {new}", timeout=1800)
    except Gpuk8sError as exc:
        raise refuse(f"installing {', '.join(names)} failed: "
                     f"{_indent(str(exc)).strip()}") from None
    gather(session, [host])
    ok, why = _module_ok(session.facts[host][GpuKernel()], new, library)
    if not ok and run_step(session, host, "if command -v dkms >/dev/null 2>&1; "
                           "then echo yes; fi", "dkms present?").strip() == "yes":
        rep.print(f"  [{host}] {why}: dkms autoinstall -k {new}")
        run_step(session, host, f"dkms autoinstall -k {shell(new)} 2>&1 | tail -n 20",
                 f"dkms autoinstall -k {new}", timeout=1800)
        gather(session, [host])
        ok, why = _module_ok(session.facts[host][GpuKernel()], new, library)
    if not ok:
        raise refuse(why)
    if then:
        words = " ".join(shell(n) for n in then)
        try:
            run_step(session, host, apt.script(
                f"apt-mark unhold {words} >/dev/null\n{apt.cmd} install {words}"),
                f"upgrade {', '.join(then)}", timeout=1800)
        except Gpuk8sError as exc:
            raise refuse(f"upgrading {', '.join(then)} failed: "
                         f"{_indent(str(exc)).strip()}") from None
    rep.print(f"  [{host}] {why}")
    return new, before


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.strip().splitlines())


def _put_back(session: Session, host: str, before: LockedPackages) -> None:
    """One apt transaction: what the upgrade added purged, what it changed (or left
    half-configured) back at its old version; holds as they were; then the state must equal
    ``before``."""
    now = package_state(session, host)
    added = sorted(set(now.installed) - set(before.installed))
    changed = sorted(n for n, st in before.installed.items() if n in now.installed
                     and (now.installed[n].version, now.installed[n].status)
                     != (st.version, st.status))
    missing = sorted(set(before.installed) - set(now.installed))
    apt = Apt.for_host(session.host(host).vars)
    lines = []
    specs = [f"{shell(n)}={shell(before.installed[n].version)}" for n in changed + missing]
    specs += [f"{shell(n)}-" for n in added]
    if specs:
        if added:
            lines.append("apt-mark unhold " + " ".join(shell(n) for n in added)
                         + " >/dev/null 2>&1 || true")
        lines.append(f"{apt.cmd} install --purge --allow-change-held-packages "
                     f"--allow-downgrades {' '.join(specs)}")
    held = [n for n in before.installed if before.installed[n].held]
    free = [n for n in now.installed if n in before.installed and now.installed[n].held
            and not before.installed[n].held]
    if held:
        lines.append("apt-mark hold " + " ".join(shell(n) for n in held) + " >/dev/null")
    if free:
        lines.append("apt-mark unhold " + " ".join(shell(n) for n in free) + " >/dev/null")
    if lines:
        run_step(session, host, apt.script("\n".join(lines)), "put the packages back",
                 timeout=1800)
    again = package_state(session, host)

    def word(p: LockedPackages, n: str) -> str:
        st = p.installed.get(n)
        return "absent" if st is None else \
            f"{st.version} {st.status}" + (" (held)" if st.held else "")

    diff = sorted(f"{n}: {word(before, n)} -> {word(again, n)}"
                  for n in set(before.installed) | set(again.installed)
                  if word(before, n) != word(again, n))
    if diff:
        raise Gpuk8sError(f"{host}: the packages could not all be put back as they were: "
                          + "; ".join(diff))
    session.reporter.print(f"  [{host}] packages put back as they were "
                           f"({len(added)} removed, {len(changed) + len(missing)} reinstalled)")


def reboot_into(session: Session, host: str, release: str, gpus: int) -> None:
    """Reboot, then the new boot must run ``release`` with the driver loaded, its version the
    library's, and every PCI GPU seen."""
    rep = session.reporter
    rep.print(f"  [{host}] reboot into {release}")
    session.runner(host).reboot(Op(f"upgrade --kernel | reboot into {release}", (),
                                   f"reboot into {release}", reboot=True), HostResult(host))
    gather(session, [host])
    facts = session.facts[host]
    state, nv = facts[GpuKernel()], facts[Nvidia()]
    if state.running != release:
        raise Gpuk8sError(f"{host}: booted {state.running}, not {release}: check the boot "
                          "loader's default entry (GRUB_DEFAULT)")
    if nv.exit_code != 0:
        raise Gpuk8sError(f"{host}: on {release} the driver does not answer: nvidia-smi: "
                          f"{(nv.error or 'absent').splitlines()[0]}")
    library = _library(facts)
    loaded = state.loaded or nv.loaded_version
    if library and loaded and loaded != library:
        raise Gpuk8sError(f"{host}: on {release} the loaded module is {loaded}, the library "
                          f"{library}")
    if len(nv.gpus) != gpus:
        raise Gpuk8sError(f"{host}: on {release} nvidia-smi sees {len(nv.gpus)} of {gpus} "
                          "PCI GPUs")
    rep.print(f"  [{host}] back on {release}: driver {loaded} loaded (library "
              f"{library or loaded}), {gpus}/{gpus} GPUs")


# -- the roll -------------------------------------------------------------------------------------
def upgrade_kernel(inventory: str | Path, kernel: str | None, *, limit: str | None = None,
                   serial: int = 1, drain_timeout: int = 300, yes: bool = False,
                   reporter: Reporter | None = None,
                   confirm: Callable[[str], bool] | None = None,
                   opener: Opener = DEFAULT_OPENER, backup: bool = True) -> dict[str, Any]:
    """Move GPU nodes to kernel ``kernel`` (a release, e.g. 6.8.0-60-generic), or to the one
    their kernel meta-packages wait with (None), ``serial`` nodes at a time. Stops at the
    first node that fails and leaves the rest untouched."""
    if kernel is not None and not RELEASE.fullmatch(kernel):
        raise InventoryError(f"--kernel {kernel!r} is not a kernel release",
                             fix="give it as `uname -r` prints it, e.g. --kernel "
                             "6.8.0-60-generic, or --kernel alone for the newest the "
                             "distribution offers")
    first = gathered_session(inventory, limit, "upgrade", reporter=reporter, opener=opener)
    with closing(first):
        rep = first.reporter
        gpu_hosts = [h for h in first.scope if first.cluster["nodes"][h]["gpus"]]
        todo: list[str] = []
        rep.phase(f"upgrade the kernel of GPU nodes to {kernel or 'the newest offered'}, "
                  f"{serial} node(s) at a time")
        for h in gpu_hosts:
            facts = first.facts[h]
            state, pkgs, nv = facts[GpuKernel()], facts[LockPackages()], facts[Nvidia()]
            if kernel is not None:
                go = state.running != kernel
                what = f"{state.running} -> {kernel}" if go else f"runs {kernel}"
            else:
                waiting = [f"{n} {pkgs.installed[n].version} -> {pkgs.waiting[n]}"
                           for n in wanted_packages(pkgs, state.running, None)]
                go = bool(waiting)
                what = (f"{state.running}; " + ", ".join(waiting)) if go else \
                    f"{state.running}, no newer kernel offered (as of its last apt-get " \
                    "update)" + \
                    ("" if metas(pkgs) else " (no kernel meta-package installed: name one "
                     "with --kernel RELEASE)")
            if go and (nv.exit_code != 0 or not state.present):
                raise Gpuk8sError(f"{h}: its driver does not answer now (nvidia-smi: "
                                  f"{(nv.error or 'absent').splitlines()[0]}): fix that first "
                                  "(invoke status), a kernel upgrade would hide the cause")
            rep.print(f"  {'+' if go else '='} {h}: {what}")
            if go:
                todo.append(h)
        if not todo:
            rep.print("nothing to upgrade")
            return {"upgraded": [], "remaining": []}
        ask_confirmation(f"upgrade the kernel of {len(todo)} node(s)? [y/N] ", yes, confirm)
        cps = [h for h in todo if first.host(h).is_control_plane]
        if cps:
            before_change(first, f"the kernel upgrade of {', '.join(cps)}", backup)

    def one_batch(batch: Sequence[str]) -> Reporter:
        session = gathered_session(inventory, ",".join(batch), "upgrade", reporter=reporter,
                                   opener=opener)
        with closing(session):
            new: dict[str, str] = {}
            before: dict[str, LockedPackages] = {}
            for h in batch:   # every node of the batch checked before any of them reboots
                try:
                    new[h], before[h] = install_new_kernel(session, h, kernel)
                except Gpuk8sError:
                    for done_h in new:   # the batch's others go back too: nothing half-done
                        _put_back(session, done_h, before[done_h])
                    raise
            names = {h: node_name(session, h) for h in batch}
            gpus = {h: sum(d.is_gpu for d in session.facts[h][PciDevices()]) for h in batch}
            # a meta that moved without a new kernel needs no reboot
            moving = [h for h in batch if new[h] != session.facts[h][GpuKernel()].running]
            cordoned: list[str] = []
            try:
                for h in moving:
                    drain(session, names[h], drain_timeout)
                    cordoned.append(names[h])
                for h in moving:
                    reboot_into(session, h, new[h], gpus[h])
                # the lock again, on the new kernel's packages (backed up above)
                converge(session, yes=True,
                         backup="taken before the kernel upgrade" if backup else False)
                for h in moving:
                    wait_ready(session, names[h], gpus[h], 300)
                    uncordon(session, names[h])
                    cordoned.remove(names[h])
            except Gpuk8sError as exc:
                if not cordoned:
                    raise
                raise Gpuk8sError(f"{exc}\n  left cordoned: {', '.join(cordoned)} (once "
                                  "fixed: kubectl uncordon " + " ".join(cordoned) + ")"
                                  ) from None
        return session.reporter

    done = run_batches(todo, chunks(todo, serial), one_batch, to=kernel or "the new kernel",
                       left="is as the error says")
    return {"upgraded": done, "remaining": []}
