"""The lab's own tests (not gpuk8s's): standins/ tests the stand-ins on this machine without
booting the lab; harness/ tests the harness itself (nodes, lab images, package repos), which
boots the lab (its images test runs on a bootstrapped cluster)."""
