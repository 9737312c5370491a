"""GPU use per GPU and per node, read from the cluster's Prometheus (gpu_monitoring), which
scrapes NVIDIA's DCGM exporter on every GPU node. gpuk8s asks Prometheus' HTTP API through the
API server's service proxy on the first control plane: no port is opened anywhere."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from contextlib import closing
from pathlib import Path
from typing import Any

from gpuk8s.day2.steps import Opener, run_step
from gpuk8s.errors import CommandFailed, Gpuk8sError
from gpuk8s.ops.kube import KUBECTL
from gpuk8s.report import Cell, Column, Reporter
from gpuk8s.session import Session, open_session
from gpuk8s.sinks import shell
from gpuk8s.transport import open_transport

NAMESPACE = "gpuk8s-monitoring"
QUERY_PATH = f"/api/v1/namespaces/{NAMESPACE}/services/http:prometheus:9090/proxy/api/v1/query"
#: DCGM exporter metrics gpu-usage shows (their names and units are the exporter's)
METRICS = {"util": "DCGM_FI_DEV_GPU_UTIL", "used": "DCGM_FI_DEV_FB_USED",
           "free": "DCGM_FI_DEV_FB_FREE"}


def query_command(promql: str) -> str:
    """The kubectl command (after KUBECTL) that asks Prometheus an instant query."""
    return f"get --raw {shell(QUERY_PATH + '?' + urllib.parse.urlencode({'query': promql}))}"


def query(session: Session, promql: str) -> list[dict[str, Any]]:
    """An instant query's result vector: [{"metric": {label: value}, "value": float}], read
    through the first control plane. Prometheus' answer is data: labels become strings, a
    value that is no number is left out."""
    try:
        raw = run_step(session, session.first_cp, f"{KUBECTL} {query_command(promql)}",
                       f"query Prometheus: {promql}", timeout=60)
    except CommandFailed as exc:
        raise Gpuk8sError(
            f"Prometheus did not answer through the API server: {exc.stderr_tail.strip()}\n"
            "  fix: set gpu_monitoring: true in the inventory and run bootstrap; if it is on, "
            f"check the pods: kubectl -n {NAMESPACE} get pods") from None
    try:
        body = json.loads(raw)
        result = body["data"]["result"] if body.get("status") == "success" else None
    except (ValueError, KeyError, TypeError, AttributeError):
        result = None
    if not isinstance(result, list):
        raise Gpuk8sError(f"Prometheus answered something that is not a query result: "
                          f"{raw[:200]!r}")
    out = []
    for item in result:
        try:
            labels = {str(k): str(v) for k, v in dict(item["metric"]).items()}
            out.append({"metric": labels, "value": float(item["value"][1])})
        except (KeyError, TypeError, ValueError, IndexError):
            continue
    return out


def usage_rows(samples: Mapping[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per GPU (node, gpu index) from the samples of each METRICS key."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for key, items in samples.items():
        for s in items:
            m = s["metric"]
            node = m.get("node") or m.get("Hostname", "")
            gpu = m.get("gpu", "")
            row = rows.setdefault((node, gpu), {
                "node": node, "gpu": gpu, "model": m.get("modelName", ""),
                "uuid": m.get("UUID", ""), "util": None, "used": None, "free": None,
                "pods": []})
            row[key] = s["value"]
            pod = m.get("pod", "")
            if pod and f"{m.get('namespace', '')}/{pod}" not in row["pods"]:
                row["pods"].append(f"{m.get('namespace', '')}/{pod}")
    return [rows[k] for k in sorted(rows, key=lambda k: (k[0], int(k[1]) if k[1].isdigit()
                                                         else 0, k[1]))]


def node_utilisation(session: Session) -> dict[str, float]:
    """Mean GPU utilisation (%) per node name."""
    return {s["metric"].get("node", ""): s["value"]
            for s in query(session, f"avg by (node) ({METRICS['util']})")}


def gpu_usage(inventory: str | Path, *, as_json: bool = False, wide: bool = False,
              reporter: Reporter | None = None,
              opener: Opener = open_transport) -> list[dict[str, Any]]:
    """A table of every GPU Prometheus knows: node, index, utilisation, memory, pods (and,
    ``wide``, model and UUID)."""
    from gpuk8s.inventory import load_inventory

    cps = [h.name for h in load_inventory(inventory).control_planes if not h.absent]
    session = open_session(inventory, limit=",".join(cps), sets=(), command="gpu-usage",
                           reporter=reporter, opener=opener, any_control_plane=True)
    with closing(session):
        if not session.host(session.first_cp).vars.get("gpu_monitoring"):
            raise Gpuk8sError("gpu_monitoring is off, so the cluster runs no Prometheus\n"
                              "  fix: set gpu_monitoring: true in the inventory, then run "
                              "invoke bootstrap")
        rows = usage_rows({k: query(session, v) for k, v in METRICS.items()})
        _print(session.reporter, rows, as_json, wide=wide)
        return rows


#: the gpu-usage table: the default view fits 80 columns; -o wide adds model and UUID
COLUMNS = (Column("node"), Column("gpu", justify="right"), Column("util", justify="right"),
           Column("used MiB", justify="right"), Column("free MiB", justify="right"),
           Column("pods"), Column("model", wide=True), Column("uuid", wide=True))


def _print(rep: Reporter, rows: list[dict[str, Any]], as_json: bool, *,
           wide: bool = False) -> None:
    if as_json:
        rep.console.print(json.dumps(rows, indent=2), markup=False, highlight=False)
        return
    cells: list[list[Cell]] = [
        [r["node"], r["gpu"], "-" if r["util"] is None else f"{r['util']:.0f} %",
         "-" if r["used"] is None else f"{r['used']:.0f}",
         "-" if r["free"] is None else f"{r['free']:.0f}",
         ", ".join(r["pods"]) or "-", r["model"] or "-", r["uuid"] or "-"] for r in rows]
    rep.table("GPU use (DCGM exporter, through Prometheus)", COLUMNS, cells, wide=wide)
    if not rows:
        rep.print("Prometheus has no DCGM samples yet (it scrapes every "
                  "prometheus_scrape_interval seconds): try again shortly")
