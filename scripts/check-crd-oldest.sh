#!/usr/bin/env bash
# The CRD on the oldest Kubernetes minor the chart's kubeVersion claims (>=1.30): builds
# kube-apiserver v1.30.14 from the Go module proxy (scripts/kube/kubernetes-oldest: pinned go.mod
# and go.sum, staging modules at v0.30.14) into .tools/kube-oldest/bin (skipped when built), then
# runs scripts/check-crd-oldest.py, which writes benchmarks/results/crd_oldest_kubernetes.md.
# Outside the default suite: the build takes ~15 min on 2 cores. Needs scripts/setup.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=v1.30.14
BIN=.tools/kube-oldest/bin
grep -q "k8s.io/kubernetes $VERSION" scripts/kube/kubernetes-oldest/go.mod || { echo "check-crd-oldest: go.mod does not pin $VERSION" >&2; exit 1; }
if ! [ -x "$BIN/kube-apiserver" ] || ! "$BIN/kube-apiserver" --version | grep -q "$VERSION"; then
  mkdir -p "$BIN"
  LD="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LD="$LD -X $pkg.gitVersion=$VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=30 -X $pkg.gitTreeState=clean"
  done
  (cd scripts/kube/kubernetes-oldest && GOFLAGS=-mod=readonly GOTOOLCHAIN=local \
    go build -trimpath -ldflags "$LD" -o "$(pwd)/../../../$BIN/" k8s.io/kubernetes/cmd/kube-apiserver)
fi
.venv/bin/python scripts/check-crd-oldest.py "$BIN/kube-apiserver"
