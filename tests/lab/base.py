"""The node base image: a debootstrapped, pre-configured Debian 12 rootfs, cached."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

from .paths import HOST_IP, PROXY_PORT, PROXY_URL, LabError, cache_dir, run

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"

# CONTRACT.md "Node side" plus what a booted, ssh-reachable systemd container needs.
PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "openssh-server", "sudo", "python3", "iproute2",
    "pciutils", "kmod", "ca-certificates", "gnupg", "curl", "procps", "iptables", "conntrack",
    "less", "netbase", "libpam-systemd",
]

# bump when configure() changes: the key decides whether the cached base is rebuilt
CONFIG_VERSION = 7

MASKED_UNITS = [
    "getty.target", "console-getty.service", "getty@tty1.service",
    "apt-daily.timer", "apt-daily-upgrade.timer", "apt-daily.service",
    "apt-daily-upgrade.service", "e2scrub_all.timer", "e2scrub_reap.service", "fstrim.timer",
    "man-db.timer", "dpkg-db-backup.timer", "systemd-networkd-wait-online.service",
    "systemd-journald-audit.socket", "proc-sys-fs-binfmt_misc.automount",
    "systemd-firstboot.service", "systemd-hwdb-update.service",
]

APT_PROXY = f"""\
Acquire::http::Proxy "{PROXY_URL}";
Acquire::http::Proxy::{HOST_IP} "DIRECT";
Acquire::Languages "none";
"""

SOURCES = f"""\
deb {MIRROR} {SUITE} main
deb {MIRROR} {SUITE}-updates main
deb {SECURITY_MIRROR} {SUITE}-security main
"""

SSHD_CONF = """\
# gpuk8s lab: root by key only, no passwords over ssh
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
"""

# The node's PID 1 is this wrapper (nspawn runs it instead of --boot), which fixes up the
# container before systemd starts, so systemd sees the final mounts from the beginning:
# - mount the fake DMI folder (/etc/gpuk8s-lab/sysclass) over /sys/class: the lab host has no
#   /sys/class/dmi, and nspawn cannot create a bind mount point inside a read-only sysfs;
# - make /proc/sys/net writable (kubeadm/kubelet set net.* sysctls; the node has its own netns).
#   The nspawn way, SYSTEMD_NSPAWN_API_VFS_WRITABLE=network, re-mounts /sys/bus over the fake
#   PCI bind mount;
# - remount the cgroup v1 controllers read-write (nspawn mounts them read-only on a hybrid
#   host; each node has its own cgroup subtree, see supervisor.py), so containerd/runc work.
INIT_WRAPPER = """\
#!/bin/sh
# gpuk8s lab (LAB ONLY): container fix-ups before systemd, see tests/lab/base.py
if [ -d /etc/gpuk8s-lab/sysclass ] && [ ! -e /sys/class/dmi/id/product_uuid ]; then
    mount -t overlay gpuk8s-lab-sysclass \\
        -o lowerdir=/etc/gpuk8s-lab/sysclass:/sys/class /sys/class
fi
if ! grep -q " /proc/sys/net proc rw" /proc/mounts; then
    mount --bind /proc/sys/net /proc/sys/net && mount -o remount,bind,rw /proc/sys/net
