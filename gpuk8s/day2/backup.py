"""`invoke backup`: one backup of the cluster now (gpuk8s/backups.py says what it holds)."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Any

from gpuk8s.backups import take
from gpuk8s.gather import gathered_session
from gpuk8s.report import Reporter
from gpuk8s.session import DEFAULT_OPENER, Opener


def backup(inventory: str | Path, *, keep: int | None = None,
           reporter: Reporter | None = None, opener: Opener = DEFAULT_OPENER) -> dict[str, Any]:
    """Take one backup from the first control plane whose etcd is healthy; only the control
    planes are contacted. ``keep``: how many to keep (default: the inventory's backup_keep)."""
    session = gathered_session(inventory, "control_plane", "backup", reporter=reporter,
                               opener=opener, allow_unreachable=True, any_control_plane=True)
    with closing(session):
        taken = take(session, "invoke backup", keep=keep)
        return {"path": str(taken.path), "manifest": taken.manifest}
