"""The cluster's API endpoint and control planes as the inventory alone gives them: what
``gpuk8s check`` and preflight both read (gather's cluster values add the facts' part)."""

from __future__ import annotations

from typing import Any

from gpuk8s.inventory.model import Inventory

#: the endpoint of control_plane_endpoint_mode local_lb: each node's own HAProxy
LOCAL_LB_ENDPOINT = "127.0.0.1:6443"


def endpoint_of(inventory: Inventory) -> tuple[str, str]:
    """(mode, host:port) of the cluster's API endpoint: "external" (control_plane_endpoint),
    "local_lb" (127.0.0.1:6443 on every node) or "direct" (the first control plane's
    address:6443, with a single control plane); mode "auto" picks one of them."""
    cps = [h for h in inventory.control_planes if not h.absent] or inventory.control_planes
    first = cps[0]
    mode, given = first.vars["control_plane_endpoint_mode"], first.vars["control_plane_endpoint"]
    if mode == "auto":
        mode = "external" if given else "local_lb" if len(cps) > 1 else "direct"
    if mode == "local_lb":
        return mode, LOCAL_LB_ENDPOINT
    if mode == "external":
        return mode, given
    address = f"[{first.address}]" if ":" in first.address else first.address
    return mode, f"{address}:6443"


def inventory_cluster(inventory: Inventory, first_cp: str | None = None) -> dict[str, Any]:
    """The cluster values that need only the inventory: the endpoint and its mode, the
    control planes, and the first control plane's address (the API server advertises it).
    ``first_cp``: the control plane that speaks for the cluster (default the first listed)."""
    mode, endpoint = endpoint_of(inventory)
    cp = inventory.hosts[first_cp] if first_cp else inventory.control_planes[0]
    return {"endpoint": endpoint, "endpoint_mode": mode,
            "control_planes": [{"host": h.name, "address": h.address}
                               for h in inventory.control_planes if not h.absent],
            "advertise_address": cp.address}
