"""The facts that share a read (issue #31) give the values their own commands gave before.

Each fact's command of before the shared reads is kept here, verbatim, as OLD_*; both run in
sh against the same tools, and every fact must parse to the same value: run alone (a fact's
command runs its shared read itself) and in one probe (where the read runs once for all).

- nvidia-smi is the lab's stand-in (tests/lab/standins/nvidia, checked against the real
  H200's outputs), in a fake root: two H200s, MIG off; one in MIG mode with and without a
  compute instance; no driver loaded; a driver/library version mismatch; none installed.
- systemctl answers as systemd 252 does for a unit table with every kind of state
  (active, inactive, not found, masked, static, an alias, a SysV script's generated unit),
  and, with no systemd running, as systemctl does then (is-enabled still reads the files).
- kubectl answers each read, or fails one, or times one out."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.facts import Fact
from gpuk8s.facts.dra import Dra
from gpuk8s.facts.kube import MANAGED_KINDS, Cluster
from gpuk8s.facts.nvidia import QUERY_FIELDS, GpuTopology, MigState, Nvidia
from gpuk8s.facts.probe import build_probe, parse_probe
from gpuk8s.facts.system import Files, Services
from gpuk8s.sinks import shell
from tests.lab.selftest.standins.nvidia_helpers import (
    DUAL,
    NEW,
    OLD,
    SINGLE,
    fake_pci,
    install_files,
    load_module,
)

ADMIN_CONF = "/etc/kubernetes/admin.conf"

# --------------------------------------------------------------- the commands of before #31
OLD_NVIDIA = f"""if command -v nvidia-smi >/dev/null 2>&1; then
  echo '## query'; nvidia-smi --query-gpu={QUERY_FIELDS} --format=csv,noheader,nounits 2>&1
  echo "## rc $?"; echo '## header'; nvidia-smi 2>/dev/null | grep -m1 'CUDA Version'
else echo '## absent'; fi
echo '## proc'; cat /proc/driver/nvidia/version 2>/dev/null
echo '## nvswitch'; ls /proc/driver/nvidia-nvswitch/devices 2>/dev/null | head -n1; true"""
OLD_TOPOLOGY = """command -v nvidia-smi >/dev/null 2>&1 || exit 0
nvidia-smi -L >/dev/null 2>&1 || exit 0
echo '## nvlink'; nvidia-smi nvlink -s 2>/dev/null
echo '## topo'; nvidia-smi topo -m 2>/dev/null; true"""
OLD_MIG = """command -v nvidia-smi >/dev/null 2>&1 || exit 0
nvidia-smi -L >/dev/null 2>&1 || exit 0
echo '## mode'; nvidia-smi --query-gpu=index,mig.mode.current,mig.mode.pending \\
--format=csv,noheader 2>/dev/null
echo '## list'; nvidia-smi -L 2>/dev/null
echo '## gi'; nvidia-smi mig -lgi 2>/dev/null; true"""


def old_services(*units: str) -> str:
    return "for u in " + " ".join(shell(u) for u in units) + \
        '; do printf \'%s %s %s\\n\' "$u" "$(systemctl is-active "$u" 2>/dev/null | head -n1)" ' \
        '"$(systemctl is-enabled "$u" 2>/dev/null | head -n1)"; done'


OLD_CLUSTER = f"""[ -f {ADMIN_CONF} ] && command -v kubectl >/dev/null 2>&1 || exit 0
k="timeout 15 kubectl --kubeconfig {ADMIN_CONF} --request-timeout=10s"
late="the API server did not answer within 15s"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
$k get nodes -o json >"$d/n" 2>"$d/ne" & n=$!
$k get {MANAGED_KINDS} -A -l app.kubernetes.io/managed-by=gpuk8s -o json >"$d/m" 2>"$d/me" & m=$!
wait $n; a=$?; wait $m; b=$?
[ $a -eq 124 ] && echo "$late" >>"$d/ne"; [ $b -eq 124 ] && echo "$late" >>"$d/me"
[ $a -eq 0 ] || {{ tail -n 3 "$d/ne"; exit 3; }}
[ $b -eq 0 ] || {{ tail -n 3 "$d/me"; exit 4; }}
cat "$d/n"; echo '## managed'; cat "$d/m"
"""
OLD_DRA = f"""[ -f {ADMIN_CONF} ] && command -v kubectl >/dev/null 2>&1 || exit 0
k="timeout 15 kubectl --kubeconfig {ADMIN_CONF} --request-timeout=10s"
$k get deviceclasses,validatingadmissionpolicies,validatingadmissionpolicybindings -o json \\
  || exit 3