fi
for m in /sys/fs/cgroup/*; do
    if grep -q " $m cgroup ro," /proc/mounts; then
        mount -o remount,bind,rw "$m" 2>/dev/null || mount -o remount,rw "$m"
    fi
done
exec /lib/systemd/systemd "$@"
"""

JOURNALD_CONF = """\
[Journal]
Storage=volatile
RuntimeMaxUse=16M
"""


def base_key() -> str:
    blob = json.dumps({"suite": SUITE, "packages": sorted(PACKAGES), "config": CONFIG_VERSION,
                       "mirror": MIRROR})
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def base_root() -> Path:
    return cache_dir() / "base" / "rootfs"


def base_ready() -> bool:
    stamp = cache_dir() / "base" / "key"
    return base_root().is_dir() and stamp.is_file() and stamp.read_text().strip() == base_key()


def ensure_base(*, force: bool = False) -> Path:
    """Build the base rootfs unless the cached one matches the package list and config."""
    if base_ready() and not force:
        return base_root()
    base = cache_dir() / "base"
    base.mkdir(parents=True, exist_ok=True)
    tmp = base / "rootfs.new"
    if tmp.exists():
        shutil.rmtree(tmp)
    t0 = time.monotonic()
    print(f"lab: debootstrap {SUITE} into {tmp} (via apt-cacher-ng) ...", flush=True)
    proc = run(
        [
            "debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
            "--components=main", SUITE, tmp,
            f"http://{HOST_IP}:{PROXY_PORT}/deb.debian.org/debian",
        ],
        check=False,
    )
    if proc.returncode != 0:
        log = tmp / "debootstrap" / "debootstrap.log"
        tail = log.read_text()[-3000:] if log.exists() else proc.stdout[-3000:]
        raise LabError(f"debootstrap failed ({proc.returncode}):\n{proc.stderr}\n{tail}")
    configure(tmp)
    t1 = time.monotonic()
    old = base / "rootfs.old"
    if base_root().exists():
        base_root().rename(old)
    tmp.rename(base_root())
    if old.exists():
        shutil.rmtree(old)
    (base / "key").write_text(base_key() + "\n")
    (base / "build-seconds").write_text(f"{t1 - t0:.1f}\n")
    print(f"lab: base rootfs ready in {t1 - t0:.1f} s", flush=True)
    return base_root()


# bookworm's pci.ids (2023) predates H200/L40S and misspells H100 SXM5: patch like update-pciids
PCI_IDS_NVIDIA = {
    "2330": "GH100 [H100 SXM5 80GB]",
    "2335": "GH100 [H200 SXM 141GB]",
    "20b2": "GA100 [A100 SXM4 80GB]",
    "26b9": "AD102GL [L40S]",
    "22a3": "GH100 [H100 NVSwitch]",
}


def patch_pci_ids(root: Path) -> None:
    path = root / "usr/share/misc/pci.ids"
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8", errors="surrogateescape").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("10de  "))
    end = next(i for i in range(start + 1, len(lines))
               if lines[i] and not lines[i].startswith(("\t", "#")))
    block = lines[start + 1:end]
    known = {line[1:5]: i for i, line in enumerate(block)
             if line.startswith("\t") and not line.startswith("\t\t")}
    extra = []
    for dev, name in PCI_IDS_NVIDIA.items():
        if dev in known:
            block[known[dev]] = f"\t{dev}  {name}"
        else:
            extra.append(f"\t{dev}  {name}")
    lines[start + 1:end] = extra + block
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogateescape")


def _write(root: Path, rel: str, text: str, mode: int = 0o644) -> None:
    path = root / rel.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def configure(root: Path) -> None:
    """Everything common to all nodes; per-node files are written by node.prepare()."""
    _write(root, "/etc/apt/apt.conf.d/01gpuk8s-lab-proxy", APT_PROXY)
    _write(root, "/etc/apt/sources.list", SOURCES)
    (root / "etc/apt/keyrings").mkdir(parents=True, exist_ok=True)
    _write(root, "/etc/ssh/sshd_config.d/gpuk8s-lab.conf", SSHD_CONF)
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    _write(root, "/usr/local/sbin/gpuk8s-lab-init", INIT_WRAPPER, 0o755)
    _write(root, "/etc/systemd/journald.conf.d/gpuk8s-lab.conf", JOURNALD_CONF)
    _write(root, "/etc/machine-id", "")
    (root / "var/lib/dbus/machine-id").unlink(missing_ok=True)
    _write(root, "/etc/hostname", "localhost\n")
    _write(root, "/etc/resolv.conf", f"# gpuk8s lab: no DNS, apt goes through {PROXY_URL}\n")
    _write(root, "/etc/sudoers.d/gpuk8s-lab", "Defaults lecture=never\n", 0o440)
    patch_pci_ids(root)
    chroot = ["chroot", root]
    run([*chroot, "useradd", "--create-home", "--shell", "/bin/bash", "--groups", "sudo",
         "labadmin"])
    run([*chroot, "systemctl", "enable", "systemd-networkd.service", "ssh.service"])
    run([*chroot, "systemctl", "mask", *MASKED_UNITS])
    run([*chroot, "apt-get", "clean"])
    for d in ("var/lib/apt/lists",):
        for f in (root / d).glob("*"):
            if f.is_file():
                f.unlink()
