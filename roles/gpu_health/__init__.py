"""gpuk8s role (loaded by gpuk8s.roles.load_role; a package so mypy checks it)."""
