"""gpuk8s.drain's scripts, run by a real shell against a kubectl that answers from a script:
the GPU DaemonSets are paused (label, then a wait until their pods are gone), a kubectl that
fails stops the wait, and a pod that stays past the timeout is named in a clear error."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.drain import pause_gpu_clients, resume_gpu_clients
from gpuk8s.errors import CommandFailed, Gpuk8sError
from gpuk8s.ops import Op


class Session:
    """What the drain functions use of a session: the first control plane, a reporter, and
    run(), here a local bash with the fake kubectl first on PATH."""

    first_cp = "cp-01"

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.printed: list[str] = []
        self.reporter = self

    def print(self, text: str, **_: Any) -> None:
        self.printed.append(text)

    def run(self, host: str, op: Op) -> str:
        proc = subprocess.run(["bash", "-c", op.commands[0]], capture_output=True, text=True,
                              env={"PATH": f"{self.bin_dir}:/usr/bin:/bin"}, timeout=60)
        if proc.returncode:
            raise CommandFailed(host, op.id, "", proc.returncode, proc.stderr)
        return proc.stdout


def fake_kubectl(tmp_path: Path, pods_for: int, get_fails: bool = False) -> Session:
    """kubectl that records its arguments and lists a GPU client pod for the first
    ``pods_for`` gets."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "kubectl"
    script.write_text(f"""#!/bin/sh
echo "$*" >> {tmp_path}/calls
case "$*" in *" get pods "*)
  {"echo 'error: You must be logged in to the server' >&2; exit 1" if get_fails else ":"}
  n=$(grep -c ' get pods ' {tmp_path}/calls)
  [ "$n" -le {pods_for} ] && echo pod/nvidia-device-plugin-ds-x2k9q;;
esac
exit 0
""")
    script.chmod(0o755)
    return Session(bin_dir)


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls").read_text().splitlines()


def test_pause_labels_the_node_and_waits_until_the_gpu_pods_are_gone(tmp_path: Path) -> None:
    session = fake_kubectl(tmp_path, pods_for=2)
    pause_gpu_clients(session, "gpu-01", 30)  # type: ignore[arg-type]
    label, *gets = calls(tmp_path)
    assert label.endswith("label node gpu-01 nvidia.com/gpu.present=paused-for-mig-change "
                          "--overwrite")
    assert len(gets) == 3 and all("get pods -A -l gpuk8s.io/gpu-client=true --field-selector "
                                  "spec.nodeName=gpu-01 -o name" in g for g in gets), gets
    resume_gpu_clients(session, "gpu-01")  # type: ignore[arg-type]
    assert calls(tmp_path)[-1].endswith("label node gpu-01 nvidia.com/gpu.present=true "
                                        "--overwrite")


def test_a_pod_that_stays_is_named_after_the_timeout(tmp_path: Path) -> None:
    session = fake_kubectl(tmp_path, pods_for=1000)
    with pytest.raises(Gpuk8sError) as err:
        pause_gpu_clients(session, "gpu-01", 1)  # type: ignore[arg-type]
    text = str(err.value)
    assert "gpu-01: pausing the GPU DaemonSets failed (their pods must leave within 1s)" in text
    assert "still on gpu-01 after 1s: pod/nvidia-device-plugin-ds-x2k9q" in text
    assert "raise mig_drain_timeout" in text


def test_a_failing_kubectl_ends_the_wait_as_a_failure(tmp_path: Path) -> None:
    session = fake_kubectl(tmp_path, pods_for=0, get_fails=True)
    with pytest.raises(Gpuk8sError, match="You must be logged in"):
        pause_gpu_clients(session, "gpu-01", 30)  # type: ignore[arg-type]
    assert len([c for c in calls(tmp_path) if " get pods " in c]) == 1
