"""The README keeps step with the code: its inventory reference lists every variable with its
real default, and How a run works names every phase of the playbook, in order."""

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


def test_how_a_run_works_names_every_phase_in_order() -> None:
    from gpuk8s.playbook import PHASES

    text = README.read_text()
    section = text[text.index("## How a run works"):text.index("## Layout")]
    positions = [section.find(f"**{phase.name}**") for phase in PHASES]
    missing = [p.name for p, at in zip(PHASES, positions, strict=True) if at < 0]
    assert not missing, f"README's How a run works does not name the phases {missing}"
    assert positions == sorted(positions), "README lists the phases out of playbook order"
