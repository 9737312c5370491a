"""package_cache on the lab: the control plane runs apt-cacher-ng (its upstream: the lab host's
apt-cacher-ng, so the lab stays offline), every node's apt goes through it, and a package that
two nodes install is fetched from upstream once (read from the cache host's transfer log)."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest

from gpuk8s import api
from gpuk8s.report import Reporter
from tests.lab.lab import Lab
from tests.lab.paths import node_ip

pytestmark = pytest.mark.lab

CACHE = "cp-01"
CLIENTS = ("cpu-01", "gpu-02")
PACKAGE = "hello"  # small, in Debian bookworm, not in the node image
LOG = "/var/log/apt-cacher-ng/apt-cacher.log"


def run_api(fn: Any, *args: Any, **kwargs: Any) -> tuple[dict[str, Any], str]:
    out = io.StringIO()
    result = fn(*args, reporter=Reporter(out), **kwargs)
    sys.stdout.write(out.getvalue())
    return result, out.getvalue()


def sh(lab: Lab, node: str, cmd: str, timeout: float = 300) -> str:
    rc, out, err = lab.ssh(node, cmd, timeout=timeout)
    assert rc == 0, f"{node}: {cmd}: rc={rc}\n{out}\n{err}"
    return out


@pytest.fixture(scope="module")
def cached(lab: Lab) -> Any:
    """The lab bootstrapped with package_cache: true; package_cache off again afterwards."""
    result, text = run_api(api.bootstrap, lab.inventory_path, sets=["package_cache=true"],
                           yes=True)
    assert all(t["failed"] == 0 for t in result["totals"].values()), text
    yield lab
    for node in CLIENTS:
        lab.ssh(node, f"apt-get purge -y -q {PACKAGE} >/dev/null 2>&1; true")
    result, text = run_api(api.bootstrap, lab.inventory_path, sets=["package_cache=false"],
                           yes=True)
    assert all(t["failed"] == 0 for t in result["totals"].values()), text


def test_every_node_uses_the_cache_and_a_second_run_changes_nothing(cached: Lab) -> None:
    for node in ("cp-01", "gpu-01", "gpu-02", "cpu-01"):
        conf = sh(cached, node, "cat /etc/apt/apt.conf.d/90gpuk8s-proxy")
        # https sources go direct: the cache serves http only (apt would CONNECT through it)
        assert conf == (f'Acquire::http::Proxy "http://{node_ip(1)}:3142";\n'
                        'Acquire::https::Proxy "DIRECT";\n'), node
    assert sh(cached, CACHE, "systemctl is-active apt-cacher-ng").strip() == "active"
    # the cache's own upstream is the lab host's apt-cacher-ng (apt_proxy)
    assert "Proxy: http://10.88.0.1:3142" in sh(cached, CACHE,
                                                  "cat /etc/apt-cacher-ng/zz-gpuk8s.conf")
    result, text = run_api(api.bootstrap, cached.inventory_path, sets=["package_cache=true"],
                           yes=True)
    assert result["changed"] == 0, text


def test_a_package_installed_on_two_nodes_is_fetched_from_upstream_once(cached: Lab) -> None:
    # start from a cache and nodes that do not have the package
    sh(cached, CACHE, f"find /var/cache/apt-cacher-ng -name '{PACKAGE}_*' -delete")
    for node in CLIENTS:
        sh(cached, node, f"apt-get purge -y -q {PACKAGE} >/dev/null 2>&1; "
                         f"rm -f /var/cache/apt/archives/{PACKAGE}_*.deb")
    before = int(sh(cached, CACHE, f"wc -l < {LOG}").split()[0])
    for node in CLIENTS:
        sh(cached, node, f"DEBIAN_FRONTEND=noninteractive apt-get install -y -q {PACKAGE}")
        assert sh(cached, node, f"dpkg-query -W -f '${{Status}}' {PACKAGE}") == \
            "install ok installed"
    lines = sh(cached, CACHE, f"tail -n +{before + 1} {LOG}").splitlines()
    deb = [line.split("|") for line in lines if f"/{PACKAGE}_" in line and ".deb" in line]
    fetched = [p for p in deb if p[1] == "I"]
    served = [p for p in deb if p[1] == "O"]
    assert len(fetched) == 1 and int(fetched[0][2]) > 0, deb
    ips = {cached.node(n).ip for n in CLIENTS}
    assert {p[3] for p in served} == ips and len(served) == 2, deb
    size = int(fetched[0][2])
    assert all(int(p[2]) >= size * 0.9 for p in served), deb  # the whole .deb, twice
