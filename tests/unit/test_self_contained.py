"""The test suite reads only files in the repository: a user who clones gpuk8s has nothing
beside the checkout (no ../shared/, no /work/...), and a test that reaches outside would pass
here and fail for them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: a path out of the checkout: ../shared, /work/..., or climbing above the repository root
#: from a test module (parents[3] of tests/x/test_y.py is the checkout's parent)
OUTSIDE = re.compile(r"\.\./shared|/work/|\"shared\" / \"fixtures\"|parents\[[3-9]\]")


def test_no_test_or_script_reads_outside_the_repository() -> None:
    offenders = []
    for folder in ("tests", "gpuk8s", "scripts", "bench", ".ci"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix not in (".py", ".sh", "") or not path.is_file() or \
                    "__pycache__" in path.parts or path == Path(__file__).resolve():
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            for n, line in enumerate(text.splitlines(), 1):
                if OUTSIDE.search(line) and "usage" not in line.lower() and \
                        not line.lstrip().startswith("scripts/check-corpus"):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "reads outside the checkout:\n" + "\n".join(offenders)


def test_the_real_nvidia_captures_are_in_the_repository() -> None:
    for host in ("h200-ubuntu2404", "2xh200-ubuntu2404"):
        folder = ROOT / "tests" / "fixtures" / "nvidia" / host
        assert (folder / "nvidia-smi-L.txt").read_text().startswith("GPU 0: NVIDIA H200")
