"""`invoke lock`: one file that says, for one cluster, every apt package version (with the
SHA256 of its .deb) and every image digest (per platform) that its bootstrap installs and pulls.

How it knows what bootstrap installs: it gathers the hosts' facts (read-only, as plan does),
plans every role on every host, and reads the apt sources and package patterns the plan's ops
carry (ops.apt SOURCE_META/PACKAGES_META): the roles are the one truth of what a node gets, and
the lock never repeats their choices. Then, on this machine:

- apt: each source's InRelease is checked with gpgv against the key the inventory pins, its
  Packages against the signed Release, and each pattern resolved to the newest matching version
  with every dependency those sources carry (lock.resolve), per OS release and architecture.
- images: `invoke images` at the locked Kubernetes patch (the kubeadm version), the cluster's
  and ``lock_workloads``', each resolved to its digest through the registry_mirrors the nodes
  use (or the registry itself).

The file is YAML, every list and mapping sorted, with nothing in it that changes between two
runs on unchanged inputs (no dates, no timings): a second lock writes the same bytes, and a
change shows in `git diff` as the lines it changes.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuk8s.errors import Gpuk8sError
from gpuk8s.facts.system import OsRelease, System
from gpuk8s.gather import gathered_session
from gpuk8s.images import registry_of
from gpuk8s.lock.aptindex import Fetch, Index, LockError, Source, http_fetch, read_index
from gpuk8s.lock.debversion import version_key
from gpuk8s.lock.digests import Resolved, resolve_image
from gpuk8s.lock.osarchive import (
    READ_STATUS,
    Fetched,
    minimal_status,
    parse_print_uris,
    resolve_script,
)
from gpuk8s.lock.resolve import Locked, Resolution, resolve
from gpuk8s.lockfile import lock_path, release_key
from gpuk8s.ops.apt import PACKAGES_META, SOURCE_META
from gpuk8s.ops.registry import Mirror, mirrors
from gpuk8s.playbook import PHASES
from gpuk8s.report import Reporter
from gpuk8s.roles import load_role
from gpuk8s.runner import phase_hosts
from gpuk8s.session import Session, context, role_vars, run_step

__all__ = ["LockError", "lock", "lock_path"]

HEADER = ("# gpuk8s.lock: every apt package and image this cluster installs, pinned.\n"
          "# Written by `invoke lock`; edit the inventory and lock again instead of this file.\n")


def host_release(session: Session, host: str) -> str:
    """A host's OS release key (lockfile.release_key), from its facts."""
    return release_key(session.facts[host][OsRelease()], session.facts[host][System()].arch)


@dataclass
class Planned:
    """One OS release's part of the plan: the apt sources its hosts get, the version pattern
    of each package asked, and what each host asks."""

    sources: dict[str, Source] = field(default_factory=dict)
    wanted: dict[str, str] = field(default_factory=dict)
    hosts: dict[str, dict[str, str]] = field(default_factory=dict)


def planned_apt(session: Session) -> dict[str, Planned]:
    """Per OS release: the apt sources and package patterns the plan gives its hosts. Two
    hosts of one release asking different patterns of one package cannot share one lock:
    that is an error naming both."""
    out: dict[str, Planned] = {}
    asked_by: dict[tuple[str, str], str] = {}
    for phase in PHASES:
        for host in phase_hosts(session, phase):
            key = host_release(session, host)
            planned = out.setdefault(key, Planned())
            asks = planned.hosts.setdefault(host, {})
            for role in phase.roles:
                try:
                    ops = load_role(role).plan(context(session, host, role))
                except Gpuk8sError as exc:
                    raise LockError(f"{host}: role {role} cannot be planned, so the lock "
                                    f"cannot tell what it installs: {exc}") from exc
                for op in ops:
                    if SOURCE_META in op.meta:
                        src = Source(**json.loads(op.meta[SOURCE_META]))
                        planned.sources[src.name] = src
                    for name, pattern in json.loads(op.meta.get(PACKAGES_META, "{}")).items():
                        if planned.wanted.get(name, pattern) != pattern:
                            raise LockError(
                                f"{host} asks for {name} {pattern!r} but "
                                f"{asked_by[key, name]} of the same OS release ({key}) asks "
                                f"for {planned.wanted[name]!r}: one lock pins one version per "
                                "release; set the variable behind it the same on both")
                        planned.wanted[name] = asks[name] = pattern
                        asked_by.setdefault((key, name), host)
    return out


