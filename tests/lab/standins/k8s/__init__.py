# LAB STAND-IN: not the real Kubernetes. Test infrastructure for gpuk8s; never shipped to users.
"""Shared code of the lab stand-ins for kubeadm, kubelet, kubectl, crictl and kube-apiserver.

Installed on lab nodes as /usr/lib/gpuk8s-lab/k8s/ (python package ``k8s``); in the repository it
lives in tests/lab/standins/k8s/. Stdlib only, plus PyYAML (Debian's python3-yaml on nodes).
"""
