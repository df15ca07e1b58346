#!/usr/bin/env bash
# Builds the real Kubernetes control plane the cluster tests run on, from the Go module proxy:
#   kube-apiserver, kube-controller-manager, kube-scheduler   k8s.io/kubernetes  (scripts/kube/kubernetes)
#   etcd                                                      go.etcd.io/etcd/server/v3 (scripts/kube/etcd)
#   kwok (fake nodes: registers nothing itself, moves bound    sigs.k8s.io/kwok   (scripts/kube/kwok)
#         pods on kwok-managed nodes to Running with an IP)
# into $KNEECAP_KUBE_DIR (default .tools/kube)/bin. Each scripts/kube/*/go.mod pins one release
# (kubernetes' own staging `replace` block rewritten to the matching v0.x releases) with its
# go.sum, so the build is the same on every machine. A bin/ whose VERSIONS stamp matches the pins,
# the Go version and the go.sum files is kept: the build is skipped.
#
# From scratch on a 2-core machine the build takes about 16 min (modules ~1 min, kube binaries
# ~13 min, etcd ~1 min, kwok ~1 min; measured figures in tests/README.md) and leaves ~250 MB of
# binaries; Go's module and build caches (~/go, ~/.cache/go-build) take ~3 GB and make a rebuild
# after a version bump incremental.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DIR="${KNEECAP_KUBE_DIR:-$ROOT/.tools/kube}"
BIN="$DIR/bin"
SRC="$ROOT/scripts/kube"
K8S_VERSION=v1.37.2     # the pinned release; the chart's kubeVersion floor is checked by scripts/check-crd-oldest.sh
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0

fail() { echo "setup-kube: ERROR: $*" >&2; exit 1; }
say() { echo "setup-kube: $*"; }

command -v go >/dev/null 2>&1 || fail "go not found: the control plane is built with Go >= 1.26 (https://go.dev/doc/install)"
GO_VERSION=$(go env GOVERSION)
for mod in kubernetes etcd kwok; do
  [ -f "$SRC/$mod/go.mod" ] && [ -f "$SRC/$mod/go.sum" ] || fail "scripts/kube/$mod/go.mod or go.sum missing"
done
grep -q "k8s.io/kubernetes $K8S_VERSION" "$SRC/kubernetes/go.mod" || fail "scripts/kube/kubernetes/go.mod does not pin $K8S_VERSION"
grep -q "go.etcd.io/etcd/server/v3 $ETCD_VERSION" "$SRC/etcd/go.mod" || fail "scripts/kube/etcd/go.mod does not pin $ETCD_VERSION"
grep -q "sigs.k8s.io/kwok $KWOK_VERSION" "$SRC/kwok/go.mod" || fail "scripts/kube/kwok/go.mod does not pin $KWOK_VERSION"

stamp() {
  echo "kubernetes $K8S_VERSION"
  echo "etcd $ETCD_VERSION"
  echo "kwok $KWOK_VERSION"
  echo "go $GO_VERSION $(go env GOOS)/$(go env GOARCH)"
  cat "$SRC"/{kubernetes,etcd,kwok}/go.mod "$SRC"/{kubernetes,etcd,kwok}/go.sum | sha256sum | cut -d' ' -f1
}
WANT=$(stamp)
BINARIES="kube-apiserver kube-controller-manager kube-scheduler etcd kwok"
have_all() { for b in $BINARIES; do [ -x "$BIN/$b" ] || return 1; done; }
if have_all && [ -f "$DIR/VERSIONS" ] && [ "$(cat "$DIR/VERSIONS")" = "$WANT" ]; then
  say "control plane already built in $BIN ($K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION)"
  exit 0
fi

mkdir -p "$BIN"
rm -f "$DIR/VERSIONS"
export GOFLAGS=-mod=readonly GOTOOLCHAIN=local
LD="-s -w"
# what kubernetes' hack/lib/version.sh stamps, so /version (and helm's kubeVersion check) reads the release
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LD="$LD -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$(echo "$K8S_VERSION" | cut -d. -f1 | tr -d v)"
  LD="$LD -X $pkg.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2) -X $pkg.gitTreeState=clean"
done

t0=$SECONDS
say "building kube-apiserver, kube-controller-manager, kube-scheduler $K8S_VERSION (go $GO_VERSION)"
(cd "$SRC/kubernetes" && go build -trimpath -ldflags "$LD" -o "$BIN/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler) \
  || fail "go build of k8s.io/kubernetes $K8S_VERSION failed (see above)"
t1=$SECONDS
say "building etcd $ETCD_VERSION"
(cd "$SRC/etcd" && go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3) \
  || fail "go build of go.etcd.io/etcd/server/v3 $ETCD_VERSION failed (see above)"
t2=$SECONDS
say "building kwok $KWOK_VERSION"
(cd "$SRC/kwok" && go build -trimpath -ldflags "-s -w" -o "$BIN/kwok" sigs.k8s.io/kwok/cmd/kwok) \
  || fail "go build of sigs.k8s.io/kwok $KWOK_VERSION failed (see above)"
t3=$SECONDS

for b in $BINARIES; do [ -x "$BIN/$b" ] || fail "$b was not built"; done
"$BIN/kube-apiserver" --version | grep -q "$K8S_VERSION" || fail "kube-apiserver --version does not say $K8S_VERSION"
echo "$WANT" > "$DIR/VERSIONS"
say "built in $((t3 - t0)) s (kubernetes $((t1 - t0)) s, etcd $((t2 - t1)) s, kwok $((t3 - t2)) s); $(du -sh "$BIN" | cut -f1) in $BIN"
