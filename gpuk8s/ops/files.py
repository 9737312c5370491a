"""File ops: content, templates and removal, compared by sha256, mode and owner."""

from __future__ import annotations

import difflib

from gpuk8s.facts.system import FileState
from gpuk8s.ops import Op, change, noop, q, sha256, write_file


def content(state: FileState, op_id: str, data: bytes, *, mode: str = "0644",
            owner: str = "root", notify: tuple[str, ...] = (), secret: bool = False) -> Op:
    """Ensure ``state.path`` holds exactly ``data`` with ``mode`` and ``owner``.

    No-op when: the file's sha256, mode and owner already match.
    """
    path = state.path
    want_mode = mode.lstrip("0") or "0"
    if state.exists and state.sha256 == sha256(data):
        if state.mode == want_mode and state.owner == owner:
            return noop(op_id, f"= {path} up to date")
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
