#!/usr/bin/env bash
# End-to-end on a real Kubernetes cluster (kind). NOT RUN in this repository's CI or test suite:
# the machines it runs on have no container engine or cluster. Run it by hand where Docker and
# kind exist:
#
#   bash scripts/setup-tools.sh        # helm + kubectl into .tools/bin (or have them on PATH)
#   bash tests/e2e/kind.sh             # KEEP=1 keeps the cluster afterwards
#
# What it does: builds the operator image from the Dockerfile, creates a kind cluster, loads the
# image, installs the Helm chart (monitoring objects off: kind has no prometheus-operator),
# checks the operator pod is Ready (its probes hit kopf's /healthz), applies examples/twin.yaml
# (an LLMDeployment whose "vLLM" is `kneecap twin`, same image), sends load from a pod, and waits
# until the operator has written a recommendation (status.recommendation.maxNumSeqs) and an
# Advised/hold decision Event. Exit 0 on success; on failure it prints the operator's logs and
# the resource's status.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
export PATH="$ROOT/.tools/bin:$PATH"

CLUSTER=${CLUSTER:-kneecap-e2e}
IMAGE=${IMAGE:-kneecap:e2e}
NS_OP=kneecap-system
NS=kneecap-demo
NAME=llama-twin
TIMEOUT_S=${TIMEOUT_S:-600}

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null 2>&1 || { echo "kind.sh: '$tool' is required (helm/kubectl: bash scripts/setup-tools.sh)" >&2; exit 2; }
done

cleanup() {
  if [ "${KEEP:-0}" != 1 ]; then kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; fi
}
diagnose() {
  echo "---- operator logs" >&2
  kubectl -n "$NS_OP" logs deploy/kneecap --tail=200 >&2 || true
  echo "---- $NS/$NAME" >&2
  kubectl -n "$NS" get llmd "$NAME" -o yaml >&2 || true
  kubectl -n "$NS" get pods,events >&2 || true
}
trap 'rc=$?; [ $rc -ne 0 ] && diagnose; cleanup; exit $rc' EXIT

echo "==> build $IMAGE"
docker build -t "$IMAGE" --build-arg REVISION="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" .

echo "==> kind cluster $CLUSTER"
kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --wait 120s
kind load docker-image "$IMAGE" --name "$CLUSTER"

echo "==> helm install"
helm upgrade --install kneecap charts/kneecap -n "$NS_OP" --create-namespace \
  --set image.repository="${IMAGE%%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
  --wait --timeout 180s  # kind serves no monitoring.coreos.com: the chart leaves its monitors out by itself
kubectl -n "$NS_OP" rollout status deploy/kneecap --timeout=120s
kubectl wait --for=condition=Established crd/llmdeployments.kneecap.io --timeout=60s

echo "==> LLMDeployment $NS/$NAME running the twin"
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f -
sed "s#image: ghcr.io/kneecap/kneecap:0.1.0#image: $IMAGE#" examples/twin.yaml | kubectl apply -f -
# the twin's pod takes the operator's image; make kind never pull it
kubectl -n "$NS" wait --for=create deploy/"$NAME" --timeout=120s
kubectl -n "$NS" patch deploy "$NAME" --type=json \
  -p '[{"op":"add","path":"/spec/template/spec/containers/0/imagePullPolicy","value":"Never"}]' || true
kubectl -n "$NS" rollout status deploy/"$NAME" --timeout=180s

echo "==> load"
kubectl -n "$NS" delete pod load --ignore-not-found
kubectl -n "$NS" run load --image="$IMAGE" --image-pull-policy=Never --restart=Never -- \
  load "http://$NAME.$NS.svc:8000" --rate 40 --duration "$TIMEOUT_S" --input-mean 200 --output-mean 300

echo "==> waiting up to ${TIMEOUT_S}s for a recommendation"
deadline=$(( $(date +%s) + TIMEOUT_S ))
while :; do
  cap=$(kubectl -n "$NS" get llmd "$NAME" -o jsonpath='{.status.recommendation.maxNumSeqs}' 2>/dev/null || true)
  if [ -n "$cap" ]; then break; fi
  if [ "$(date +%s)" -ge "$deadline" ]; then echo "kind.sh: no recommendation after ${TIMEOUT_S}s" >&2; exit 1; fi
  sleep 10
done
kubectl -n "$NS" get llmd "$NAME"
echo "recommended --max-num-seqs: $cap"
kubectl -n "$NS" get llmd "$NAME" -o jsonpath='{.status.lastDecision}'; echo
kubectl -n "$NS" get events --field-selector involvedObject.kind=LLMDeployment | tail -5
echo "kind.sh: OK"
