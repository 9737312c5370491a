#!/bin/sh
# gpuk8s {version} offline install: a venv in {src}/.venv, everything from wheels/.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
py=${{PYTHON:-python3}}
have=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$have" != {python} ]; then
  echo "install.sh: these wheels are for Python {python}; $py is $have" >&2
  exit 1
fi
cd "$here/{src}"
"$py" -m venv .venv
.venv/bin/pip install --no-index --find-links "$here/wheels" -e .
echo "installed: cd $here/{src} && source .venv/bin/activate && invoke --list"