echo '## slices'
$k get resourceslices -o json || exit 4"""


# ------------------------------------------------------------------------------ harness
def sh(script: str, tools: Path, env: dict[str, str] | None = None,
       here: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``script`` in sh, with ``tools`` first on the PATH (the probe sets its own PATH: the
    folder goes in front of it) and admin.conf at ``here`` when given."""
    script = script.replace("export LC_ALL=C PATH=", f"export LC_ALL=C PATH={tools}:")
    if here is not None:
        script = script.replace(ADMIN_CONF, str(here))
    return subprocess.run(["/bin/sh", "-c", f"exec 2>&1\n{script}"], capture_output=True,
                          text=True, timeout=120, check=False,
                          env={**os.environ, "PATH": f"{tools}:{os.environ['PATH']}",
                               **(env or {})})


def compare(facts: dict[Fact[Any], str], tools: Path, env: dict[str, str] | None = None,
            here: Path | None = None) -> dict[Fact[Any], Any]:
    """Every fact's value from its old command, its new command alone and one probe of
    them all: the same. Returns the values."""
    script, marker = build_probe(list(facts))
    probe = parse_probe("h", sh(script, tools, env, here).stdout, list(facts), marker)
    for fact, old in facts.items():
        before = sh(f"( {old}\n) </dev/null", tools, env, here)
        alone = sh(f"( {fact.command()}\n) </dev/null", tools, env, here)
        want = fact.parse(before.stdout, before.returncode)
        assert fact.parse(alone.stdout, alone.returncode) == want, (fact, alone.stdout)
        assert probe[fact] == want, fact
    return dict(probe)


# ---------------------------------------------------------------------------- nvidia-smi
NVIDIA_FACTS: dict[Fact[Any], str] = {Nvidia(): OLD_NVIDIA, MigState(): OLD_MIG,
                                      GpuTopology(): OLD_TOPOLOGY}


