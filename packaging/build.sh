#!/usr/bin/env bash
# Builds dist/danube, one self-contained executable for VMs, in a throwaway virtualenv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
"$PY" -m venv build/pyinstaller-venv
build/pyinstaller-venv/bin/pip install -q --upgrade pip
# Every optional backend goes inside: a VM install is one file, whatever the config names.
build/pyinstaller-venv/bin/pip install -q ".[cloud,etcd,write-buffer]" "pyinstaller>=6"
build/pyinstaller-venv/bin/pyinstaller --noconfirm --clean --distpath dist \
    --workpath build/pyinstaller packaging/danube.spec
ls -l dist/danube && echo "built dist/danube"
