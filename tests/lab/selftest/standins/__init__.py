"""Tests of the lab's stand-ins (tests/lab/standins/), run on this machine without booting the
lab: the Kubernetes ones (test_k8s_*.py; an API server stand-in with a REAL etcd on 127.0.0.1,
kubeadm and the kubelet against a temp root; shared code in k8s_helpers.py and conftest.py) and
the NVIDIA ones (test_nvidia_*.py, against a fake /sys/bus/pci/devices; nvidia_helpers.py).

Importing this package puts tests/lab/standins on sys.path, so that its modules import the
stand-ins as the nodes' launchers do (``from k8s import kubelet``), whatever the import order.
"""

import sys
from pathlib import Path

STANDINS = Path(__file__).resolve().parents[2] / "standins"
if str(STANDINS) not in sys.path:
    sys.path.insert(0, str(STANDINS))