def standin(tmp_path: Path, gpus: Path, *, loaded: str | None = NEW) -> Path:
    """A PATH folder whose nvidia-smi is the lab's, in a fake root with ``gpus``' PCI
    functions."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/machine-id").write_text("5f1c0c7e4a8b4d0f9e6b2a1c3d4e5f60\n")
    fake_pci(root, (gpus / "sys-pci-nvidia.txt").read_text().splitlines())
    install_files(root, "nvidia-driver-cuda", NEW)
    if loaded:
        load_module(root, loaded)
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text(f"#!/bin/sh\nGPUK8S_LAB_ROOT={root} exec "
                                      f"{root}/usr/bin/nvidia-smi \"$@\"\n")
    (tools / "nvidia-smi").chmod(0o755)
    return tools


def test_two_gpus_mig_off(tmp_path: Path) -> None:
    tools = standin(tmp_path, DUAL)
    values = compare(NVIDIA_FACTS, tools)
    assert [g.bus_id for g in values[Nvidia()].gpus] == ["00000000:00:06.0", "00000000:00:07.0"]
    assert values[Nvidia()].cuda_version == "13.0"  # --version's line, as the table's header
    assert [(m.mode, m.pending, m.instances) for m in values[MigState()]] == \
        [("Disabled", "Disabled", ())] * 2
    assert values[GpuTopology()].matrix == {"GPU0": {"GPU1": "NV18"}, "GPU1": {"GPU0": "NV18"}}


@pytest.mark.parametrize("compute", [True, False])
def test_a_gpu_in_mig_mode(tmp_path: Path, compute: bool) -> None:
    """MIG devices and GPU instances are listed once a GPU is in MIG mode; a GPU instance
    without its compute instance shows (the GPU is not tidy)."""
    tools = standin(tmp_path, SINGLE)
    smi = [str(tools / "nvidia-smi")]
    for args in (["-i", "0", "-mig", "1"], ["mig", "-cgi", "9"] + ["-C"] * compute):
        assert subprocess.run(smi + args, capture_output=True, check=False).returncode == 0
    gpu = compare(NVIDIA_FACTS, tools)[MigState()][0]
    assert (gpu.mode, gpu.instances, gpu.devices, gpu.tidy) == \
        ("Enabled", ("3g.71gb",), ("3g.71gb",) * compute, compute)


@pytest.mark.parametrize("loaded", [None, OLD])
def test_no_usable_driver(tmp_path: Path, loaded: str | None) -> None:
    """No driver loaded, or a driver older than nvidia-smi: the Nvidia fact carries the
    error; no topology, no MIG state."""
    tools = standin(tmp_path, SINGLE, loaded=loaded)
    values = compare(NVIDIA_FACTS, tools)
    assert values[Nvidia()].exit_code == (9 if loaded is None else 18)
    assert values[MigState()] == () and values[GpuTopology()].matrix == {}


def test_no_nvidia_smi(tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    assert not compare(NVIDIA_FACTS, tools)[Nvidia()].smi_present


def test_nvidia_smi_arriving_after_the_shared_read(tmp_path: Path) -> None:
    """A driver install still unpacking (a killed run's apt goes on) brings nvidia-smi
    between the shared read, which found none, and the Nvidia fact: the fact keeps the
    read's answer (no nvidia-smi) instead of reading its "absent" as an exit code (stop
    43's CI: "cannot parse fact Nvidia: invalid literal for int()")."""
    tools = standin(tmp_path, DUAL)
    out = sh(f"_gk_smi=; _gk_smi_rc=absent\n{Nvidia().command()}", tools)
    state = Nvidia().parse(out.stdout, out.returncode)
    assert not state.smi_present and state.gpus == ()
    # and where the read did run it, the same script gives the GPUs
    out = sh(Nvidia().command(), tools)
    assert len(Nvidia().parse(out.stdout, out.returncode).gpus) == 2


def test_an_exit_code_that_is_no_number_is_our_error() -> None:
    with pytest.raises(ValueError, match="not a number: 'absent'"):
        Nvidia().parse("## query\n## rc absent\n## header\n## proc\n", 0)


# ------------------------------------------------------------------------------ systemctl
#: unit -> (Id, LoadState, ActiveState, UnitFileState) as `systemctl show` gives them, and
#: what `is-enabled` prints (None: an error on stderr, nothing on stdout)
UNITS: dict[str, tuple[tuple[str, str, str, str], str | None]] = {
    "containerd": (("containerd.service", "loaded", "active", "enabled"), "enabled"),
    "docker": (("docker.service", "not-found", "inactive", ""), None),
    "kubelet": (("kubelet.service", "loaded", "activating", "enabled"), "enabled"),
    "haproxy": (("haproxy.service", "masked", "inactive", "masked"), "masked"),
    "nvidia-fabricmanager": (("nvidia-fabricmanager.service", "loaded", "failed", "disabled"),
                             "disabled"),
    "gpuk8s-mig.service": (("gpuk8s-mig.service", "loaded", "inactive", "static"), "static"),
    "sshd": (("ssh.service", "loaded", "active", "enabled"), "alias"),
    "oldsysv": (("oldsysv.service", "loaded", "active", "generated"), "enabled"),
    "systemd-tmpfiles-clean.timer": (("systemd-tmpfiles-clean.timer", "loaded", "active",
                                      "static"), "static"),
}
SYSTEMCTL = r'''
import json, os, sys
units, args = json.loads(os.environ["UNITS"]), sys.argv[1:]
with open(os.environ["LOG"], "a") as log:
    log.write(" ".join(args) + "\n")
if os.environ.get("NO_SYSTEMD"):  # is-enabled reads the unit files without systemd
    if args[0] == "is-enabled" and units.get(args[1], [0, None])[1] is not None:
        print(units[args[1]][1])
        sys.exit(0)
    print("System has not been booted with systemd as init system (PID 1). Can't operate.",
          file=sys.stderr)
    sys.exit(1)
if args[0] == "show":
    blocks = []
    for name in args[args.index("--") + 1:]:
        full = name if "." in name else name + ".service"
        (i, load, active, state), _ = units.get(name, ((full, "not-found", "inactive", ""), 0))
        lines = [f"Id={i}", f"LoadState={load}", f"ActiveState={active}"]
        blocks.append("\n".join(lines + ([f"UnitFileState={state}"] if state else [])) + "\n")
    sys.stdout.write("\n".join(blocks))
elif args[0] == "is-active":
    print(units.get(args[1], [["", "", "inactive"]])[0][2])
elif args[0] == "is-enabled":
    state = units.get(args[1], [None, None])[1]
    if state is None:
        print(f"Failed to get unit file state for {args[1]}.service: No such file or directory",
              file=sys.stderr)
        sys.exit(1)
    print(state)
'''


@pytest.fixture
def systemctl(tmp_path: Path) -> Path:
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "systemctl").write_text(f"#!{sys.executable}\n{SYSTEMCTL}")
    (tools / "systemctl").chmod(0o755)
    return tools


