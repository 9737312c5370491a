"""The kubeadm stand-in on a temp root: its config decoding (v1beta4, feature gates), its preflight
checks with kubeadm's `[ERROR ...]` texts, and the subcommands it refuses."""

from __future__ import annotations

import socket
import subprocess

import pytest
from k8s import featuregates
from k8s.kubeadm_config import ConfigError, decode

from tests.lab.selftest.standins.k8s_helpers import CTR_OK, INIT_CFG, NEEDS_OPENSSL, Node, free_port

pytestmark = NEEDS_OPENSSL


class TestKubeadmConfig:
    INIT = """apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
nodeRegistration:
  kubeletExtraArgs:
  - name: node-ip
    value: 10.88.0.11
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
apiServer:
  extraArgs:
  - name: feature-gates
    value: DRAPartitionableDevices=true
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
featureGates: {InPlacePodVerticalScaling: true}
"""

    def test_v1beta4_ok(self) -> None:
        assert set(decode(self.INIT)) == {"InitConfiguration", "ClusterConfiguration",
                                          "KubeletConfiguration"}

    def test_v1beta3_removed(self) -> None:
        with pytest.raises(ConfigError, match=r'no kind "InitConfiguration" is registered for '
                           r'version "kubeadm\.k8s\.io/v1beta3"'):
            decode(self.INIT.replace("v1beta4", "v1beta3", 1))

    def test_extra_args_map_refused(self) -> None:
        bad = self.INIT.replace("  extraArgs:\n  - name: feature-gates\n    value: "
                                "DRAPartitionableDevices=true", "  extraArgs:\n    "
                                "feature-gates: DRAPartitionableDevices=true")
        with pytest.raises(ConfigError, match=r"cannot unmarshal object into Go struct field "
                           r"APIServer\.apiServer\.extraArgs of type \[\]v1beta4\.Arg"):
            decode(bad)

    def test_unknown_field(self) -> None:
        with pytest.raises(ConfigError, match='strict decoding error: unknown field "foo"'):
            decode(self.INIT.replace("kind: InitConfiguration", "kind: InitConfiguration\nfoo: 1"))

    @pytest.mark.parametrize("where", ["kubelet", "apiserver"])
    def test_accelerators_gate_unknown(self, where: str) -> None:
        if where == "kubelet":
            text = self.INIT.replace("InPlacePodVerticalScaling", "Accelerators")
        else:
            text = self.INIT.replace("DRAPartitionableDevices=true", "Accelerators=true")
        with pytest.raises(ConfigError, match="unrecognized feature gate: Accelerators"):
            decode(text)

    def test_locked_gate(self) -> None:
        with pytest.raises(featuregates.GateError, match="locked to true"):
            featuregates.validate({"DynamicResourceAllocation": False})
        assert featuregates.validate({"NodeSwap": True}) == {"NodeSwap": True}


def preflight_errors(r: subprocess.CompletedProcess[str]) -> list[str]:
    return [ln.strip() for ln in r.stderr.splitlines() if ln.startswith("\t[ERROR ")]


