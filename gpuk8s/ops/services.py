"""Service ops shared by roles."""

from __future__ import annotations

from gpuk8s.ops import Op, change


def restart_containerd(op_id: str) -> Op:
    """Restart containerd and wait until it answers on its socket (no fixed sleep)."""
    return change(op_id, "restart containerd", "systemctl restart containerd",
                  "for i in $(seq 1 100); do [ -S /run/containerd/containerd.sock ] && "
                  "ctr version >/dev/null 2>&1 && exit 0; sleep 0.1; done; "
                  "echo 'containerd did not come back' >&2; exit 1")
