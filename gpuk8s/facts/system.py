"""Facts about the operating system, kernel, hardware and services."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from gpuk8s.facts import Fact
from gpuk8s.facts.dpkg import PACKAGE_NAME as PACKAGE_NAME
from gpuk8s.facts.dpkg import AptOsSources as AptOsSources
from gpuk8s.facts.dpkg import DpkgHealth as DpkgHealth
from gpuk8s.facts.dpkg import DpkgPackages as DpkgPackages
from gpuk8s.facts.dpkg import Packages as Packages
from gpuk8s.facts.dpkg import PackageState as PackageState
from gpuk8s.facts.files import FileReads as FileReads
from gpuk8s.facts.files import Files as Files
from gpuk8s.facts.files import FileState as FileState
from gpuk8s.facts.units import Services as Services
from gpuk8s.facts.units import SystemdUnits as SystemdUnits
from gpuk8s.facts.units import Unit as Unit
from gpuk8s.sinks import shell

# PCI ids of NVIDIA parts we name; anything else with vendor 0x10de is still a GPU by class.
NVIDIA_MODELS: dict[str, str] = {
    "0x2330": "NVIDIA H100 80GB HBM3",
    "0x2331": "NVIDIA H100 PCIe",
    "0x2335": "NVIDIA H200",
    "0x233b": "NVIDIA H200 NVL",
    "0x20b0": "NVIDIA A100-SXM4-40GB",
    "0x20b2": "NVIDIA A100-SXM4-80GB",
    "0x20b5": "NVIDIA A100 80GB PCIe",
    "0x26b9": "NVIDIA L40S",
    "0x26b5": "NVIDIA L40",
    "0x2684": "NVIDIA GeForce RTX 4090",
    "0x1eb8": "Tesla T4",
    "0x1db4": "Tesla V100-PCIE-16GB",
    "0x2901": "NVIDIA B200",
}
NVSWITCH_IDS = {"0x22a3", "0x1af1", "0x2901"}


#: os-release(5): ID, VERSION_ID and VERSION_CODENAME hold only 0-9, a-z, ".", "_" and "-"
_OS_RELEASE_ID = re.compile(r"[a-z0-9._-]*")
OS_RELEASE_IDS = ("ID", "VERSION_ID", "VERSION_CODENAME")
#: what an identifier that breaks that rule reads as: no OS has it, so preflight refuses it
INVALID = "?"


class OsRelease(Fact[dict[str, str]]):
    """/etc/os-release as a dict: ``{"ID": "ubuntu", "VERSION_ID": "24.04", ...}``.

    ``ID``, ``VERSION_ID`` and ``VERSION_CODENAME`` go into URLs and package choices, so a
    value outside os-release(5)'s character set is replaced by ``"?"`` here, at parse time
    (the text as found is kept under ``"<KEY>_AS_FOUND"`` for messages)."""

    def command(self) -> str:
        return "cat /etc/os-release 2>/dev/null || true"

    def parse(self, output: str, exit_code: int) -> dict[str, str]:
        result: dict[str, str] = {}
        for line in output.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() and not key.startswith("#"):
                try:
                    parts = shlex.split(value) if value else [""]
                except ValueError:  # unbalanced quotes: keep the raw text
                    parts = [value]
                result[key.strip()] = parts[0] if parts else ""
        for key in OS_RELEASE_IDS:
            if key in result and not _OS_RELEASE_ID.fullmatch(result[key]):
                result[f"{key}_AS_FOUND"] = result[key]
                result[key] = INVALID
        return result


@dataclass(frozen=True)
class SystemInfo:
    """Kernel, hardware and identity of a host."""

    kernel: str
    arch: str
    hostname: str
    cpus: int
    memory_mb: int
    cgroup: str
    product_uuid: str
    machine_id: str
    boot_id: str
    virt: str
    secure_boot: str
    time_synced: str
    swap_active: tuple[str, ...]
    swap_fstab: tuple[str, ...]
    headers: bool
    #: ports something listens on (TCP); None when neither ss nor /proc/net/tcp could be read
    listening: tuple[int, ...] | None
    reboot_required: bool
    #: PID 1's command name ("systemd" on a host gpuk8s can manage)
    init: str = "systemd"
    #: systemd is PID 1 and running (/run/systemd/system exists, as sd_booted(3) checks)
    systemd: bool = True
    #: modprobe is installed, and /lib/modules/<kernel> exists for it to load from
    modprobe: bool = True
    modules_dir: bool = True
    #: how ``virt`` was found: "systemd-detect-virt", or "guessed" from /proc and marker files
    #: when that tool is missing ("unknown" then means nothing gave it away)
    virt_source: str = "systemd-detect-virt"
    #: the apt candidate of linux-headers-<kernel> when those headers are not installed
    #: ("" = no package source has them; "unknown" = no apt-cache, or apt's lists are older
    #: than its sources, so apt cannot tell yet; "-" = not looked up: no NVIDIA device here
    #: waits for a driver, so nothing would build against them)
    headers_candidate: str = "unknown"
    #: the CPU reports a hypervisor (/proc/cpuinfo's "hypervisor" flag): a VM, whatever else
    hypervisor: bool = False
    #: what ``virt`` was read from when it was guessed, or why systemd-detect-virt's answer
    #: was not taken ("" when the tool answered and was taken)
    virt_evidence: str = ""

    @property
    def in_container(self) -> bool:
        """Whether the host is a container (its kernel, and so its modules, are another's)."""
        return self.virt in CONTAINERS


#: systemd-detect-virt's container names, and the ones guessed without it
CONTAINERS = frozenset({"systemd-nspawn", "lxc", "lxc-libvirt", "docker", "podman", "openvz",
                        "container-other", "rkt", "wsl", "proot", "pouch", "container"})


def virt_script(root: str = "") -> str:
    """The System probe's lines about virtualisation: ``hypervisor=1``, ``virt=``, and when
    guessed ``virt_source=guessed`` and ``virt_evidence=``. ``root``: where / is (tests give
    a folder of real captures; the probe reads the host's own files).

    Strong evidence first. A container is what a runtime set up when it started it: PID 1's
    ``container=``, /run/.containerenv, or a root file system that is a runtime's snapshot
    (docker, containerd, podman, LXC paths in its mount). A VM shows in what the kernel sees:
    the CPU's hypervisor flag, a microVM's kernel command line (Firecracker's init, virtio
    MMIO devices), a GPU that nvidia-smi says is passed through or a vGPU (asked only where
    there is no systemd-detect-virt, whose answer is taken otherwise). A bare /.dockerenv
    comes last: it is a file, and a VM booted from a container image has it too (the real
    H200 host: a Firecracker VM without systemd, which read as docker). systemd-detect-virt
    takes /.dockerenv alone as docker too; that answer is checked the same way."""
    r = shell(root) if root else ""
    return f"""vm=""
if grep -qw hypervisor {r}/proc/cpuinfo 2>/dev/null; then
  echo hypervisor=1; vm="the CPU's hypervisor flag"
fi
snap=0
case $(awk '$5 == "/" {{print; exit}}' {r}/proc/self/mountinfo 2>/dev/null) in
  */docker/*|*/mapper/docker-*|*/containerd/*|*/containers/storage/*|*/lxc/*|*/lxd/*|\
  */incus/*) snap=1;;
esac
_gk_c=; {{ read -r _gk_c; }} 2>/dev/null < {r}/proc/cmdline
case " $_gk_c " in
  *firecracker*|*" virtio_mmio.device="*) vm="${{vm:+$vm, }}a microVM's kernel command line";;
esac
docker_file="/.dockerenv ignored: no container runtime set up this root file system (a VM \
booted from a container image has the file too)"
if command -v systemd-detect-virt >/dev/null 2>&1; then
  v=$(systemd-detect-virt 2>/dev/null || true)
  w=""
  if [ "$v" = docker ] && [ "$snap" = 0 ]; then w=$(systemd-detect-virt --vm 2>/dev/null); fi
  case $w in
    ''|none) echo "virt=$v";;
    *) echo "virt=$w"; echo "virt_evidence=systemd-detect-virt --vm; $docker_file";;
  esac
else
  # the GPU's word, asked only here where $vm counts: nvidia-smi -q takes 120 ms on an H200
  if [ -z "$vm" ] && command -v nvidia-smi >/dev/null 2>&1; then
    m=$(nvidia-smi -q 2>/dev/null | sed -n 's/^ *Virtualization Mode *: *//p' | head -n1)
    case $m in Pass-Through|VGPU) vm="nvidia-smi's Virtualization Mode $m";; esac
  fi
  c=$(tr '\\0' '\\n' 2>/dev/null <{r}/proc/1/environ | sed -n 's/^container=//p' | head -n1)
  if grep -qi microsoft {r}/proc/sys/kernel/osrelease 2>/dev/null; then
    v=wsl; e="the kernel's release names Microsoft"
  elif [ -n "$c" ]; then
    case $c in
      lxc|lxc-libvirt|systemd-nspawn|docker|podman|rkt|pouch|proot) v=$c;; *) v=container-other;;
    esac
    e="PID 1's environment has container=$c"
  elif [ -e {r}/run/.containerenv ]; then v=podman; e="/run/.containerenv"
  elif [ "$snap" = 1 ]; then
    if [ -e {r}/.dockerenv ]; then v=docker; else v=container-other; fi
    e="the root file system is a container runtime's snapshot"
  elif [ -n "$vm" ]; then
    v=vm; e=$vm; [ -e {r}/.dockerenv ] && e="$e; $docker_file"
  elif [ -e {r}/.dockerenv ]; then v=docker; e="/.dockerenv alone (nothing else tells)"
  else v=unknown; e="nothing gave it away"; fi
  echo "virt=$v"; echo "virt_evidence=$e"; echo virt_source=guessed
fi
"""


class System(Fact[SystemInfo]):
    """Kernel, CPU/RAM, cgroup version, identity, swap, time sync, Secure Boot, listen ports."""

    def command(self) -> str:
        # one-line files are read with the shell's own `read` and the kernel's release taken
        # once: every process counts when eight nodes probe at once on a small machine
        return r"""
k=$(uname -r); echo "kernel=$k"; echo "arch=$(uname -m)"
_gk_read() { _gk_l=; { read -r _gk_l; } 2>/dev/null <"$1"; }
_gk_read /proc/sys/kernel/hostname; echo "hostname=$_gk_l"
echo "cpus=$(nproc)"; echo "mem_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)"
echo "cgroup=$(stat -fc %T /sys/fs/cgroup 2>/dev/null)"
_gk_read /sys/class/dmi/id/product_uuid; echo "product_uuid=$_gk_l"
_gk_read /etc/machine-id; echo "machine_id=$_gk_l"
_gk_read /proc/sys/kernel/random/boot_id; echo "boot_id=$_gk_l"
_gk_read /proc/1/comm; echo "init=$_gk_l"
[ -d /run/systemd/system ] && echo systemd=1 || echo systemd=0
command -v modprobe >/dev/null 2>&1 && echo modprobe=1 || echo modprobe=0
[ -d "/lib/modules/$k" ] && echo modules_dir=1 || echo modules_dir=0
""" + virt_script() + r"""if command -v mokutil >/dev/null 2>&1; then sb=$(mokutil --sb-state 2>&1 | head -n1)
elif [ -d /sys/firmware/efi ]; then
  f=$(ls /sys/firmware/efi/efivars/SecureBoot-* 2>/dev/null | head -n1)
  if [ -n "$f" ]; then b=$(od -An -t u1 -j4 -N1 "$f" | tr -d ' ')
    [ "$b" = 1 ] && sb="SecureBoot enabled" || sb="SecureBoot disabled"
  else sb="unknown"; fi
else sb="not EFI"; fi
echo "secure_boot=$sb"
echo "time_synced=$(timedatectl show -p NTPSynchronized --value 2>/dev/null || echo unknown)"
echo "swap=$(tail -n +2 /proc/swaps | awk '{print $1}' | tr '\n' ' ')"
echo "swap_fstab=$(awk '!/^[[:space:]]*#/ && $3 == "swap" {print $1}' /etc/fstab 2>/dev/null | tr '\n' ' ')"
if [ -e "/lib/modules/$k/build" ] || [ -d "/usr/src/linux-headers-$k" ]; then
  echo headers=1; else echo headers=0
  # the candidate matters only to a DKMS build, so only where an NVIDIA device waits for a
  # driver: apt-cache reads every list it has, on every probe of every node that lacks headers
  nv=0; [ -e /proc/driver/nvidia/version ] || for d in /sys/bus/pci/devices/*/vendor; do
    _gk_read "$d"; [ "$_gk_l" = 0x10de ] && { nv=1; break; }; done
  if [ $nv = 0 ]; then echo headers_candidate=-
  elif command -v apt-cache >/dev/null 2>&1; then
    c=$(apt-cache policy "linux-headers-$k" 2>/dev/null | awk '$1 == "Candidate:" && $2 != "(none)" {print $2}')
    if [ -z "$c" ]; then  # no candidate is only an answer when apt's lists are newer than its sources
      n=$(ls -t /var/lib/apt/lists/*_Packages* 2>/dev/null | head -n1)
      if [ -z "$n" ] || [ -n "$(find /etc/apt/sources.list /etc/apt/sources.list.d -type f -newer "$n" 2>/dev/null | head -n1)" ]; then c=unknown; fi
    fi
    echo "headers_candidate=$c"
  else echo headers_candidate=unknown; fi
fi
if command -v ss >/dev/null 2>&1; then
  echo "listen=$(ss -Htln 2>/dev/null | awk '{n=split($4,a,":"); print a[n]}' | sort -un | tr '\n' ' ')"
elif [ -r /proc/net/tcp ]; then
  # state 0A is LISTEN; the local port is the hex after the colon
  echo "listen=$(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '$4 == "0A" {split($2, a, ":"); print a[2]}' | sort -u | while read -r h; do printf '%d ' "0x$h"; done)"
else echo listen=unknown; fi
[ -e /var/run/reboot-required ] && echo reboot_required=1 || echo reboot_required=0
"""

    def parse(self, output: str, exit_code: int) -> SystemInfo:
        kv = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
        return SystemInfo(
            kernel=kv.get("kernel", ""), arch=kv.get("arch", ""),
            hostname=kv.get("hostname", ""), cpus=int(kv.get("cpus") or 0),
            memory_mb=int(kv.get("mem_kb") or 0) // 1024, cgroup=kv.get("cgroup", ""),
            product_uuid=kv.get("product_uuid", "").strip().lower(),
            machine_id=kv.get("machine_id", "").strip(), boot_id=kv.get("boot_id", "").strip(),
            # systemd-detect-virt prints "none" on bare metal; an empty answer is not one
            virt=kv.get("virt", "").strip() or "unknown",
            secure_boot=kv.get("secure_boot", "unknown").strip(),
            time_synced=kv.get("time_synced", "unknown").strip(),
            swap_active=tuple(kv.get("swap", "").split()),
            swap_fstab=tuple(kv.get("swap_fstab", "").split()),
            headers=kv.get("headers") == "1",
            listening=None if kv.get("listen", "").strip() == "unknown" else
            tuple(int(p) for p in kv.get("listen", "").split() if p.isdigit()),
            reboot_required=kv.get("reboot_required") == "1",
            init=kv.get("init", "").strip() or "unknown", systemd=kv.get("systemd") == "1",
            modprobe=kv.get("modprobe") == "1", modules_dir=kv.get("modules_dir") == "1",
            virt_source=kv.get("virt_source", "systemd-detect-virt").strip(),
            headers_candidate=kv.get("headers_candidate", "unknown").strip(),
            hypervisor=kv.get("hypervisor") == "1",
            virt_evidence=kv.get("virt_evidence", "").strip(),
        )


@dataclass(frozen=True)
class PciDevice:
    address: str
    vendor: str
    device: str
    pci_class: str

    @property
    def is_gpu(self) -> bool:
        return self.vendor == "0x10de" and self.pci_class[:6] in ("0x0300", "0x0302")

    @property
    def is_nvswitch(self) -> bool:
        return self.vendor == "0x10de" and self.pci_class.startswith("0x0680")

    @property
    def model(self) -> str:
        return NVIDIA_MODELS.get(self.device, f"NVIDIA GPU [10de:{self.device[2:]}]")


class PciDevices(Fact[tuple[PciDevice, ...]]):
    """NVIDIA PCI functions from sysfs (no driver or lspci needed)."""

    def command(self) -> str:
        # `read`, not cat: a server has a hundred PCI functions or more
        return r"""for d in /sys/bus/pci/devices/*; do
  v=; { read -r v; } 2>/dev/null <"$d/vendor"; [ "$v" = 0x10de ] || continue
  { read -r dev; } <"$d/device"; { read -r cls; } <"$d/class"; echo "${d##*/} $v $dev $cls"
done; true"""

    def parse(self, output: str, exit_code: int) -> tuple[PciDevice, ...]:
        devices = []
        for line in output.splitlines():
            parts = line.split()
            if len(parts) == 4:
                devices.append(PciDevice(parts[0], parts[1].lower(), parts[2].lower(),
                                         parts[3].lower()))
        return tuple(sorted(devices, key=lambda d: d.address))


#: what shows a module's code is in the running kernel when /sys/module lacks it (a built-in
#: module without parameters has no /sys/module entry, and /lib/modules may be absent)
_MODULE_EVIDENCE = {"br_netfilter": "[ -d /proc/sys/net/bridge ]",
                    "overlay": "grep -qw overlay /proc/filesystems"}


class KernelModules(Fact[dict[str, bool]]):
    """Whether each named kernel module is present: loaded (/sys/module), built into the
    kernel (modules.builtin), or shown by what it provides (/proc/sys/net/bridge for
    br_netfilter, /proc/filesystems for overlay)."""

    def command(self) -> str:
        lines = ['b="/lib/modules/$(uname -r)/modules.builtin"']
        for m in self.args:
            # the name is data: one quoted word in $m, printed with printf, never code
            test = '[ -d "/sys/module/$m" ] || grep -qF "/$m.ko" "$b" 2>/dev/null'
            if m in _MODULE_EVIDENCE:
                test += f" || {_MODULE_EVIDENCE[m]}"
            lines.append(f"m={shell(m)}; if {test}; then printf '%s 1\\n' \"$m\"; "
                         "else printf '%s 0\\n' \"$m\"; fi")
        return "\n".join(lines)

    def parse(self, output: str, exit_code: int) -> dict[str, bool]:
        return {p[0]: p[1] == "1" for p in (line.split() for line in output.splitlines())
                if len(p) == 2}


class Sysctls(Fact[dict[str, str]]):
    """Current values of sysctl keys (absent keys are missing from the dict)."""

    def command(self) -> str:
        return "for k in " + " ".join(shell(k) for k in self.args) + \
            '; do v=$(sysctl -n "$k" 2>/dev/null) && printf \'%s=%s\\n\' "$k" "$v"; done; true'

    def parse(self, output: str, exit_code: int) -> dict[str, str]:
        return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


PENDING_HANDLERS = "/var/lib/gpuk8s/pending-handlers"


def handler_marker(role: str, handler: str) -> str:
    """The marker file name of ``role``'s ``handler`` ("restart containerd")."""
    return f"{role}--" + re.sub(r"[^a-z0-9]+", "-", handler.lower()).strip("-")


class PendingHandlers(Fact[frozenset[str]]):
    """The handlers an earlier run notified and never ran (their markers, see
    handler_marker)."""

    def command(self) -> str:
        return f"ls -1 {PENDING_HANDLERS} 2>/dev/null; true"

    def parse(self, output: str, exit_code: int) -> frozenset[str]:
        return frozenset(n for n in output.split() if re.fullmatch(r"[a-z0-9_]+--[a-z0-9-]+", n))
