#!/usr/bin/env bash
# Copies the CRD (crds/llmdeployment.yaml, the single source) into the Helm chart's crds/ folder
# and into the Python package (operator/kneecap/crds/, read by kneecap.control.spec from the wheel).
# tests/unit/test_ship_chart.py and tests/unit/test_ship_package.py fail when a copy differs by a byte.
set -euo pipefail
cd "$(dirname "$0")/.."
for dest in charts/kneecap/crds/llmdeployment.yaml operator/kneecap/crds/llmdeployment.yaml; do
  mkdir -p "$(dirname "$dest")"
  cp crds/llmdeployment.yaml "$dest"
  echo "sync-crd: $dest <- crds/llmdeployment.yaml"
done
