"""The README's inventory reference lists every variable with its real default."""

from __future__ import annotations

import json
from pathlib import Path

from gpuk8s.variables import load_variable_specs

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_variable_documented_with_its_default() -> None:
    text = README.read_text()
    rows = {line.split("|")[1].strip().strip("`"): line for line in text.splitlines()
            if line.startswith("| `")}
    missing = []
    for name, spec in load_variable_specs().items():
        default = f'"{spec.default}"' if isinstance(spec.default, str) else \
            json.dumps(spec.default)
        row = rows.get(name)
        if row is None or f"`{default}`" not in row:
            missing.append(f"{name} (default {default})")
    assert not missing, "README inventory reference is missing or wrong for: " + \
        ", ".join(missing)
    stale = [r for r in set(rows) - set(load_variable_specs()) if not r.startswith("invoke")]
    assert not stale, f"README documents variables that do not exist: {stale}"
