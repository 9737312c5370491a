"""Which exact package versions the wanted version patterns come to, in gpuk8s's own signed
sources, with every dependency those sources carry: what apt on a node would pick from the same
indexes (the newest version that matches, and for a dependency the newest that satisfies every
relation on it), written down once so that every node gets the same."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpuk8s.lock.aptindex import Index, LockError
from gpuk8s.lock.debversion import parse_relations, satisfies, version_key
from gpuk8s.ops.apt import version_matches


@dataclass(frozen=True)
class Locked:
    """One package pinned: its version and the file the source serves, with its hash."""

    name: str
    version: str
    source: str
    filename: str
    size: int
    sha256: str
    #: the pinned packages this one depends on (apt installs them with it, at their pins)
    requires: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"version": self.version, "source": self.source,
                                  "filename": self.filename, "size": self.size,
                                  "sha256": self.sha256}
        if self.requires:
            out["requires"] = sorted(self.requires)
        return out


@dataclass
class Resolution:
    packages: dict[str, Locked] = field(default_factory=dict)
    #: wanted names no gpuk8s source carries: the OS archive's (not pinned by this lock)
    os_archive: set[str] = field(default_factory=set)


def _candidates(indexes: Sequence[Index]) -> dict[str, list[tuple[dict[str, str], Index]]]:
    out: dict[str, list[tuple[dict[str, str], Index]]] = {}
    for index in indexes:
        for stanza in index.packages:
            out.setdefault(stanza["Package"], []).append((stanza, index))
    for versions in out.values():
        versions.sort(key=lambda pair: version_key(pair[0]["Version"]), reverse=True)
    return out


def resolve(wanted: Mapping[str, str], indexes: Sequence[Index]) -> Resolution:
    """Pin each wanted package (name -> version pattern, as ops.apt.packages takes) and its
    dependencies found in ``indexes``; a dependency none of them carries is the OS archive's."""
    known = _candidates(indexes)
    result = Resolution()
    # relations gathered on each name so far: a later dependency narrows an earlier choice
    relations: dict[str, list[tuple[str, str, str]]] = {}
    queue: list[str] = []

    def pick(name: str, why: str) -> None:
        rels = relations.get(name, [])
        choices = [(s, i) for s, i in known.get(name, ())
                   if all(ok(s["Version"], r) for r in rels)]
        if not choices:
            shown = ", ".join(f"{r[0]} {r[1]}" if r[0] != "match" else f'"{r[1]}*"'
                              for r in (x[1:] for x in rels))
            raise LockError(f"no version of {name} in the gpuk8s apt sources meets {shown} "
                            f"({why})")
        stanza, index = choices[0]
        old = result.packages.get(name)
        if old is not None and old.version == stanza["Version"]:
            return
        result.packages[name] = Locked(
            name, stanza["Version"], index.source.name, stanza.get("Filename", ""),
            int(stanza.get("Size", "0") or 0), stanza.get("SHA256", ""))
        if not result.packages[name].sha256:
            raise LockError(f"{name} {stanza['Version']} in apt source {index.source.name} "
                            "has no SHA256 in its Packages index; the lock cannot pin it")
        queue.append(name)

    def ok(version: str, rel: tuple[str, str, str]) -> bool:
        _, op, want = rel
        if op == "match":
            return version_matches(version, want)
        return satisfies(version, op, want)

    for name in sorted(wanted):
        if name not in known:
            result.os_archive.add(name)
            continue
        relations.setdefault(name, []).append(("wanted", "match", wanted[name]))
        pick(name, "the version the inventory asks for")
    requires: dict[str, set[str]] = {}
    while queue:
        name = queue.pop(0)
        locked = result.packages[name]
        stanza = next(s for s, _ in known[name] if s["Version"] == locked.version)
        text = ", ".join(v for v in (stanza.get("Pre-Depends", ""), stanza.get("Depends", ""))
                         if v)
        try:
            groups = parse_relations(text)
        except ValueError as exc:
            raise LockError(f"{name} {locked.version}: {exc}") from None
        for group in groups:
            carried = [alt for alt in group if alt[0] in known]
            if not carried:
                result.os_archive.update(alt[0] for alt in group[:1])
                continue
            # an alternative already pinned and meeting the relation settles the group
            held = [a[0] for a in carried if a[0] in result.packages and
                    satisfies(result.packages[a[0]].version, a[1], a[2])]
            if held:
                requires.setdefault(name, set()).add(held[0])
                # kept, so that a later pick of it still meets this relation
                rel = next(a for a in carried if a[0] == held[0])
                relations.setdefault(held[0], []).append((name, rel[1], rel[2]))
                continue
            dep, op, want = carried[0]
            requires.setdefault(name, set()).add(dep)
            relations.setdefault(dep, []).append((name, op, want))
            pick(dep, f"{name} {locked.version} depends on {dep}"
                      + (f" ({op} {want})" if op else ""))
    result.os_archive -= set(result.packages)
    for name, deps in requires.items():
        result.packages[name] = replace(result.packages[name], requires=tuple(sorted(deps)))
    return result
