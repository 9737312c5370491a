"""gpuk8s roles: one folder each (role.py, defaults.yaml, templates/)."""
