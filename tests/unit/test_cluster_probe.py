"""The Cluster fact's command, run by sh against a fake kubectl: both reads side by side, the
same output and exit codes as reading them one after the other."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpuk8s.facts.kube import Cluster

FAKE = """#!/bin/sh
case "$*" in
  *"get nodes"*) [ -n "$FAIL_NODES" ] && { echo "Unable to connect to the server" >&2; exit 1; }
                 echo '{"items": [{"metadata": {"name": "cp-01"}, "status": {"conditions":
                   [{"type": "Ready", "status": "True"}]}}]}' ;;
  *) [ -n "$FAIL_MANAGED" ] && { echo "forbidden" >&2; exit 1; }
     echo '{"items": [{"kind": "RuntimeClass", "metadata": {"name": "nvidia",
       "annotations": {"gpuk8s.io/sha256": "abc"}}}]}' ;;
esac
"""


@pytest.mark.parametrize("env,code,error", [({}, 0, ""),
                                            ({"FAIL_NODES": "1"}, 3,
                                             "Unable to connect to the server"),
                                            ({"FAIL_MANAGED": "1"}, 4, "forbidden")])
def test_cluster_command_with_fake_kubectl(tmp_path: Path, env: dict[str, str], code: int,
                                           error: str) -> None:
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(FAKE)
    kubectl.chmod(0o755)
    command = Cluster().command().replace("[ -f /etc/kubernetes/admin.conf ] && ", "")
    proc = subprocess.run(["sh", "-c", f"exec 2>&1\n( {command}\n) </dev/null"],
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", **env})
    assert proc.returncode == code
    state = Cluster().parse(proc.stdout, proc.returncode)
    assert state.error == error
    if code == 0:
        assert state.reachable and state.nodes["cp-01"].ready
        assert state.managed == {"RuntimeClass//nvidia": "abc"}
