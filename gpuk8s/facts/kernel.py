"""Facts about a GPU node's kernel and NVIDIA driver as the package manager and the kernel
see them: the packages gpu_node_lock holds (with what apt would install instead), and, for
status, the running and installed kernels, the NVIDIA module built for each, the loaded
module's version against the user-space library's, and the CDI spec's driver."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuk8s.facts import Fact, Source
from gpuk8s.facts.dpkg import PACKAGE_NAME, PackageState

#: what the lock holds: the kernel (images, headers, Ubuntu's module packages and prebuilt
#: NVIDIA modules, the metas that pull a new kernel: linux-image-generic, linux-generic-hwe-*,
#: linux-image-amd64, linux-headers-amd64) and the driver (Ubuntu's nvidia-*-<branch>-server
#: and libnvidia-*-<branch>-server set, the CUDA repository's nvidia-open/cuda-drivers metas
#: and their nvidia-* and libcuda*/libnvidia-* packages). dpkg-query globs.
KERNEL_GLOBS = ("linux-image-*", "linux-headers-*", "linux-modules-*", "linux-generic*",
                "linux-signed-*")
DRIVER_GLOBS = ("nvidia-*", "libnvidia-*", "cuda-drivers*", "libcuda*",
                "xserver-xorg-video-nvidia*")
#: the container toolkit's packages start like the driver's but are its role's to pin
#: (roles/nvidia_container_toolkit PACKAGES); never the lock's
NOT_DRIVER = re.compile(r"(lib)?nvidia-container")


#: a Debian version as apt prints it (Policy 5.6.12), not "(none)"
VERSION = re.compile(r"(\d+:)?[0-9][A-Za-z0-9.+~-]*")


def is_kernel_package(name: str) -> bool:
    return any(re.fullmatch(g.replace("*", ".*"), name) for g in KERNEL_GLOBS)


@dataclass(frozen=True)
class LockedPackages:
    """Installed kernel and driver packages (name -> state) and, for those apt would
    install another version of, that version (the candidate a held package waits with)."""

    installed: dict[str, PackageState] = field(default_factory=dict)
    waiting: dict[str, str] = field(default_factory=dict)

    @property
    def kernel(self) -> dict[str, PackageState]:
        return {n: s for n, s in self.installed.items() if is_kernel_package(n)}

    @property
    def driver(self) -> dict[str, PackageState]:
        return {n: s for n, s in self.installed.items() if not is_kernel_package(n)}

    @property
    def unheld(self) -> list[str]:
        return sorted(n for n, s in self.installed.items() if not s.held)

    @property
    def held(self) -> list[str]:
        return sorted(n for n, s in self.installed.items() if s.held)


#: the globs as dpkg-query and the hold's script take them (quoted words)
GLOB_ARGS = " ".join(f"'{g}'" for g in KERNEL_GLOBS + DRIVER_GLOBS)


class NvidiaPci(Source):
    """Whether the host has an NVIDIA PCI device, in $_gk_nv (1 or 0): one loop of `read`s,
    no process, shared by the kernel facts of a probe, which print nothing elsewhere."""

    def command(self) -> str:
        # its own variable names: a source runs in the probe's top shell, beside the others'
        return r"""_gk_nv=0; for _gk_nvf in /sys/bus/pci/devices/*/vendor; do
  _gk_nvv=; { read -r _gk_nvv; } 2>/dev/null <"$_gk_nvf"
  [ "$_gk_nvv" = 0x10de ] && { _gk_nv=1; break; }
done"""

    def ready(self) -> str:
        return '[ -n "${_gk_nv+x}" ]'


def _nvidia_gate() -> str:
    """The start of a kernel fact's command: its body runs only on a host with an NVIDIA
    PCI device (close it with `fi`)."""
    return NvidiaPci().ensure() + '\nif [ "$_gk_nv" = 1 ]; then\n'


class LockPackages(Fact[LockedPackages]):
    """The kernel and driver packages installed on a GPU node, held or not, and the version
    apt's candidate would bring for each (``apt-cache policy``: a held package keeps its
    candidate, so a waiting kernel or driver update shows). Nothing on a host without an
    NVIDIA device."""

    def sources(self) -> tuple[Source, ...]:
        return (NvidiaPci(),)

    def command(self) -> str:
        return _nvidia_gate() + f"""  _gk_p=$(dpkg-query -W -f='${{binary:Package}} ${{Version}} ${{db:Status-Abbrev}} ${{Status}}\\n' {GLOB_ARGS} 2>/dev/null | awk '$3 ~ /^[ih]i/')
  [ -z "$_gk_p" ] || printf '%s\\n' "$_gk_p" | sed 's/^/P /'
  _gk_n=$(printf '%s\\n' "$_gk_p" | awk 'NF {{print $1}}')
  if [ -n "$_gk_n" ]; then
    apt-cache policy $_gk_n 2>/dev/null | awk '/^[^ ]/ {{p=$1; sub(":$", "", p)}} $1 == "Candidate:" {{print "C " p " " $2}}'
  fi
fi; true"""

    def parse(self, output: str, exit_code: int) -> LockedPackages:
        installed: dict[str, PackageState] = {}
        candidates: dict[str, str] = {}
        for line in output.splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[0] == "P" and PACKAGE_NAME.fullmatch(parts[1]) \
                    and VERSION.fullmatch(parts[2]) and not NOT_DRIVER.match(parts[1]):
                installed[parts[1]] = PackageState(parts[2], len(parts) > 4 and
                                                   parts[4] == "hold", parts[3])
            elif len(parts) == 3 and parts[0] == "C":
                candidates[parts[1]] = parts[2]
        waiting = {n: v for n, v in candidates.items() if n in installed
                   and VERSION.fullmatch(v) and v != installed[n].version}
        return LockedPackages(installed, waiting)


@dataclass(frozen=True)
class InstalledKernel:
    release: str
    #: the NVIDIA module file built or installed for it ("" = none) and its version
    #: (modinfo's; "" when it cannot tell)
    module: str = ""
    module_version: str = ""


@dataclass(frozen=True)
class GpuKernelState:
    """A GPU node's kernels and driver versions; ``present`` False on other hosts."""

    present: bool = False
    running: str = ""
    kernels: tuple[InstalledKernel, ...] = ()
    #: the loaded module's version (/sys/module/nvidia/version or /proc/driver/nvidia/version)
    loaded: str = ""
    #: the user-space library's version (libnvidia-ml.so.<version>)
    library: str = ""
    #: the driver version the CDI spec's mounts name ("" = no spec), and its path
    cdi_spec: str = ""
    cdi_driver: str = ""

    @property
    def newest(self) -> str:
        return self.kernels[-1].release if self.kernels else self.running

    def kernel(self, release: str) -> InstalledKernel | None:
        return next((k for k in self.kernels if k.release == release), None)


def release_key(release: str) -> list[tuple[int, str]]:
    """Order kernel releases as GRUB's menu does (``sort -V``): numbers as numbers."""
    return [(int(p), "") if p.isdigit() else (-1, p) for p in re.findall(r"\d+|\D+", release)]


#: the folders a distribution's libnvidia-ml.so.<version> lives in
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")
CDI_SPECS = ("/var/run/cdi/nvidia.yaml", "/etc/cdi/nvidia.yaml")


class GpuKernel(Fact[GpuKernelState]):
    """The running kernel, every installed one (/boot/vmlinuz-*) with the NVIDIA module
    found for it under /lib/modules/<release> (DKMS's updates/dkms, Ubuntu's prebuilt
    linux-modules-nvidia-*) and its modinfo version, the loaded module's version, the
    library's (from its file name, as the toolkit reads it: internal/lookup/root/root.go@
    v1.20.0), and the driver the CDI spec was generated for. Nothing without an NVIDIA
    device."""

    def sources(self) -> tuple[Source, ...]:
        return (NvidiaPci(),)

    def command(self) -> str:
        libs = " ".join(f"{d}/libnvidia-ml.so.*.*" for d in LIB_DIRS)
        specs = " ".join(CDI_SPECS)
        return _nvidia_gate() + f"""  _gk_k=$(uname -r); echo "running $_gk_k"
  for _gk_f in /boot/vmlinuz-*; do [ -e "$_gk_f" ] && echo "image ${{_gk_f#/boot/vmlinuz-}}"; done
  for _gk_r in "$_gk_k" $(ls /boot 2>/dev/null | sed -n 's/^vmlinuz-//p'); do
    # as modprobe would find it (modules.dep); where depmod has not run for it, any file
    _gk_m=$(modinfo -k "$_gk_r" -F filename nvidia 2>/dev/null | head -n1)
    [ -n "$_gk_m" ] || _gk_m=$(find "/lib/modules/$_gk_r" \\( -name nvidia.ko -o -name 'nvidia.ko.*' \\) 2>/dev/null | head -n1)
    [ -n "$_gk_m" ] || continue
    echo "module $_gk_r $_gk_m $(modinfo -F version "$_gk_m" 2>/dev/null | head -n1)"
  done
  _gk_l=; {{ read -r _gk_l; }} 2>/dev/null </sys/module/nvidia/version
  [ -n "$_gk_l" ] || _gk_l=$(sed -n 's/.*Kernel Module[^0-9]*\\([0-9][0-9.]*\\).*/\\1/p' /proc/driver/nvidia/version 2>/dev/null | head -n1)
  echo "loaded $_gk_l"
  _gk_l=
  for _gk_f in {libs}; do [ -e "$_gk_f" ] && _gk_l=1 && echo "library ${{_gk_f##*libnvidia-ml.so.}}"; done
  # elsewhere (a container's injected driver, /usr/local/nvidia): what the loader finds
  [ -n "$_gk_l" ] || for _gk_f in $(ldconfig -p 2>/dev/null | sed -n 's/.*libnvidia-ml\\.so\\.1 .*=> //p'); do
    _gk_f=$(readlink -f "$_gk_f")
    case $_gk_f in *libnvidia-ml.so.[0-9]*.[0-9]*) echo "library ${{_gk_f##*libnvidia-ml.so.}}";; esac
  done
  for _gk_f in {specs}; do
    [ -e "$_gk_f" ] || continue
    echo "cdi $_gk_f $(grep -o 'libnvidia-ml\\.so\\.[0-9][0-9.]*[0-9]' "$_gk_f" | head -n1 | sed 's/libnvidia-ml\\.so\\.//')"
    break
  done
