"""File ops: content, templates and removal, compared by sha256, mode and owner."""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Callable

from gpuk8s.facts.system import FileState
from gpuk8s.ops import Op, change, noop, q, sha256, write_file


def same_toml(wanted: bytes) -> Callable[[bytes], str | None]:
    """An ``equivalent`` for :func:`content`: a file that parses to the same TOML data as
    ``wanted`` (another tool re-wrote it in its own layout) is as good as ``wanted``."""
    def check(host: bytes) -> str | None:
        try:
            same = tomllib.loads(host.decode()) == tomllib.loads(wanted.decode())
        except (UnicodeDecodeError, tomllib.TOMLDecodeError):
            return None
        return "same settings, laid out by another tool" if same else None
    return check


def content(state: FileState, op_id: str, data: bytes, *, mode: str = "0644",
            owner: str = "root", notify: tuple[str, ...] = (), secret: bool = False,
            equivalent: Callable[[bytes], str | None] | None = None) -> Op:
    """Ensure ``state.path`` holds exactly ``data`` with ``mode`` and ``owner``.

    No-op when: the file's sha256, mode and owner already match, or (with ``equivalent``,
    which needs the file's content probed) ``equivalent(content)`` says why the file's other
    bytes mean the same.
    """
    path = state.path
    want_mode = mode.lstrip("0") or "0"
    same = state.exists and state.sha256 == sha256(data)
    why = None
    if not same and state.exists and state.content is not None and equivalent is not None:
        why = equivalent(state.content)
    if same or why:
        if state.mode == want_mode and state.owner == owner:
            return noop(op_id, f"= {path} up to date" + (f" ({why})" if why else ""))
        return change(op_id, f"~ {path} mode/owner {state.mode} {state.owner} -> {mode} {owner}",
                      f"chown {q(owner)}: {q(path)} && chmod {mode} {q(path)}", notify=notify)
    diff = None
    if not secret:
        old = (state.text or "") if state.exists else ""
        diff = "".join(difflib.unified_diff(
            old.splitlines(keepends=True), data.decode(errors="replace").splitlines(keepends=True),
            fromfile=f"{path} (host)" if state.exists else "/dev/null", tofile=f"{path} (wanted)"))
        if state.exists and state.content is None:
            diff = f"(content of {path} not probed; it differs)\n"
    verb = "update" if state.exists else "create"
    return change(op_id, f"+ {verb} {path}", write_file(path, data, mode, owner),
                  notify=notify, diff=diff, secret=secret)


def absent(state: FileState, op_id: str, *, notify: tuple[str, ...] = ()) -> Op:
    """Ensure ``state.path`` does not exist. No-op when: it is already absent."""
    if not state.exists:
        return noop(op_id, f"= {state.path} absent")
    return change(op_id, f"- remove {state.path}", f"rm -f {q(state.path)}", notify=notify)