@pytest.mark.parametrize("no_systemd", [False, True])
def test_services_read_with_one_systemctl_show(tmp_path: Path, systemctl: Path,
                                               no_systemd: bool) -> None:
    """The Services facts of a probe (a unit in two of them) read every unit with one
    systemctl show, each value what is-active and is-enabled print: inactive and nothing
    (unknown) for a missing unit, masked, static, alias, a SysV unit's state as is-enabled
    gives it (it alone asks again). Without systemd: the two commands per unit, as before."""
    log = tmp_path / "log"
    env = {"UNITS": json.dumps(UNITS), "LOG": str(log)}
    if no_systemd:
        env["NO_SYSTEMD"] = "1"
    groups = [("containerd", "docker"), ("kubelet", "containerd"), ("haproxy",),
              ("nvidia-fabricmanager", "gpuk8s-mig.service"), ("sshd", "oldsysv", "nosuch"),
              ("systemd-tmpfiles-clean.timer",)]
    facts: dict[Fact[Any], str] = {Services(*g): old_services(*g)
                                   for g in (groups[:3] if no_systemd else groups)}
    values = compare(facts, systemctl, env)
    got = {u: (s.active, s.enabled) for v in values.values() for u, s in v.items()}
    if no_systemd:  # as before, is-enabled's word lands in .active when is-active said none
        assert got["docker"] == ("unknown", "unknown") and got["haproxy"] == ("masked",
                                                                              "unknown")
        return
    assert got == {"containerd": ("active", "enabled"), "docker": ("inactive", "unknown"),
                   "kubelet": ("activating", "enabled"), "haproxy": ("inactive", "masked"),
                   "nvidia-fabricmanager": ("failed", "disabled"),
                   "gpuk8s-mig.service": ("inactive", "static"), "sshd": ("active", "alias"),
                   "oldsysv": ("active", "enabled"), "nosuch": ("inactive", "unknown"),
                   "systemd-tmpfiles-clean.timer": ("active", "static")}
    # the probe's runs: one show for every unit, then is-enabled for the SysV unit alone
    log.write_text("")
    sh(build_probe(list(facts))[0], systemctl, env)
    assert log.read_text().splitlines() == [
        "show --property=Id,LoadState,ActiveState,UnitFileState -- containerd docker kubelet "
        "haproxy nvidia-fabricmanager gpuk8s-mig.service sshd oldsysv nosuch "
        "systemd-tmpfiles-clean.timer", "is-enabled oldsysv"]


def test_a_unit_name_that_is_a_pattern_is_asked_alone(tmp_path: Path, systemctl: Path) -> None:
    """systemctl show would list every unit a pattern matches: such a name is not in it."""
    log = tmp_path / "log"
    env = {"UNITS": json.dumps(UNITS), "LOG": str(log)}
    facts: dict[Fact[Any], str] = {Services("kubelet", "k*", "docker"):
                                   old_services("kubelet", "k*", "docker")}
    values = compare(facts, systemctl, env)
    assert {u: (s.active, s.enabled) for u, s in next(iter(values.values())).items()} == \
        {"kubelet": ("activating", "enabled"), "k*": ("inactive", "unknown"),
         "docker": ("inactive", "unknown")}
    assert log.read_text().splitlines()[0].endswith("-- kubelet docker")


# -------------------------------------------------------------------------------- kubectl
KUBECTL = """#!/bin/sh
case "$*" in
  *"get nodes "*) r=nodes; out='{"items": [{"metadata": {"name": "cp-01"}, "status":
    {"conditions": [{"type": "Ready", "status": "True"}]}}]}';;
  *"get deviceclasses,"*) r=classes; out='{"items": [{"kind": "DeviceClass", "metadata":
    {"name": "gpu.nvidia.com", "labels": {"app.kubernetes.io/managed-by": "gpuk8s"},
     "annotations": {"gpuk8s.io/sha256": "d"}}}]}';;
  *"get resourceslices "*) r=slices; out='{"items": [{"spec": {"driver": "gpu.nvidia.com",
    "nodeName": "gpu-01", "devices": [{"attributes": {"type": {"string": "gpu"}}}]}}]}';;
  *) r=managed; out='{"items": [{"kind": "RuntimeClass", "metadata": {"name": "nvidia",
    "annotations": {"gpuk8s.io/sha256": "abc"}}}]}';;
esac
case " $FAIL " in *" $r "*) echo "Unable to connect to the server ($r)" >&2; exit 1;; esac
case " $LATE " in *" $r "*) echo "I1128 slow" >&2; exit 124;; esac
echo "$out"
"""


@pytest.mark.parametrize("fail,late", [("", ""), ("nodes", ""), ("managed", ""),
                                       ("classes", ""), ("slices", ""), ("", "nodes"),
                                       ("", "managed slices"), ("nodes managed", "")])
