#!/usr/bin/env bash
# Builds dist/danube, one self-contained executable for VMs, in a throwaway virtualenv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
"$PY" -m venv build/pyinstaller-venv
build/pyinstaller-venv/bin/pip install -q --upgrade pip
# Every optional backend goes inside: a VM install is one file, whatever the config names.
build/pyinstaller-venv/bin/pip install -q ".[cloud,etcd,mcp,write-buffer]" "pyinstaller>=6"
build/pyinstaller-venv/bin/pyinstaller --noconfirm --clean --distpath dist \
    --workpath build/pyinstaller packaging/danube.spec
# Upstream's program names, linked to the one file (it picks the program by its name).
for name in danube-broker danube-cli danube-admin; do
    ln -sf danube "dist/$name"
done
ls -l dist/danube dist/danube-broker dist/danube-cli dist/danube-admin && echo "built dist/danube"
