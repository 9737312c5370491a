"""gpuk8s: bare-metal GPU boxes to a Kubernetes GPU cluster over SSH."""

__version__ = "0.1.0"
