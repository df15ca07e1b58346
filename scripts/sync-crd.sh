#!/usr/bin/env bash
# Copies the CRD (crds/llmdeployment.yaml, the single source) into the Helm chart's crds/ folder.
# tests/unit/test_ship_chart.py fails when the two differ by a single byte.
set -euo pipefail
cd "$(dirname "$0")/.."
cp crds/llmdeployment.yaml charts/kneecap/crds/llmdeployment.yaml
echo "sync-crd: charts/kneecap/crds/llmdeployment.yaml <- crds/llmdeployment.yaml"
