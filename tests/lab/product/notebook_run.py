"""Run a notebook that lives on a Jupyter server through the server's own API, as a browser
does: read it (GET /api/contents), start a kernel (POST /api/kernels), send each code cell as
an execute_request over the kernel's websocket (/api/kernels/ID/channels, Jupyter's messaging
protocol) and collect what each cell printed; then shut the kernel down. Over HTTPS the
server's certificate is checked against the CA file in $NOTEBOOK_CA (else the system's).

Test tooling for tests/lab/product/test_workloads.py, run with the TensorFlow test venv's Python
(it has tornado). Usage: notebook_run.py BASE_URL TOKEN PATH; prints one JSON list: per code
cell, its source and its text output."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect


async def api(base: str, token: str, method: str, path: str, body: Any = None) -> Any:
    req = HTTPRequest(f"{base}{path}", method=method,
                      headers={"Authorization": f"token {token}"},
                      body=None if body is None else json.dumps(body),
                      request_timeout=60, ca_certs=os.environ.get("NOTEBOOK_CA"))
    resp = await AsyncHTTPClient().fetch(req)
    return json.loads(resp.body) if resp.body else None


async def run_cell(ws: Any, session: str, code: str, timeout: float) -> str:
    msg_id = uuid.uuid4().hex
    await ws.write_message(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": session,
                   "username": "gpuk8s-test", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": False,
                    "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}))
    out: list[str] = []
    while True:
        raw = await asyncio.wait_for(ws.read_message(), timeout)
        if raw is None:
            raise RuntimeError("the kernel's websocket closed")
        msg = json.loads(raw)
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = msg["header"]["msg_type"], msg["content"]
        if kind == "stream":
            out.append(content["text"])
        elif kind in ("execute_result", "display_data"):
            out.append(content["data"].get("text/plain", "") + "\n")
        elif kind == "error":
            out.append("\n".join(content.get("traceback", [])) + "\n")
        elif kind == "status" and content["execution_state"] == "idle":
            return "".join(out)


async def main(base: str, token: str, path: str) -> list[dict[str, str]]:
    notebook = (await api(base, token, "GET", f"/api/contents/{path}"))["content"]
    kernel = await api(base, token, "POST", "/api/kernels", {"name": "python3"})
    ws_url = base.replace("http", "ws", 1) + f"/api/kernels/{kernel['id']}/channels"
    ws = await websocket_connect(HTTPRequest(ws_url, headers={"Authorization": f"token {token}"},
                                             ca_certs=os.environ.get("NOTEBOOK_CA")))
    session = uuid.uuid4().hex
    results = []
    try:
        for cell in notebook["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = cell["source"] if isinstance(cell["source"], str) else \
                "".join(cell["source"])
            results.append({"source": source,
                            "output": await run_cell(ws, session, source, 180)})
    finally:
        ws.close()
        await api(base, token, "DELETE", f"/api/kernels/{kernel['id']}")
    return results


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:4]))))
