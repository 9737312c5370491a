"""gpuk8s's own lab tests, by subject: gpuk8s (its API, CLI and invoke tasks) against the booted
lab over real SSH. They run in the order of their file names and share the lab's snapshots
(test_bootstrap.py takes "bootstrapped", which later modules restore; a module run alone makes
what it needs itself, only slower). runs.py holds their shared helpers."""
