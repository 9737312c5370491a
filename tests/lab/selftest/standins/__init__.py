"""Tests of the lab's stand-ins (tests/lab/standins/), run on this machine without booting the
lab: the Kubernetes ones (test_k8s_*.py; an API server stand-in with a REAL etcd on 127.0.0.1,
kubeadm and the kubelet against a temp root) and the NVIDIA ones (test_nvidia_*.py, against a
fake /sys/bus/pci/devices)."""
