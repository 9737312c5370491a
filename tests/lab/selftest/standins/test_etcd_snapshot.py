"""gpuk8s's etcd snapshot reader (gpuk8s/etcdsnap.py) against the REAL etcd and etcdutl
3.5.30 (Debian sid's etcd-server and etcd-client, as the lab's nodes run them): a database big
enough for branch pages and overflow pages, with deletions and a compaction, snapshotted by
the real etcdctl; the reader's revision, key count and size equal `etcdutl snapshot status`."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from gpuk8s import etcdsnap
from tests.lab.repos import real_etcd
from tests.lab.selftest.standins.k8s_helpers import free_port


def test_the_reader_agrees_with_the_real_etcdutl(tmp_path: Path) -> None:
    client, peer = free_port(), free_port()
    server = subprocess.Popen(
        [str(real_etcd()), "--name", "s", "--data-dir", str(tmp_path / "d"),
         "--listen-client-urls", f"http://127.0.0.1:{client}",
         "--advertise-client-urls", f"http://127.0.0.1:{client}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"s=http://127.0.0.1:{peer}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ctl = [str(real_etcd("etcdctl")), "--endpoints", f"http://127.0.0.1:{client}"]
    try:
        deadline = time.monotonic() + 30
        while subprocess.run([*ctl, "endpoint", "health"], capture_output=True).returncode:
            assert time.monotonic() < deadline, "the real etcd did not start"
            time.sleep(0.3)
        # 600 keys in transactions of 100 (branch pages), some values over a page (overflow)
        for batch in range(6):
            ops = "".join(f'put /registry/pods/ns{i % 7}/pod-{i} "{"x" * (i * 13 % 6000)}"\n'
                          for i in range(batch * 100, batch * 100 + 100))
            subprocess.run([*ctl, "txn"], input="\n" + ops + "\n\n", text=True, check=True,
                           capture_output=True)
        subprocess.run([*ctl, "del", "--prefix", "/registry/pods/ns3/"], check=True,
                       capture_output=True)
        rev = json.loads(subprocess.run([*ctl, "endpoint", "status", "-w", "json"],
                                        capture_output=True, text=True,
                                        check=True).stdout)[0]["Status"]["header"]["revision"]
        subprocess.run([*ctl, "compact", str(rev - 2)], check=True, capture_output=True)
        snap = tmp_path / "snap.db"
        subprocess.run([*ctl, "snapshot", "save", str(snap)], check=True, capture_output=True)
    finally:
        server.terminate()
        server.wait(10)
    said = json.loads(subprocess.run(
        [str(real_etcd().parent / "etcdutl"), "snapshot", "status", str(snap), "-w", "json"],
        capture_output=True, text=True, check=True).stdout)
    got = etcdsnap.status_of(snap)
    assert got.checksum
    assert (got.revision, got.total_keys, got.total_size) == \
        (said["revision"], said["totalKey"], said["totalSize"])
    assert got.total_size > 1024 * 1024  # many pages: branch and overflow pages were walked
