#!/usr/bin/env bash
# On a real NVIDIA host (no network, no package registry, no lab): the node GPU check of
# `invoke verify --local`, once with the host's nvcc (compile time apart from kernel and
# first-launch time) and once without it (the PyTorch fallback: this interpreter first, then
# /usr/bin/python3, /usr/local/bin/python3, the venv's base python3), plus the raw lines of both
# node scripts for test fixtures. Everything is kept in runs/device-verify-<UTC time>/.
#
# Usage: scripts/device-verify.sh [PYTHON]   (default: .venv/bin/python if there, else python3)
# Run it as root (or with passwordless sudo): inventories/local.yaml reaches this machine the
# way gpuk8s reaches any node, as root.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${1:-}
if [ -z "$py" ]; then
  if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
out="runs/device-verify-$(date -u +%Y%m%d-%H%M%S)"
mkdir -p "$out"
export COLUMNS="${COLUMNS:-160}"  # the table unwrapped when it goes to a file
echo "python: $py  output: $out"

{
  date -u
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
  for n in "$(command -v nvcc)" /usr/local/cuda/bin/nvcc; do
    [ -x "$n" ] && { echo "nvcc: $n"; "$n" --version | tail -n 2; break; }
  done
  for p in "$py" /usr/bin/python3 /usr/local/bin/python3; do
    [ -x "$(command -v "$p")" ] || continue
    echo "$p: $("$p" -c 'import sys; print(sys.version.split()[0], sys.prefix)' 2>&1)"
  done
} > "$out/host.txt" 2>&1
cat "$out/host.txt"

status=0
echo; echo "== 1. with nvcc (python -m gpuk8s.gpucheck)"
"$py" -m gpuk8s.gpucheck -i inventories/local.yaml 2>&1 | tee "$out/verify-local.txt"
rc=${PIPESTATUS[0]}; echo "exit code $rc"; [ "$rc" = 0 ] || status=1

echo; echo "== 2. without nvcc: the PyTorch fallback (--without-nvcc)"
"$py" -m gpuk8s.gpucheck -i inventories/local.yaml --without-nvcc 2>&1 \
  | tee "$out/verify-local-torch.txt"
rc=${PIPESTATUS[0]}; echo "exit code $rc"; [ "$rc" = 0 ] || status=1

# the node scripts' own lines (what parse_check reads), for tests/fixtures/real/
for mode in nvcc torch; do
  "$py" -c "import sys
from gpuk8s.gpucheck_script import check_script, local_pythons
sys.stdout.write(check_script(pythons=local_pythons(), nvcc=sys.argv[1] == 'nvcc'))" "$mode" \
    | sh > "$out/check-lines-$mode.txt" 2>&1
  echo "raw lines ($mode, exit code $?): $out/check-lines-$mode.txt"
done
exit "$status"