def test_cluster_and_dra_read_in_one_round(tmp_path: Path, fail: str, late: str) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "kubectl").write_text(KUBECTL)
    (tools / "kubectl").chmod(0o755)
    admin = tmp_path / "admin.conf"
    admin.write_text("")
    values = compare({Cluster(): OLD_CLUSTER, Dra(): OLD_DRA}, tools,
                     {"FAIL": fail, "LATE": late}, admin)
    cluster, dra = values[Cluster()], values[Dra()]
    assert cluster.reachable == (not (fail + late).replace("classes", "").replace(
        "slices", "").strip())
    if "nodes" in late:
        assert cluster.error == "the API server did not answer within 15s"
    assert dra.reachable == ("classes" not in fail and "slices" not in fail + late)


def test_no_admin_conf_reads_nothing(tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    values = compare({Cluster(): OLD_CLUSTER, Dra(): OLD_DRA}, tools,
                     here=tmp_path / "missing.conf")
    assert not values[Cluster()].reachable and not values[Dra()].reachable


# --------------------------------------------------------------------------------- files
def old_files(*args: str) -> str:
    """The Files command of before its shared read, verbatim: two or three processes a path."""
    lines = []
    for arg in args:
        path = arg.lstrip("+")
        q = shell(path)
        if arg.startswith("+"):
            lines.append(f"if [ -e {q} ]; then printf 'P %s %s\\n' {q} "
                         f"\"$(stat -c '%a %U %Y' {q})\"; "
                         f"printf 'C %s %s\\n' {q} \"$(base64 -w0 < {q})\"; "
                         f"else printf 'N %s\\n' {q}; fi")
        else:
            lines.append(f"if [ -e {q} ]; then printf 'F %s %s %s\\n' {q} "
                         f"\"$(stat -c '%a %U' {q})\" "
                         f"\"$(sha256sum < {q} 2>/dev/null | cut -c1-64)\"; "
                         f"else printf 'N %s\\n' {q}; fi")
    return "\n".join(lines)


def test_files_read_with_one_stat_and_one_sha256sum(tmp_path: Path) -> None:
    """Every Files fact of a probe (paths shared between them, with and without content)
    gives what its command of before gave: a file (and one whose name begins like it), an
    empty one of mode 600, binary
    content, a folder, a symlink to a file and a dangling one, a missing path; the probe
    runs stat once and sha256sum once for all of them."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.conf").write_text("[plugins]\nsnapshotter = 'overlayfs'\n")
    (root / "a.conf old").write_text("a name that begins like another one\n")
    (root / "empty").write_text("")
    (root / "empty").chmod(0o600)
    (root / "bin.gpg").write_bytes(bytes(range(256)) * 3)
    os.utime(root / "bin.gpg", (1700000000, 1700000000))
    (root / "certs.d").mkdir()
    (root / "link").symlink_to(root / "a.conf")
    (root / "dangling").symlink_to(root / "gone")
    p = {n: str(root / n) for n in ("a.conf", "a.conf old", "empty", "bin.gpg", "certs.d",
                                    "link", "dangling", "missing")}
    groups = [(p["a.conf"], "+" + p["empty"], p["certs.d"], "+" + p["link"], p["a.conf old"]),
              ("+" + p["a.conf"], p["dangling"], p["missing"], "+" + p["bin.gpg"]),
              ("+" + p["certs.d"], p["link"], p["bin.gpg"], p["empty"])]
    tools = tmp_path / "bin"
    tools.mkdir()
    log = tmp_path / "log"
    for tool in ("stat", "sha256sum"):
        real = subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True,
                              text=True, check=True).stdout.strip()
        (tools / tool).write_text(f"#!/bin/sh\necho {tool} >> {log}\nexec {real} \"$@\"\n")
        (tools / tool).chmod(0o755)
    facts: dict[Fact[Any], str] = {Files(*g): old_files(*g) for g in groups}
    values = compare(facts, tools)
    a = values[Files(*groups[1])][p["a.conf"]]
    assert a.text == "[plugins]\nsnapshotter = 'overlayfs'\n" and a.mode == "644"
    assert values[Files(*groups[2])][p["bin.gpg"]].sha256 == \
        hashlib.sha256(bytes(range(256)) * 3).hexdigest()
    assert not values[Files(*groups[1])][p["dangling"]].exists
    log.write_text("")
    sh(build_probe(list(facts))[0], tools)
    assert sorted(log.read_text().split()) == ["sha256sum", "stat"]


def test_a_path_the_shared_read_cannot_split_is_refused() -> None:
    with pytest.raises(ValueError, match="no newline"):
        Files("/etc/a\\\\b").command()
