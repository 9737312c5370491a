# LAB STAND-IN client of the REAL etcd. Test infrastructure for gpuk8s; never shipped to users.
"""Object storage of the stand-in API server: a REAL etcd (3.5, Debian's etcd-server), reached
through etcd's JSON gateway (/v3/kv/..., /v3/watch) with the client certificate kubeadm issues
the API server, as the real kube-apiserver reaches it through gRPC.

Keys are /registry/<group or core>/<plural>/<namespace or _cluster>/<name>, values the objects'
JSON; an object's resourceVersion is its etcd mod_revision, as in Kubernetes. Reads come from a
cache fed by one etcd watch (the real API server's watch cache); every write is an etcd
transaction that compares the revision this server last saw (so API servers sharing the etcd
never overwrite each other's changes unseen), and returns once the watch has brought it back.
`kubeadm reset` empties /var/lib/etcd, wiping the cluster as it does for real.
"""

from __future__ import annotations

import base64
import collections
import copy
import http.client
import json
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str]  # (group, plural)
HISTORY = 5000  # watch events kept (etcd's compaction window, in events not minutes)
PREFIX = "/registry/"


class StoreError(RuntimeError):
    """etcd cannot be reached or refused a request."""


class Conflict(StoreError):
    """Another API server changed the object since this one read it."""


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unb64(text: str) -> str:
    return base64.b64decode(text).decode()


def _prefix_end(prefix: str) -> str:
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


class Event:
    """One change: what a watch stream sends (type ADDED|MODIFIED|DELETED) and the object
    before it (to tell a client its selector stopped matching)."""

    __slots__ = ("key", "obj", "old", "rv", "type")

    def __init__(self, rv: int, etype: str, key: Key, obj: Obj, old: Obj | None) -> None:
        self.rv, self.type, self.key, self.obj, self.old = rv, etype, key, obj, old


class Etcd:
    """etcd's v3 JSON gateway over http(s), with a client certificate when given."""

    def __init__(self, endpoint: str, ca: str = "", cert: str = "", key: str = "",
                 timeout: float = 10) -> None:
        u = urllib.parse.urlsplit(endpoint)
        self.https = u.scheme == "https"
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 2379
        self.timeout = timeout
        self.ctx: ssl.SSLContext | None = None
        if self.https:
            self.ctx = ssl.create_default_context(cafile=ca or None)
            if cert:
                self.ctx.load_cert_chain(cert, key or None)

    def connect(self, timeout: float | None = None) -> http.client.HTTPConnection:
        t = self.timeout if timeout is None else timeout
        if self.https:
            return http.client.HTTPSConnection(self.host, self.port, timeout=t, context=self.ctx)
        return http.client.HTTPConnection(self.host, self.port, timeout=t)

    def call(self, path: str, body: Obj, timeout: float | None = None) -> Obj:
        conn = self.connect(timeout)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise StoreError(f"etcd {self.host}:{self.port}: {e}") from None
        finally:
            conn.close()
        if resp.status != 200:
            raise StoreError(f"etcd {path}: HTTP {resp.status}: {data[:300]!r}")
        out: Obj = json.loads(data)
        return out


