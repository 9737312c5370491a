"""The SSH floor: raw paramiko, one connection and one exec of the probe per host, all hosts in
parallel. Run as its own process (``python bench/floor.py HOSTS.json``) so its wall time counts
interpreter start-up and imports, like ``invoke bootstrap`` does.

HOSTS.json: ``[{"name", "address", "port", "user", "key_file", "known_hosts", "script"}]``,
and where a host has ``"output"`` (a file path), what its probe printed is written there
after the run (``invoke bench --facts`` reads each fact's node-side time from it).
Prints one JSON line: {"elapsed": seconds inside the process, "hosts": {name: exit code},
"peak_rss_kb": its own peak RSS}.
"""

from __future__ import annotations

import json
import resource
import sys
import threading
import time


def main(path: str) -> int:
    started = time.monotonic()
    import paramiko

    with open(path, encoding="utf-8") as fh:
        hosts = json.load(fh)
    codes: dict[str, int | str] = {}
    lock = threading.Lock()

    outputs: dict[str, bytes] = {}

    def one(h: dict[str, object]) -> None:
        chunks: list[bytes] = []
        try:
            client = paramiko.SSHClient()
            client.load_host_keys(str(h["known_hosts"]))
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            client.connect(str(h["address"]), port=int(str(h["port"])), username=str(h["user"]),
                           key_filename=str(h["key_file"]), look_for_keys=False,
                           allow_agent=False, timeout=10)
            transport = client.get_transport()
            assert transport is not None
            chan = transport.open_session()
            chan.set_combine_stderr(True)
            chan.exec_command("sh -s")
            chan.sendall(str(h["script"]).encode())
            chan.shutdown_write()
            keep = "output" in h  # the floor itself reads and drops what comes
            while chunk := chan.recv(65536):
                if keep:
                    chunks.append(chunk)
            code: int | str = chan.recv_exit_status()
            client.close()
        except Exception as exc:  # reported, not raised: the driver checks every host
            code = repr(exc)
        with lock:
            codes[str(h["name"])] = code
            if "output" in h:
                outputs[str(h["output"])] = b"".join(chunks)

    threads = [threading.Thread(target=one, args=(h,)) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    for path, data in outputs.items():
        with open(path, "wb") as saved:
            saved.write(data)
    print(json.dumps({"elapsed": round(elapsed, 4), "hosts": codes,
                      "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
    return 0 if all(c == 0 for c in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