def os_archive(session: Session, host: str, indexes: Sequence[Index], asks: Mapping[str, str],
               pinned: Mapping[str, str]) -> tuple[list[Fetched], list[Locked]]:
    """What ``host``'s apt would fetch from its OS archive for what it asks (lock.osarchive);
    and, from gpuk8s's sources, what it would fetch beyond the pins (a Recommends, a
    dependency met through Provides), pinned from the signed index the admin machine read.
    apt's answer for a pinned package must agree with its pin."""
    raw = run_step(session, host, READ_STATUS, "lock | read dpkg status", timeout=120)
    try:
        status = minimal_status(gzip.decompress(base64.b64decode(raw.strip()))
                                .decode("utf-8", "replace"))
    except (ValueError, OSError) as exc:
        raise LockError(f"{host}: cannot read its dpkg status ({exc})") from None
    script = resolve_script([(i.source, i.keyring) for i in indexes], status,
                            {n: p for n, p in asks.items() if n not in pinned}, pinned)
    try:
        out = run_step(session, host, script, "lock | resolve with the node's apt",
                       timeout=900)
    except Gpuk8sError as exc:
        raise LockError(f"{host}: its apt cannot resolve what bootstrap installs: {exc}"
                        ) from exc
    found, extra = [], []
    for item in parse_print_uris(out):
        index = next((i for i in indexes if item.url.startswith(i.source.base())), None)
        if index is None:
            found.append(item)
            continue
        if item.name in pinned:
            if pinned[item.name] != item.version:
                raise LockError(f"{host}: its apt would install {item.name} {item.version}, "
                                f"not the {pinned[item.name]} the lock pins")
            continue
        record = next((p for p in index.packages if p["Package"] == item.name
                       and p["Version"] == item.version), None)
        if record is None or record.get("SHA256") != item.sha256:
            raise LockError(f"{host}: its apt would fetch {item.name} {item.version} from apt "
                            f"source {index.source.name}, whose signed index (as read here) "
                            "does not list it with that SHA256")
        extra.append(Locked(item.name, item.version, index.source.name,
                            record.get("Filename", ""), int(record.get("Size", "0") or 0),
                            record["SHA256"]))
    return found, extra


def lock_apt(session: Session, fetch: Fetch, *, with_os: bool = True) -> dict[str, Any]:
    # one index per source URL, suite, key and architecture: two OS releases may share a
    # source name (docker) with different URLs and suites
    indexes: dict[tuple[str, ...], Index] = {}
    releases: dict[str, Any] = {}
    for key, planned in sorted(planned_apt(session).items()):
        arch = key.rsplit("-", 1)[1]
        got = []
        sources: dict[str, dict[str, str]] = {}
        for name in sorted(planned.sources):
            src = planned.sources[name]
            cache = (src.url, src.suite, src.components, src.key_url, src.fingerprint, arch)
            if cache not in indexes:
                indexes[cache] = read_index(src, arch, fetch)
            got.append(indexes[cache])
            sources[name] = {"url": src.url, "suite": src.suite, "components": src.components,
                             "key_url": src.key_url, "variable": src.variable,
                             "key_fingerprint": indexes[cache].fingerprint}
        res = resolve(planned.wanted, got)
        os_pkgs: dict[str, Fetched] = {}
        if with_os:
            for host in sorted(planned.hosts):
                asks = planned.hosts[host]
                pinned = {n: res.packages[n].version for want in asks if want in res.packages
                          for n in _closure(res, want)}
                found, extra = os_archive(session, host, got, asks, pinned)
                for item in found:
                    old = os_pkgs.get(item.name)
                    if old is None or version_key(item.version) > version_key(old.version):
                        os_pkgs[item.name] = item
                for locked in extra:
                    res.packages.setdefault(locked.name, locked)
        releases[key] = {
            "hosts": sorted(planned.hosts),
            "sources": sources,
            "packages": {n: res.packages[n].as_dict() for n in sorted(res.packages)},
            "os_archive": {n: os_pkgs[n].as_dict() for n in sorted(os_pkgs)} if with_os
            else sorted(res.os_archive)}
    return {"releases": releases}


