"""apt's proxies: the lines gpuk8s writes (apt_proxy, apt_https_proxy, apt_proxy_direct, what
kubespray's http_proxy/https_proxy/no_proxy become), checked against the real apt-get of this
machine: a host listed as direct is fetched from without the proxy, the others through it."""

from __future__ import annotations

import base64
import http.server
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuk8s.ops.apt import proxy_conf
from gpuk8s.roles import HostContext, load_role
from gpuk8s.sinks import UnsafeValue
from tests.unit.scenarios import default_vars, fresh_facts


def test_the_lines_for_a_proxy_an_https_proxy_and_direct_hosts() -> None:
    assert proxy_conf("http://p:3128", "http://p:3129", ["10.0.0.5", "mirror.lab"]) == (
        'Acquire::http::Proxy "http://p:3128";\n'
        'Acquire::https::Proxy "http://p:3129";\n'
        'Acquire::http::Proxy::10.0.0.5 "DIRECT";\n'
        'Acquire::https::Proxy::10.0.0.5 "DIRECT";\n'
        'Acquire::http::Proxy::mirror.lab "DIRECT";\n'
        'Acquire::https::Proxy::mirror.lab "DIRECT";')
    # no proxy for a scheme: nothing to bypass there
    assert proxy_conf("DIRECT", "http://p:3129", ["10.0.0.5"]) == (
        'Acquire::http::Proxy "DIRECT";\nAcquire::https::Proxy "http://p:3129";\n'
        'Acquire::https::Proxy::10.0.0.5 "DIRECT";')
    for bad in ('x" ; Acquire::x "1', "10.0.0.0/8", ".svc", "a b"):
        with pytest.raises(UnsafeValue, match=r"cannot be a key of apt\.conf"):
            proxy_conf("http://p:3128", "", [bad])


def test_the_base_role_writes_them_to_the_proxy_file() -> None:
    vars = default_vars(apt_proxy="http://p:3128", apt_https_proxy="http://u:pw@p:3129",
                        apt_proxy_direct=["10.0.0.5"])
    ctx = HostContext("cp-01", "base", vars, fresh_facts("ubuntu2404", 0, "cp-01", vars), {},
                      ("control_plane",))
    op = next(o for o in load_role("base").plan(ctx) if o.id == "base | apt proxy")
    assert op.secret  # the https proxy carries a password: the file is root's alone
    script = "\n".join(op.commands)
    written = base64.b64decode(script.split("<<'GPUK8S_EOF'\n")[1].split("\nGPUK8S_EOF")[0])
    assert written.decode() == proxy_conf("http://p:3128", "http://u:pw@p:3129",
                                          ["10.0.0.5"]) + "\n"
    assert 'chmod 0600 "$t"' in script


@pytest.fixture
def servers() -> Iterator[tuple[int, int, list[str], list[int]]]:
    """A web server (what a mirror inside the lab is) and a proxy that only counts the
    connections it gets: (server port, proxy port, paths served, proxy connections)."""
    served: list[str] = []
    proxied: list[int] = []

    class Mirror(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    mirror = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Mirror)
    threading.Thread(target=mirror.serve_forever, daemon=True).start()
    proxy = socket.socket()
    proxy.bind(("127.0.0.1", 0))
    proxy.listen(16)

    def accept() -> None:
        while True:
            try:
                conn, _ = proxy.accept()
            except OSError:
                return
            proxied.append(1)
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    yield mirror.server_address[1], proxy.getsockname()[1], served, proxied
    mirror.shutdown()
    proxy.close()


@pytest.mark.parametrize("direct", [False, True])
def test_real_apt_goes_direct_only_to_the_hosts_listed(tmp_path: Path, servers: tuple,
                                                       direct: bool) -> None:
    apt = shutil.which("apt-get")
    assert apt, "this test needs Debian's apt-get (every supported CI machine has it)"
    port, proxy_port, served, proxied = servers
    (tmp_path / "lists" / "partial").mkdir(parents=True)
    (tmp_path / "sources.list").write_text(f"deb [trusted=yes] http://127.0.0.1:{port}/ ./\n")
    (tmp_path / "proxy.conf").write_text(proxy_conf(
        f"http://127.0.0.1:{proxy_port}", "", ["127.0.0.1"] if direct else []) + "\n")
    subprocess.run([apt, "-c", str(tmp_path / "proxy.conf"),
                    "-o", f"Dir::Etc::sourcelist={tmp_path / 'sources.list'}",
                    "-o", "Dir::Etc::sourceparts=/nonexistent",
                    "-o", f"Dir::State::lists={tmp_path / 'lists'}",
                    "-o", "Debug::NoLocking=1", "-o", "Acquire::Retries=0", "update"],
                   capture_output=True, text=True, timeout=60, check=False)
    if direct:
        assert "/./InRelease" in served and not proxied
    else:
        assert proxied and not served


def _proxy_file(**vars_: object) -> str | None:
    vars = default_vars(**vars_)
    ctx = HostContext("cp-01", "base", vars, fresh_facts("ubuntu2404", 0, "cp-01", vars),
                      {"package_cache_url": vars.pop("_cache", "")}, ("control_plane",))
    op = next((o for o in load_role("base").plan(ctx) if o.id == "base | apt proxy"), None)
    if op is None:
        return None
    script = "\n".join(op.commands)
    return base64.b64decode(script.split("<<'GPUK8S_EOF'\n")[1].split("\nGPUK8S_EOF")[0]
                            ).decode()


def test_what_the_proxy_file_says_in_each_case() -> None:
    assert _proxy_file() is None  # no proxy at all: no file (a direct list alone needs none)
    assert _proxy_file(apt_proxy_direct=["10.0.0.5"]) is None
    assert _proxy_file(apt_https_proxy="http://p:3129") == (
        'Acquire::http::Proxy "DIRECT";\nAcquire::https::Proxy "http://p:3129";\n')
    # the package cache serves http only: https goes direct past it, not by CONNECT through it
    assert _proxy_file(_cache="http://10.0.0.1:3142") == (
        'Acquire::http::Proxy "http://10.0.0.1:3142";\nAcquire::https::Proxy "DIRECT";\n')
    assert _proxy_file(_cache="http://10.0.0.1:3142", apt_https_proxy="http://p:3129",
                       apt_proxy_direct=["m.lab"]) == (
        'Acquire::http::Proxy "http://10.0.0.1:3142";\nAcquire::https::Proxy "http://p:3129";\n'
        'Acquire::http::Proxy::m.lab "DIRECT";\nAcquire::https::Proxy::m.lab "DIRECT";\n')
