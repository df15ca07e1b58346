#!/usr/bin/env python3
"""The CRD and the examples on the oldest Kubernetes minor the chart claims (Chart.yaml kubeVersion).

Starts etcd and the given kube-apiserver (scripts/check-crd-oldest.sh builds v1.30.14) on
loopback, applies crds/llmdeployment.yaml server-side, checks it Established, runs every example
through `kubectl apply --server-side --dry-run=server`, and checks that a garbage quantity and a
managed flag are refused naming the field, and
the placement rules (spec.placement's CEL) refuse and accept as they should. Prints a table and writes
benchmarks/results/crd_oldest_kubernetes.md.
Usage: .venv/bin/python scripts/check-crd-oldest.py APISERVER_BINARY
"""

from __future__ import annotations

import copy
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.control_plane import ControlPlane  # noqa: E402
from tests.support.examples import EXAMPLES, llmdeployment  # noqa: E402
from tests.support.tools import tool  # noqa: E402

LLMD = "kneecap.io/v1alpha1/llmdeployments"


def main(argv: list[str]) -> int:
    apiserver = Path(argv[0]).resolve()
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        plane = ControlPlane(Path(tmp), apiserver=apiserver).start(api_only=True)
        try:
            admin = plane.admin
            version = admin.request("GET", "/version")[1]["gitVersion"]

            def kubectl(*args: str) -> subprocess.CompletedProcess:
                return subprocess.run([tool("kubectl"), f"--kubeconfig={plane.kubeconfig}", *args],
                                      capture_output=True, text=True, timeout=120)

            applied = kubectl("apply", "--server-side", "-f", str(ROOT / "crds" / "llmdeployment.yaml"))
            rows.append(("CRD applied", "accepted" if applied.returncode == 0 else applied.stderr.strip()))
            crd = None
            for _ in range(100):
                crd = admin.get("apiextensions.k8s.io/v1/customresourcedefinitions", None, "llmdeployments.kneecap.io")
                if crd and any(c["type"] == "Established" and c["status"] == "True"
                               for c in (crd.get("status") or {}).get("conditions") or []):
                    break
                time.sleep(0.2)
            conditions = {c["type"]: c["status"] for c in ((crd or {}).get("status") or {}).get("conditions") or []}
            rows.append(("CRD conditions", ", ".join(f"{k}={v}" for k, v in sorted(conditions.items()))))
            for path in EXAMPLES:
                admin.add_namespace(llmdeployment(path)["metadata"]["namespace"])
                out = kubectl("apply", "--server-side", "--dry-run=server", "-f", str(path))
                rows.append((f"examples/{path.name}", "accepted (server dry run)" if out.returncode == 0
                             else out.stderr.strip().replace("\n", " ")))
            base = copy.deepcopy(llmdeployment(ROOT / "examples" / "colocated.yaml"))
            admin.add_namespace("oldest")
            refused = (("garbage quantity", lambda s: s["engine"].update(resources={"limits": {"nvidia.com/gpu": "one"}})),
                       ("managed flag", lambda s: s["engine"].update(extraArgs=["--max-num-seqs=8"])),
                       ("tensor-parallel flag", lambda s: s["engine"].update(extraArgs=["-tp", "2"])),
                       ("tensorParallelSize vs accelerator.count", lambda s: s["engine"].update(tensorParallelSize=2)),
                       ("time-slicing placement without resourceName",
                        lambda s: s.update(placement={"mechanism": "time-slicing"})),
                       ("dra placement without resourceClaimName", lambda s: s.update(placement={"mechanism": "dra"})))
            accepted = (("mps placement with its resource",
                         lambda s: s.update(placement={"mechanism": "mps", "resourceName": "nvidia.com/gpu.shared",
                                                       "replicasPerGpu": 2})),)
            for what, mutate in refused + accepted:
                obj = copy.deepcopy(base)
                obj["metadata"] = {"name": "hostile", "namespace": "oldest"}
                mutate(obj["spec"])
                code, body = admin.request("POST", admin.path(LLMD, "oldest") + "?dryRun=All", obj)
                fields = [c["field"] for c in (body.get("details") or {}).get("causes") or []] if isinstance(body, dict) else []
                rows.append((what, f"HTTP {code} {', '.join(fields)}".strip()))
        finally:
            plane.stop()
    text = [f"# The CRD on the oldest Kubernetes minor the chart claims: kube-apiserver {version}", "",
            "`scripts/check-crd-oldest.sh` (etcd + kube-apiserver built from the Go module proxy).", "",
            "| check | result |", "| --- | --- |"] + [f"| {a} | {b} |" for a, b in rows]
    print("\n".join(text))
    out = ROOT / "benchmarks" / "results" / "crd_oldest_kubernetes.md"
    out.write_text("\n".join(text) + "\n")
    ok = rows[0][1] == "accepted" and "Established=True" in rows[1][1] and all(
        "accepted" in r[1] for r in rows[2:2 + len(EXAMPLES)]) and all(
        r[1].startswith("HTTP 422") for r in rows[-len(refused) - len(accepted):-len(accepted)]) and all(
        r[1].startswith("HTTP 201") for r in rows[-len(accepted):])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
