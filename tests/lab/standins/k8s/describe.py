# LAB STAND-IN: not the real kubectl describe. Test infrastructure for gpuk8s; never shipped.
"""kubectl describe for pods and nodes (the sections gpuk8s and its users read)."""

from __future__ import annotations

from typing import Any

from .common import age
from .resources import Resource

Obj = dict[str, Any]


def _kv(d: dict[str, Any] | None, indent: int) -> str:
    if not d:
        return "<none>"
    items = [f"{k}={v}" for k, v in sorted(d.items())]
    return ("\n" + " " * indent).join(items)


def _row(label: str, value: str, width: int) -> str:
    return f"{label + ':':<{width}}{value}\n"


def events_section(events: list[Obj]) -> str:
    if not events:
        return "Events:              <none>\n"
    from .kubectl import table

    rows = [["Type", "Reason", "Age", "From", "Message"],
            ["----", "------", "----", "----", "-------"]]
    for ev in sorted(events, key=lambda e: e.get("lastTimestamp") or ""):
        a = age(ev.get("lastTimestamp"))
        if ev.get("count", 1) > 1:
            a = f"{a} (x{ev['count']} over {age(ev.get('firstTimestamp'))})"
        src = ev.get("source", {}).get("component", "")
        rows.append([ev.get("type", ""), ev.get("reason", ""), a, src, ev.get("message", "")])
    return "Events:\n" + table(rows, indent="  ", pad=2)


def describe_pod(pod: Obj, events: list[Obj]) -> str:
    md, spec, st = pod["metadata"], pod.get("spec", {}), pod.get("status", {})
    w = 18
    out = _row("Name", md["name"], w) + _row("Namespace", md.get("namespace", ""), w)
    out += _row("Priority", str(spec.get("priority", 0)), w)
    if spec.get("runtimeClassName"):
        out += _row("Runtime Class Name", spec["runtimeClassName"], w)
    out += _row("Service Account", spec.get("serviceAccountName", "default"), w)
    node = spec.get("nodeName")
    out += _row("Node", f"{node}/{st.get('hostIP', '')}" if node else "<none>", w)
    out += _row("Labels", _kv(md.get("labels"), w), w)
    out += _row("Annotations", _kv(md.get("annotations"), w), w)
    out += _row("Status", st.get("phase", "Pending"), w)
    out += _row("IP", st.get("podIP", ""), w)
    out += "Containers:\n"
    cstat = {c["name"]: c for c in st.get("containerStatuses") or []}
    for c in spec.get("containers") or []:
        out += f"  {c['name']}:\n"
        out += f"    Image:      {c.get('image', '')}\n"
        cs = cstat.get(c["name"])
        if cs:
            state = cs.get("state", {})
            if "waiting" in state:
                out += "    State:          Waiting\n"
                out += f"      Reason:       {state['waiting'].get('reason', '')}\n"
                if state["waiting"].get("message"):
                    out += f"      Message:      {state['waiting']['message']}\n"
            elif "running" in state:
                out += "    State:          Running\n"
                out += f"      Started:      {state['running'].get('startedAt', '')}\n"
            elif "terminated" in state:
                t = state["terminated"]
                out += (f"    State:          Terminated\n      Reason:       {t.get('reason', '')}"
                        f"\n      Exit Code:    {t.get('exitCode', 0)}\n")
            out += f"    Ready:          {str(bool(cs.get('ready'))).lower().capitalize()}\n"
            out += f"    Restart Count:  {cs.get('restartCount', 0)}\n"
        res = c.get("resources") or {}
        for sect in ("limits", "requests"):
            if res.get(sect):
                out += f"    {sect.capitalize()}:\n"
                width = max(len(k) for k in res[sect]) + 3
                for k, v in res[sect].items():
                    out += f"      {k + ':':<{width}}{v}\n"
        envs = c.get("env") or []
        if envs:
            out += "    Environment:\n"
            for e in envs:
                val = e.get("value")
                if val is None and "valueFrom" in e:
                    fr = e["valueFrom"].get("fieldRef", {})
                    val = f"({fr.get('apiVersion', 'v1')}:{fr.get('fieldPath', '')})"
                out += f"      {e['name']}:  {val}\n"
        else:
            out += "    Environment:  <none>\n"
    out += "Conditions:\n"
    conds = st.get("conditions") or []
    if conds:
        from .kubectl import table

        out += table([["Type", "Status"]] + [[c["type"], c["status"]] for c in conds],
                     indent="  ", pad=2)
    out += f"{'QoS Class:':<29}{st.get('qosClass', 'BestEffort')}\n"
    out += f"{'Node-Selectors:':<29}{_kv(spec.get('nodeSelector'), 29)}\n"
    tols = []
    for t in spec.get("tolerations") or []:
        s = t.get("key", "")
        if t.get("value"):
            s += f"={t['value']}"
        if t.get("effect"):
            s += f":{t['effect']}"
        if t.get("operator") == "Exists":
            s += " op=Exists"
        if t.get("tolerationSeconds") is not None:
            s += f" for {t['tolerationSeconds']}s"
        tols.append(s)
    out += f"{'Tolerations:':<29}" + ("\n" + " " * 29).join(tols or ["<none>"]) + "\n"
    return out + events_section(events)


