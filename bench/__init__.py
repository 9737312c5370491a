"""Benchmarks of gpuk8s on the lab (``invoke bench``); not part of the test suite."""
