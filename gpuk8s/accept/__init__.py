"""GPU acceptance: `invoke accept` proves a GPU node's health and numbers on the node itself,
judges them against its model's references, and quarantines a node that fails.

- references: the figures per GPU model (each with its source), the health rules, fatal Xids
- node: the script run on the node (nvidia-smi, the kernel log, the benchmark) and its parser
- judge: the checks and verdict of one node
- command: accept, release and the quarantine (cordon, taint, label, annotation)
"""