def describe_node(node: Obj, events: list[Obj], pods: list[Obj]) -> str:
    from .kubectl import role_names, table

    md, spec, st = node["metadata"], node.get("spec", {}), node.get("status", {})
    w = 20
    out = _row("Name", md["name"], w) + _row("Roles", role_names(node), w)
    out += _row("Labels", _kv(md.get("labels"), w), w)
    out += _row("Annotations", _kv(md.get("annotations"), w), w)
    out += _row("CreationTimestamp", md.get("creationTimestamp", ""), w)
    taints = [f"{t['key']}{'=' + t['value'] if t.get('value') else ''}:{t['effect']}"
              for t in spec.get("taints") or []]
    out += _row("Taints", ("\n" + " " * w).join(taints) or "<none>", w)
    out += _row("Unschedulable", str(bool(spec.get("unschedulable"))).lower(), w)
    out += "Conditions:\n"
    rows = [["Type", "Status", "LastHeartbeatTime", "LastTransitionTime", "Reason", "Message"],
            ["----", "------", "-----------------", "------------------", "------", "-------"]]
    for c in st.get("conditions") or []:
        rows.append([c.get("type", ""), c.get("status", ""), c.get("lastHeartbeatTime", ""),
                     c.get("lastTransitionTime", ""), c.get("reason", ""), c.get("message", "")])
    out += table(rows, indent="  ", pad=2)
    out += "Addresses:\n"
    for a in st.get("addresses") or []:
        out += f"  {a['type']}:  {a['address']}\n"
    for sect in ("capacity", "allocatable"):
        out += f"{sect.capitalize()}:\n"
        vals = st.get(sect) or {}
        width = max([len(k) + 1 for k in vals] + [19])
        for k in sorted(vals):
            out += f"  {k + ':':<{width}} {vals[k]}\n"
    info = st.get("nodeInfo") or {}
    out += "System Info:\n"
    for label, key in (("Machine ID", "machineID"), ("System UUID", "systemUUID"),
                       ("Boot ID", "bootID"), ("Kernel Version", "kernelVersion"),
                       ("OS Image", "osImage"), ("Operating System", "operatingSystem"),
                       ("Architecture", "architecture"),
                       ("Container Runtime Version", "containerRuntimeVersion"),
                       ("Kubelet Version", "kubeletVersion")):
        out += f"  {label + ':':<28}{info.get(key, '')}\n"
    active = [p for p in pods if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]
    out += f"Non-terminated Pods:          ({len(active)} in total)\n"
    if active:
        rows = [["Namespace", "Name", "AGE"], ["---------", "----", "---"]]
        for p in active:
            rows.append([p["metadata"]["namespace"], p["metadata"]["name"],
                         age(p["metadata"].get("creationTimestamp"))])
        out += table(rows, indent="  ", pad=2)
    return out + events_section(events)


def describe(res: Resource, obj: Obj, events: list[Obj], pods: list[Obj]) -> str:
    if res.plural == "pods":
        return describe_pod(obj, events)
    if res.plural == "nodes":
        return describe_node(obj, events, pods)
    from .common import yaml_dump

    md = obj["metadata"]
    out = f"Name:         {md['name']}\n"
    if md.get("namespace"):
        out += f"Namespace:    {md['namespace']}\n"
    out += f"Labels:       {_kv(md.get('labels'), 14)}\n"
    body = {k: v for k, v in obj.items() if k not in ("metadata", "apiVersion", "kind")}
    out += yaml_dump(body) if body else ""
    return out + events_section(events)