class TestKubeadmPreflight:
    def cfg(self, node: Node, text: str | None = None) -> str:
        p = node.root / "_kubeadm.yaml"
        p.write_text(text or INIT_CFG.format(port=free_port()))
        return str(p)

    @pytest.mark.parametrize(("argv", "message"), [pytest.param(argv, message, id="-".join(argv))
                                                  for argv, message in [
        (("version",), 'unknown command "version" for "kubeadm"'),
        (("certs", "certificate-key"), 'unknown command "certificate-key" for "kubeadm certs"'),
        (("certs", "renew", "apiserver"),
         'unknown command "renew apiserver" for "kubeadm certs"'),
        (("token", "list"), 'unknown command "list" for "kubeadm token"'),
        (("token", "delete", "abcdef"), 'unknown command "delete" for "kubeadm token"'),
        (("token", "generate"), 'unknown command "generate" for "kubeadm token"'),
        (("upgrade", "plan"), 'unknown command "plan" for "kubeadm upgrade"')]])
    def test_subcommands_gpuk8s_never_runs_are_refused(self, node: Node, argv: tuple[str, ...],
                                                       message: str) -> None:
        """The stand-in plays what gpuk8s runs (CONTRACT.md); anything else is refused as
        real kubeadm refuses a command it does not have, never half-played."""
        r = node.run("kubeadm", *argv)
        assert r.returncode == 1 and r.stderr.startswith(message), r.stderr

    def test_config_validate(self, node: Node) -> None:
        assert node.run("kubeadm", "config", "validate", "--config", self.cfg(node)
                        ).returncode == 0
        r = node.run("kubeadm", "config", "validate", "--config",
                     self.cfg(node, INIT_CFG.format(port=1).replace("v1beta4", "v1beta3")))
        assert r.returncode == 1
        assert 'no kind "InitConfiguration" is registered for version "kubeadm.k8s.io/v1beta3"' \
            in r.stderr

    def test_init_refuses_swap_ipforward(self, node: Node) -> None:
        node.swaps.write_text(node.swaps.read_text() + "/swap.img file 4194300 0 -2\n")
        (node.root / "proc/sys/net/ipv4/ip_forward").write_text("0\n")
        r = node.run("kubeadm", "init", "--config", self.cfg(node), "--skip-token-print")
        assert r.returncode == 1
        assert r.stdout.splitlines()[1] == "[preflight] Running pre-flight checks"
        assert preflight_errors(r) == [
            "[ERROR Swap]: running with swap on is not supported. Please disable swap",
            "[ERROR FileContent--proc-sys-net-ipv4-ip_forward]: /proc/sys/net/ipv4/ip_forward "
            "contents are not set to 1"]
        assert r.stderr.startswith("error execution phase preflight: [preflight] Some fatal "
                                   "errors occurred:\n")
        assert "--ignore-preflight-errors=..." in r.stderr
        assert r.stderr.rstrip().endswith("To see the stack trace of this error execute with "
                                          "--v=5 or higher")
        r = node.run("kubeadm", "init", "--config", self.cfg(node),
                     "--ignore-preflight-errors=Swap,FileContent--proc-sys-net-ipv4-ip_forward",
                     "--dry-run-not-a-flag")
        assert r.returncode == 1  # unknown flag refused before doing anything

    def test_swap_allowed_when_failswapon_false(self, node: Node) -> None:
        node.swaps.write_text(node.swaps.read_text() + "/swap.img file 4194300 0 -2\n")
        node.cri_down()
        text = INIT_CFG.format(port=free_port()) + "failSwapOn: false\n"
        r = node.run("kubeadm", "init", "--config", self.cfg(node, text))
        assert not any("Swap" in e for e in preflight_errors(r))
        assert "[WARNING Swap]" in r.stdout

    def test_cri_socket_missing(self, node: Node) -> None:
        node.cri_down()
        r = node.run("kubeadm", "init", "--config", self.cfg(node))
        errs = preflight_errors(r)
        assert errs[0].startswith("[ERROR CRI]: container runtime is not running: validate "
                                  "service connection: validate CRI v1 runtime API for endpoint "
                                  '"unix:///var/run/containerd/containerd.sock"')

    def test_cri_plugin_disabled(self, node: Node) -> None:
        node.set(ctr=CTR_OK.replace("io.containerd.grpc.v1                     cri"
                                    "                      -              ok\n", ""))
        r = node.run("kubeadm", "init", "--config", self.cfg(node))
        assert preflight_errors(r) == [
            '[ERROR CRI]: container runtime is not running: validate service connection: CRI v1 '
            'runtime API is not implemented for endpoint "unix:///var/run/containerd/'
            'containerd.sock": rpc error: code = Unimplemented desc = unknown service '
            "runtime.v1.RuntimeService"]

    def test_cgroup_driver_mismatch(self, node: Node) -> None:
        node.set(systemd="false")
        r = node.run("kubeadm", "init", "--config", self.cfg(node))
        errs = preflight_errors(r)
        assert len(errs) == 1 and errs[0].startswith("[ERROR CgroupDriver]: the kubelet "
                                                      'cgroupDriver "systemd" does not match')

    def test_port_in_use_and_already_initialised(self, node: Node) -> None:
        port = free_port()
        s = socket.socket()
        s.bind(("0.0.0.0", port))
        s.listen()
        (node.root / "etc/kubernetes/manifests/kube-apiserver.yaml").write_text("x")
        (node.root / "var/lib/etcd/member").mkdir()
        try:
            r = node.run("kubeadm", "init", "--config",
                         self.cfg(node, INIT_CFG.format(port=port)))
        finally:
            s.close()
        assert preflight_errors(r) == [
            f"[ERROR Port-{port}]: Port {port} is in use",
            "[ERROR FileAvailable--etc-kubernetes-manifests-kube-apiserver.yaml]: "
            "/etc/kubernetes/manifests/kube-apiserver.yaml already exists",
            "[ERROR DirAvailable--var-lib-etcd]: /var/lib/etcd is not empty"]

    def test_kubelet_missing(self, node: Node) -> None:
        (node.bin / "kubelet").unlink()
        env_path = f"{node.bin}:/usr/bin:/bin"
        r = node.run("kubeadm", "init", "--config", self.cfg(node), PATH=env_path)
        assert any(e.startswith("[ERROR KubeletVersion]: couldn't get kubelet version")
                   for e in preflight_errors(r))

    @pytest.mark.parametrize("edit,needle", [
        (("v1beta4", "v1beta3"), 'no kind "InitConfiguration" is registered for version '
                                 '"kubeadm.k8s.io/v1beta3"'),
        (("  - name: feature-gates\n    value: DRAPartitionableDevices=true",
          "    feature-gates: DRAPartitionableDevices=true"),
         "json: cannot unmarshal object into Go struct field APIServer.apiServer.extraArgs of "
         "type []v1beta4.Arg"),
        (("ImageVolume", "Accelerators"), "unrecognized feature gate: Accelerators"),
        (("DRAPartitionableDevices=true", "Accelerators=true"),
         "unrecognized feature gate: Accelerators"),
    ])
    def test_init_refuses_config(self, node: Node, edit: tuple[str, str], needle: str) -> None:
        text = INIT_CFG.format(port=free_port()).replace(*edit)
        r = node.run("kubeadm", "init", "--config", self.cfg(node, text))
        assert r.returncode == 1
        assert needle in r.stderr
        assert not (node.root / "etc/kubernetes/pki/ca.crt").exists()