fi; true"""

    def parse(self, output: str, exit_code: int) -> GpuKernelState:
        running, loaded, library, cdi_spec, cdi_driver = "", "", "", "", ""
        images: set[str] = set()
        modules: dict[str, tuple[str, str]] = {}
        release = re.compile(r"[A-Za-z0-9._+~-]+")
        version = re.compile(r"\d+(\.\d+)+")
        seen = False
        for line in output.splitlines():
            word, _, rest = line.partition(" ")
            parts = rest.split()
            seen = seen or word == "running"
            if word == "running" and parts and release.fullmatch(parts[0]):
                running = parts[0]
            elif word == "image" and parts and release.fullmatch(parts[0]):
                images.add(parts[0])
            elif word == "module" and len(parts) >= 2 and release.fullmatch(parts[0]):
                v = parts[2] if len(parts) > 2 and version.fullmatch(parts[2]) else ""
                modules.setdefault(parts[0], (parts[1], v))
            elif word == "loaded" and parts and version.fullmatch(parts[0]):
                loaded = parts[0]
            elif word == "library" and parts and version.fullmatch(parts[0]):
                # the newest when several are left behind (a purge that kept one)
                if not library or release_key(parts[0]) > release_key(library):
                    library = parts[0]
            elif word == "cdi" and parts and not cdi_spec:
                cdi_spec = parts[0]
                cdi_driver = parts[1] if len(parts) > 1 and version.fullmatch(parts[1]) else ""
        if not seen:
            return GpuKernelState()
        releases = sorted(images | {running} - {""}, key=release_key)
        kernels = tuple(InstalledKernel(r, *modules.get(r, ("", ""))) for r in releases)
        return GpuKernelState(True, running, kernels, loaded, library, cdi_spec, cdi_driver)
