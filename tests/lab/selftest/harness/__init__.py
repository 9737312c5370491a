"""Tests of the lab harness (tests/lab/*.py): the booted nodes, the lab images and the signed
package repos. pyproject.toml runs them after tests/lab/product/: the images test pulls on a
bootstrapped cluster, which test_bootstrap's snapshot then gives it without another bootstrap."""
