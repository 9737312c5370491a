# LAB STAND-IN: not the real etcd. Test infrastructure for gpuk8s; never shipped to users.
"""Object storage of the stand-in API server: JSON files under the etcd data dir.

Layout: <data-dir>/member/standin/<group or core>/<plural>/<namespace or _cluster>/<name>.json, so
`kubeadm reset` (which empties /var/lib/etcd) wipes the cluster like it does for real etcd.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import json
import os
import threading
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str]  # (group, plural)
HISTORY = 5000  # watch events kept (etcd's compaction window, in events not minutes)


class Event:
    """One change: what a watch stream sends (type ADDED|MODIFIED|DELETED) and the object
    before it (to tell a client its selector stopped matching)."""

    __slots__ = ("key", "obj", "old", "rv", "type")

    def __init__(self, rv: int, etype: str, key: Key, obj: Obj, old: Obj | None) -> None:
        self.rv, self.type, self.key, self.obj, self.old = rv, etype, key, obj, old


class Store:
    def __init__(self, data_dir: str) -> None:
        self.dir = os.path.join(data_dir, "member", "standin")
        os.makedirs(self.dir, exist_ok=True)
        self.lock = threading.RLock()
        self.objs: dict[Key, dict[tuple[str, str], Obj]] = {}
        self.rv = 0
        self.changed = threading.Condition(self.lock)
        self.history: collections.deque[Event] = collections.deque(maxlen=HISTORY)
        self._load()
        self.loaded_rv = self.rv  # a watch from before this start is "too old"

    def _path(self, key: Key, ns: str, name: str) -> str:
        return os.path.join(self.dir, key[0] or "core", key[1], ns or "_cluster", name + ".json")

    def _load(self) -> None:
        try:
            with open(os.path.join(self.dir, "revision")) as f:
                self.rv = int(f.read().strip() or 0)
        except (OSError, ValueError):
            self.rv = 0
        for dirpath, _, files in os.walk(self.dir):
            for fn in files:
                if not fn.endswith(".json"):
                    continue
                rel = os.path.relpath(dirpath, self.dir).split(os.sep)
                if len(rel) != 3:
                    continue
                group = "" if rel[0] == "core" else rel[0]
                ns = "" if rel[2] == "_cluster" else rel[2]
                try:
                    with open(os.path.join(dirpath, fn)) as f:
                        obj = json.load(f)
                except (OSError, ValueError):
                    continue
                self.objs.setdefault((group, rel[1]), {})[(ns, fn[:-5])] = obj

    def next_rv(self) -> str:
        with self.lock:
            self.rv += 1
            tmp = os.path.join(self.dir, "revision.tmp")
            with open(tmp, "w") as f:
                f.write(str(self.rv))
            os.replace(tmp, os.path.join(self.dir, "revision"))
            return str(self.rv)

    def get(self, key: Key, ns: str, name: str) -> Obj | None:
        with self.lock:
            obj = self.objs.get(key, {}).get((ns, name))
            return copy.deepcopy(obj) if obj is not None else None

    def list(self, key: Key, ns: str | None = None) -> list[Obj]:
        with self.lock:
            items = [(k, v) for k, v in self.objs.get(key, {}).items()
                     if ns is None or k[0] == ns]
            return [copy.deepcopy(v) for _, v in sorted(items, key=lambda kv: kv[0])]

    def put(self, key: Key, obj: Obj) -> Obj:
        with self.lock:
            md = obj["metadata"]
            md["resourceVersion"] = self.next_rv()
            ns, name = md.get("namespace", ""), md["name"]
            old = self.objs.setdefault(key, {}).get((ns, name))
            stored = self.objs[key][(ns, name)] = copy.deepcopy(obj)
            # the event shares the stored copy: stored objects are never changed in place
            self._record("ADDED" if old is None else "MODIFIED", key, stored, old)
            path = self._path(key, ns, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path + ".tmp", "w") as f:
                json.dump(obj, f)
            os.replace(path + ".tmp", path)
            return copy.deepcopy(obj)

    def delete(self, key: Key, ns: str, name: str) -> Obj | None:
        with self.lock:
            obj = self.objs.get(key, {}).pop((ns, name), None)
            with contextlib.suppress(OSError):
                os.unlink(self._path(key, ns, name))
            if obj is not None:
                gone = copy.deepcopy(obj)
                gone["metadata"]["resourceVersion"] = self.next_rv()
                self._record("DELETED", key, gone, obj)
            return obj

    def _record(self, etype: str, key: Key, obj: Obj, old: Obj | None) -> None:
        self.history.append(Event(self.rv, etype, key, obj, old))
        self.changed.notify_all()

    def oldest_rv(self) -> int:
        """The oldest resourceVersion a watch may start from (older ones are 410 Gone)."""
        with self.lock:
            return self.history[0].rv - 1 if len(self.history) == HISTORY else self.loaded_rv

    def events_after(self, rv: int, key: Key, timeout: float) -> tuple[list[Event], int]:
        """Changes of `key` after `rv` (waiting up to `timeout` seconds for any change) and the
        revision they were read at, so that a watcher may skip to it."""
        with self.lock:
            if self.rv <= rv:
                self.changed.wait(timeout)
            out = []
            for e in reversed(self.history):
                if e.rv <= rv:
                    break
                if e.key == key:
                    out.append(e)
            return out[::-1], self.rv

    def resource_keys(self) -> list[Key]:
        with self.lock:
            return list(self.objs)
