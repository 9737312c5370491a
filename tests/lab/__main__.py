"""CLI: python -m tests.lab {up,down,status,ssh,snapshot,restore,inventory,images}."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
