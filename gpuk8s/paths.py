"""The project root: the one folder gpuk8s reads roles/, templates/ and the variables' defaults
(gpuk8s/defaults.yaml, roles/*/defaults.yaml) from.

``$GPUK8S_HOME`` when set (a gpuk8s wheel installed in any venv, e.g. from an offline bundle,
pointed at the bundle's checkout), else the checkout this gpuk8s package is imported from. Every
reader of those folders calls :func:`project_root`; files shipped inside the package itself
(gpuk8s/data/) are read beside the package. A user's own paths (inventories, runs/) stay
relative to the current directory."""

from __future__ import annotations

import os
from pathlib import Path

from gpuk8s.errors import ProjectRootError

ENV = "GPUK8S_HOME"
#: what project_root reads in a gpuk8s checkout (a git clone, or a bundle's gpuk8s-VERSION/)
NEEDED = ("roles/", "templates/", "gpuk8s/defaults.yaml")
#: the folder this package's checkout would be (the package's parent)
_PACKAGE_PARENT = Path(__file__).resolve().parent.parent


def missing(root: Path) -> list[str]:
    """What of NEEDED ``root`` lacks (empty: it is a gpuk8s checkout)."""
    def present(need: str) -> bool:
        return (root / need).is_dir() if need.endswith("/") else (root / need).is_file()

    return [need for need in NEEDED if not present(need)]


def project_root() -> Path:
    """The gpuk8s checkout to read roles/, templates/ and the defaults from (absolute).

    Raises ProjectRootError, naming what is missing and the fix, when $GPUK8S_HOME is not a
    gpuk8s checkout, or when it is unset and gpuk8s is installed apart from its checkout."""
    home = os.environ.get(ENV, "")
    if home:
        root = Path(home).expanduser().resolve()
        lacks = missing(root)
        if lacks:
            raise ProjectRootError(
                f"{ENV}={home} is not a gpuk8s checkout: {root} has no {', '.join(lacks)}",
                fix=f"point {ENV} at the gpuk8s checkout (the folder with roles/, templates/ "
                    f"and tasks.py; in an offline bundle its gpuk8s-VERSION/ folder), e.g. "
                    f"export {ENV}=/path/to/gpuk8s-0.1.0, or unset {ENV} to run from the "
                    "checkout gpuk8s is installed from")
        return root
    lacks = missing(_PACKAGE_PARENT)
    if lacks:
        raise ProjectRootError(
            f"gpuk8s is installed apart from its checkout ({_PACKAGE_PARENT} has no "
            f"{', '.join(lacks)}) and {ENV} is not set",
            fix=f"export {ENV}=/path/to/the/gpuk8s/checkout (the folder with roles/, "
                "templates/ and tasks.py; in an offline bundle its gpuk8s-VERSION/ folder)")
    return _PACKAGE_PARENT
