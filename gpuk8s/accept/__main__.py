"""``python3 -m gpuk8s.accept [--quick] [--json]``: the node half of `invoke accept`, run on
this machine as root, judged here; quarantines nothing. For a box gpuk8s does not reach over
SSH (or to see one node's figures by hand); needs only Python's standard library, nvidia-smi and
the CUDA toolkit."""

from __future__ import annotations

import json
import subprocess
import sys

from gpuk8s.accept.judge import judge
from gpuk8s.accept.node import parse, script


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    out = subprocess.run(["sh", "-c", script(quick)], capture_output=True, text=True,
                         check=False).stdout
    if "--raw" in argv:
        sys.stdout.write(out)
    reading = parse(out)
    result = {**judge(reading), "reading": reading.as_json()}
    if "--json" in argv:
        print(json.dumps(result, indent=2))
    else:
        for g in result["gpus"]:
            for c in g["checks"]:
                print(f"GPU {g['index']} {c['verdict']:5} {c['detail']}")
        for c in result["node_checks"]:
            print(f"node  {c['verdict']:5} {c['detail']}")
        print(f"verdict: {result['verdict']}"
              + (f" ({', '.join(result['reasons'])})" if result["reasons"] else ""))
    return 0 if result["verdict"] != "fail" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
