"""Day-2 commands from the same inventory as bootstrap: reprovision, add/remove a node, reset,
status, upgrades (driver, Kubernetes) and kubeconfig. Each contacts only the hosts it names plus
the first control plane, previews what it will do, and writes the same run folder and report as
bootstrap.

- steps: what they share (a session with facts, one logged script, batches); drain and
  uncordon are gpuk8s.drain's (bootstrap's MIG phase drains too)
- nodes: reprovision, add_node, remove_node, reset
- status: status, kubeconfig; gpuusage: gpu_usage (Prometheus, gpu_monitoring)
- upgrades: upgrade, upgrade_driver; kubernetes: upgrade_kubernetes
- certs: renew_certs
- users: user_kubeconfig (a lab user's credentials)
- backup: backup, and the backup every control-plane change takes first (before_change)
- restore: restore (a backup onto the first control plane)
"""

from __future__ import annotations

from gpuk8s.day2.backup import backup
from gpuk8s.day2.certs import renew_certs
from gpuk8s.day2.gpuusage import gpu_usage
from gpuk8s.day2.nodes import add_node, remove_node, reprovision, reset
from gpuk8s.day2.restore import restore
from gpuk8s.day2.status import kubeconfig, status
from gpuk8s.day2.upgrades import upgrade, upgrade_driver
from gpuk8s.day2.users import user_kubeconfig

__all__ = ["add_node", "backup", "gpu_usage", "kubeconfig", "remove_node", "renew_certs",
           "reprovision", "reset", "restore", "status", "upgrade", "upgrade_driver",
           "user_kubeconfig"]
