"""The wait for joined nodes to be Ready, run by a real shell against a kubectl that answers
from a script: a Node that registers a moment after its join is waited for (``kubectl wait``
alone fails at once on a Node that does not exist yet, as it did in CI on stop 41), and a Node
that never registers ends the wait with an error that names it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpuk8s.ops.kube import nodes_ready_wait


def fake_kubectl(tmp_path: Path, registers_after: int) -> Path:
    """A kubectl whose ``get`` says NotFound for cpu-01 until it has been asked
    ``registers_after`` times; its ``wait`` records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "kubectl"
    script.write_text(f"""#!/bin/sh
n=$(cat {tmp_path}/gets 2>/dev/null || echo 0)
case "$1" in
get)
  echo $((n + 1)) > {tmp_path}/gets
  echo "NAME     STATUS"; echo "gpu-01   Ready"
  if [ "$n" -lt {registers_after} ]; then
    echo 'Error from server (NotFound): nodes "cpu-01" not found' >&2; exit 1
  fi
  echo "cpu-01   NotReady";;
wait) echo "$@" > {tmp_path}/wait
  echo "node/gpu-01 condition met"; echo "node/cpu-01 condition met";;
*) exit 2;;
esac
""")
    script.chmod(0o755)
    return bin_dir


def run(bin_dir: Path, timeout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", nodes_ready_wait(["gpu-01", "cpu-01"], timeout,
                                                          kubectl="kubectl")],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin"})


def test_a_node_that_registers_late_is_waited_for(tmp_path: Path) -> None:
    proc = run(fake_kubectl(tmp_path, registers_after=1), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "node/cpu-01 condition met" in proc.stdout
    assert (tmp_path / "gets").read_text().strip() == "2"
    args = (tmp_path / "wait").read_text().split()
    assert args[:4] == ["wait", "--for=condition=Ready", "node/gpu-01", "node/cpu-01"]
    # the Ready wait gets what is left of the one time limit, not a fresh one
    left = int(args[4].removeprefix("--timeout=").removesuffix("s"))
    assert 50 <= left < 60


def test_a_node_that_never_registers_is_named(tmp_path: Path) -> None:
    proc = run(fake_kubectl(tmp_path, registers_after=10**6), timeout=1)
    assert proc.returncode == 1
    assert "these nodes did not register within 1s" in proc.stderr
    assert 'nodes "cpu-01" not found' in proc.stderr
    assert not (tmp_path / "wait").exists()