class Store:
    def __init__(self, endpoint: str, ca: str = "", cert: str = "", key: str = "",
                 wait: float = 60) -> None:
        self.etcd = Etcd(endpoint, ca, cert, key)
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.objs: dict[Key, dict[tuple[str, str], Obj]] = {}
        # each stored object's JSON: get and list hand out json.loads copies of it (C code, many
        # times cheaper than copy.deepcopy, and the lab's kubelets list pods every few seconds)
        self.texts: dict[Key, dict[tuple[str, str], str]] = {}
        self.revs: dict[str, int] = {}  # etcd key -> mod_revision this server saw
        self.history: collections.deque[Event] = collections.deque(maxlen=HISTORY)
        self.rv = 0
        self.error = ""
        deadline = time.monotonic() + wait
        while True:  # the API server waits for etcd (its static pod may start later)
            try:
                self._load()
                break
            except StoreError as e:
                if time.monotonic() > deadline:
                    raise
                self.error = str(e)
                time.sleep(0.5)
        self.loaded_rv = self.rv  # a watch from before this start is "too old"
        threading.Thread(target=self._watch_forever, daemon=True, name="etcd-watch").start()

    # ------------------------------------------------------------------ keys and values
    @staticmethod
    def _ekey(key: Key, ns: str, name: str) -> str:
        return f"{PREFIX}{key[0] or 'core'}/{key[1]}/{ns or '_cluster'}/{name}"

    @staticmethod
    def _parse(ekey: str) -> tuple[Key, str, str] | None:
        parts = ekey[len(PREFIX):].split("/")
        if not ekey.startswith(PREFIX) or len(parts) != 4:
            return None
        group, plural, ns, name = parts
        return ("" if group == "core" else group, plural), \
            "" if ns == "_cluster" else ns, name

    @staticmethod
    def _value(kv: Obj, rv: int) -> Obj:
        obj: Obj = json.loads(_unb64(kv.get("value", "")) or "{}")
        obj.setdefault("metadata", {})["resourceVersion"] = str(rv)
        return obj

    def _keep(self, key: Key, where: tuple[str, str], obj: Obj) -> Obj:
        """Store ``obj`` (never changed in place afterwards) and its JSON; hold the lock."""
        self.objs.setdefault(key, {})[where] = obj
        self.texts.setdefault(key, {})[where] = json.dumps(obj)
        return obj

    # ------------------------------------------------------------------ the cache
    def _load(self) -> None:
        out = self.etcd.call("/v3/kv/range", {"key": _b64(PREFIX),
                                              "range_end": _b64(_prefix_end(PREFIX))})
        with self.lock:
            self.objs.clear()
            self.texts.clear()
            self.revs.clear()
            for kv in out.get("kvs") or []:
                ekey = _unb64(kv["key"])
                where = self._parse(ekey)
                if where is None:
                    continue
                rev = int(kv["mod_revision"])
                self._keep(where[0], (where[1], where[2]), self._value(kv, rev))
                self.revs[ekey] = rev
            self.rv = int(out["header"]["revision"])

    def _watch_forever(self) -> None:
        while True:
            try:
                self._watch()
            except (OSError, http.client.HTTPException, ValueError, StoreError) as e:
                self.error = f"etcd watch: {e}"
            time.sleep(0.5)

    def _watch(self) -> None:
        conn = self.etcd.connect(timeout=None)
        try:
            body = {"create_request": {"key": _b64(PREFIX), "range_end": _b64(_prefix_end(PREFIX)),
                                       "start_revision": str(self.rv + 1), "prev_kv": True,
                                       "progress_notify": True}}
            conn.request("POST", "/v3/watch", json.dumps(body),
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise StoreError(f"HTTP {resp.status}")
            dec = json.JSONDecoder()
            buf = ""
            while True:
                chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
                if not chunk:
                    raise StoreError("the watch stream ended")
                buf += chunk.decode()
                while True:
                    buf = buf.lstrip()
                    if not buf:
                        break
                    try:
                        msg, end = dec.raw_decode(buf)
                    except ValueError:
                        break  # an incomplete message: read more
                    buf = buf[end:]
                    self._apply(msg)
        finally:
            conn.close()

    def _apply(self, msg: Obj) -> None:
        result = msg.get("result") or {}
        if "error" in msg:
            raise StoreError(str(msg["error"]))
        if result.get("compact_revision") and int(result["compact_revision"]) > self.rv:
            self._load()  # compacted past us: start over from a fresh list
            return
        events = result.get("events") or []
        with self.lock:
            for ev in events:
                kv = ev["kv"]
                ekey = _unb64(kv["key"])
                where = self._parse(ekey)
                rev = int(kv["mod_revision"])
                if where is None:
                    continue
                key, ns, name = where
                bucket = self.objs.setdefault(key, {})
                old = bucket.get((ns, name))
                if ev.get("type") == "DELETE":
                    text = self.texts.get(key, {}).pop((ns, name), None)
                    gone = json.loads(text) if text is not None else \
                        self._value(ev.get("prev_kv") or {}, rev)
                    gone.setdefault("metadata", {})["resourceVersion"] = str(rev)
                    bucket.pop((ns, name), None)
                    self.revs.pop(ekey, None)
                    self.history.append(Event(rev, "DELETED", key, gone, old))
                else:
                    obj = self._keep(key, (ns, name), self._value(kv, rev))
                    self.revs[ekey] = rev
                    # the event shares the stored copy: stored objects are never changed in place
                    self.history.append(Event(rev, "ADDED" if old is None else "MODIFIED",
                                              key, obj, old))
            if events:
                self.rv = max(self.rv, *(int(e["kv"]["mod_revision"]) for e in events))
            elif not result.get("created"):  # a progress notice: nothing is left before it
                self.rv = max(self.rv, int((result.get("header") or {}).get("revision", 0)))
            self.changed.notify_all()

    def _caught_up(self, rev: int, timeout: float = 30) -> None:
        """Return once the watch has brought revision ``rev`` into the cache."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while self.rv < rev:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StoreError(f"the etcd watch did not bring revision {rev} in "
                                     f"{timeout:.0f}s ({self.error or 'no error seen'})")
                self.changed.wait(left)

    def catch_up(self, timeout: float = 10) -> None:
        """Wait until the cache holds everything etcd holds now: etcd's current revision (a
        range that matches no key answers its header) brought in by the watch. The real API
        server answers a GET from etcd itself (a quorum read); the lab's serves its cache,
        which lags another API server's write by a watch event: a client that created an
        object through one API server and reads it through another (kubeadm join's CSR,
        behind HAProxy) must still find it."""
        out = self.etcd.call("/v3/kv/range", {"key": _b64(PREFIX)})
        self._caught_up(int((out.get("header") or {}).get("revision") or 0), timeout)

    # ------------------------------------------------------------------ the API
    def get(self, key: Key, ns: str, name: str) -> Obj | None:
        with self.lock:
            text = self.texts.get(key, {}).get((ns, name))
        return json.loads(text) if text is not None else None

    def list(self, key: Key, ns: str | None = None,
             where: Callable[[Obj], bool] | None = None) -> list[Obj]:
        """Copies of the objects of ``key`` (in ``ns``), by namespace and name; ``where``
        picks among the stored objects first (it must not change them), so that a selective
        list (a kubelet's pods of its node) copies only what it returns."""
        with self.lock:
            texts = self.texts.get(key, {})
            items = [(k, texts[k]) for k, o in self.objs.get(key, {}).items()
                     if (ns is None or k[0] == ns) and (where is None or where(o))]
        return [json.loads(v) for _, v in sorted(items, key=lambda kv: kv[0])]

    def shared(self, key: Key, ns: str | None = None) -> list[Obj]:
        """The stored objects of ``key`` (in ``ns``) themselves, not copies, by namespace and
        name: for readers that never change what they get (authorization reads every binding
        of each request). Stored objects are never changed in place, so they stay valid."""
        with self.lock:
            items = [(k, o) for k, o in self.objs.get(key, {}).items()
                     if ns is None or k[0] == ns]
        return [o for _, o in sorted(items, key=lambda kv: kv[0])]

    def _txn(self, ekey: str, request: Obj, based_on: Any = None) -> int:
        """Run ``request`` if the key is still at the revision the change was based on (the
        object's resourceVersion, else the newest this server saw; absent: it must not
        exist); raise Conflict if another API server changed it in between."""
        conditional = str(based_on or "").isdigit()
        seen = int(based_on) if conditional and ekey in self.revs else self.revs.get(ekey)
        for _ in range(5):
            compare = {"target": "MOD", "key": _b64(ekey), "mod_revision": str(seen),
                       "result": "EQUAL"} if seen is not None else \
                {"target": "CREATE", "key": _b64(ekey), "create_revision": "0",
                 "result": "EQUAL"}
            out = self.etcd.call("/v3/kv/txn", {
                "compare": [compare], "success": [request],
                "failure": [{"request_range": {"key": _b64(ekey)}}]})
            if out.get("succeeded"):
                rev = int(out["header"]["revision"])
                self._caught_up(rev)
                return rev
            if conditional:  # the client's resourceVersion is stale: its conflict
                break
            # no precondition from the client: like the real API server's GuaranteedUpdate,
            # try again against the key's revision in etcd (this server's cache lagged behind)
            kvs = ((out.get("responses") or [{}])[0].get("response_range") or {}).get("kvs")
            seen = int(kvs[0]["mod_revision"]) if kvs else None
        raise Conflict(f"{ekey} was changed by another API server")

    def put(self, key: Key, obj: Obj) -> Obj:
        md = obj["metadata"]
        ekey = self._ekey(key, md.get("namespace", ""), md["name"])
        value = {**obj, "metadata": {k: v for k, v in md.items() if k != "resourceVersion"}}
        rev = self._txn(ekey, {"request_put": {"key": _b64(ekey),
                                               "value": _b64(json.dumps(value))}},
                        md.get("resourceVersion"))
        md["resourceVersion"] = str(rev)
        return copy.deepcopy(obj)

    def delete(self, key: Key, ns: str, name: str) -> Obj | None:
        ekey = self._ekey(key, ns, name)
        with self.lock:
            text = self.texts.get(key, {}).get((ns, name))
            if text is None:
                return None
            obj = json.loads(text)
        self._txn(ekey, {"request_delete_range": {"key": _b64(ekey)}})
        return obj

    def healthy(self) -> bool:
        """Whether etcd answers a linearizable read within 2 s (it cannot without quorum)."""
        try:
            self.etcd.call("/v3/kv/range", {"key": _b64("health"), "limit": "1"}, timeout=2)
        except StoreError:
            return False
        return True

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