def _closure(res: Resolution, name: str) -> list[str]:
    out: list[str] = []
    todo = [name]
    while todo:
        item = todo.pop()
        if item not in out and item in res.packages:
            out.append(item)
            todo.extend(res.packages[item].requires)
    return out


def lock_images(session: Session, kubeadm: str,
                resolver: Callable[[str, Mirror | None], Resolved]) -> dict[str, Any]:
    """Every image of the cluster and of lock_workloads, resolved to digests."""
    from gpuk8s.images import cluster_images, workload_images
    from gpuk8s.workloads import WORKLOADS

    vars = dict(role_vars(session.host(session.first_cp)))
    if kubeadm:
        vars["kubernetes_package_version"] = kubeadm
    names = list(vars.get("lock_workloads") or ())
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise LockError(f"lock_workloads names {', '.join(unknown)}, which gpuk8s does not "
                        f"deploy; pick from {', '.join(WORKLOADS)}")
    found: dict[str, list[str]] = {}
    for image, why in cluster_images(vars) + workload_images(names=names):
        found.setdefault(image, [])
        if why not in found[image]:
            found[image].append(why)
    wanted = mirrors(vars.get("registry_mirrors") or {})
    out: dict[str, Any] = {}
    for image in sorted(found):
        via = wanted.get(registry_of(image)) or wanted.get("_default") or []
        mirror = via[0] if via else None
        got = resolver(image, mirror)
        entry: dict[str, Any] = {"digest": got.digest, "media_type": got.media_type,
                                 "used_by": sorted(found[image])}
        if got.platforms:
            entry["platforms"] = dict(sorted(got.platforms.items()))
        out[image] = entry
    return out


def render(data: Mapping[str, Any]) -> str:
    return HEADER + yaml.safe_dump(dict(data), sort_keys=True, default_flow_style=False,
                                   width=100, allow_unicode=False)


def lock(inventory: str | Path, *, output: str | Path | None = None, sets: Sequence[str] = (),
         reporter: Reporter | None = None, fetch: Fetch = http_fetch,
         resolver: Callable[[str, Mirror | None], Resolved] = resolve_image,
         with_os: bool = True) -> Path:
    """Write the inventory's lock (default: beside it, lock_path) and return its path. The
    file is replaced only once everything resolved: a failed lock leaves the old one."""
    session = gathered_session(inventory, None, "lock", sets=sets, reporter=reporter)
    with closing(session):
        apt = lock_apt(session, fetch, with_os=with_os)
        kubeadm = ""
        for release in apt["releases"].values():
            kubeadm = kubeadm or release["packages"].get("kubeadm", {}).get("version", "")
        images = lock_images(session, kubeadm, resolver)
        data = {"version": 1, "apt": apt, "images": images}
    path = Path(output) if output else lock_path(inventory)
    text = render(data)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    pkgs = sum(len(r["packages"]) + len(r["os_archive"]) for r in apt["releases"].values())
    sources = {n for r in apt["releases"].values() for n in r["sources"]}
    (reporter or Reporter()).print(
        f"lock: {pkgs} package(s) in {len(apt['releases'])} OS release(s) from "
        f"{len(sources)} apt source(s) and the OS archive, {len(images)} image(s) -> {path}")
    return path
