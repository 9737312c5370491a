#!/usr/bin/env bash
# Install what the gpuk8s lab host needs (tests/lab): Debian 12, as root.
# Nodes are systemd-nspawn containers booted from a debootstrapped base; apt-cacher-ng is their
# package proxy. Safe to run again.
set -euo pipefail

if [ "$(id -u)" != 0 ]; then
    echo "lab-host-setup: run as root" >&2
    exit 1
fi

packages=(
    debootstrap systemd-container apt-cacher-ng apt-utils gnupg iproute2 iptables
    openssh-client dpkg-dev openssl ca-certificates curl
    docker-registry busybox-static
)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    # apt-cacher-ng's and docker-registry's postinsts would start their system services; the
    # lab runs its own instances on the lab bridge
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    apt-get update -q
    apt-get install -q -y --no-install-recommends "${missing[@]}"
fi

# a system apt-cacher-ng (if some init started one) would hold port 3142 on all addresses
if [ -f /run/apt-cacher-ng/pid ]; then
    kill "$(cat /run/apt-cacher-ng/pid)" 2>/dev/null || true
fi

# many booted systemds need many inotify instances (lab.up raises them too)
sysctl -q -w fs.inotify.max_user_instances=8192 fs.inotify.max_user_watches=1048576 || true

echo "lab-host-setup: ok ($(systemd-nspawn --version | head -1))"
