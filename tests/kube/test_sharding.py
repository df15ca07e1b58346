"""Two label-selector shards on the real control plane: two Helm releases of the chart, each with its
own `operator.shardSelector` (``kneecap.io/shard=a``, ``kneecap.io/shard=b``), ServiceAccount and
peering object, run as `kneecap run` with the releases' own arguments (out of process, as in
test_peering.py: kwok runs no pod), each as its release's ServiceAccount with a token of its
own. From the apiserver's audit log: every write to each LLMDeployment and to its Deployment and
Service (creates, status ticks, kopf's finalizer and annotation patches) comes from the one shard
whose selector its labels match; an LLMDeployment neither selects is never written to (no
finalizer either); together the shards cover every labelled one (owned objects, status, and a
deletion each shard lets through by removing its own finalizer).

Relabelling moves a resource: shard a removes its finalizer (kopf's filter no longer matches)
and stops its timer, shard b adds its own and ticks it. A resource that predates the split
(the unsharded operator's ``kneecap.io/finalizer`` on it) has that finalizer released by its shard.
"""

from __future__ import annotations

import copy
import time

import yaml

from kneecap.control.shard import UNSHARDED_FINALIZER, parse_selector
from tests.kube.conftest import RELEASE_NS, helm, kubectl, service_account_kubeconfig, start_chart_operator, tick_writes
from tests.support.control_plane import ControlPlane, audit_time, audit_writes, credential_id
from tests.support.examples import ROOT, llmdeployment

NS = "sharding"
LLMD = "kneecap.io/v1alpha1/llmdeployments"
PEERINGS = "kopf.dev/v1/clusterkopfpeerings"
PEERING_RESOURCES = ("clusterkopfpeerings", "kopfpeerings")
SHARD_LABEL = "kneecap.io/shard"
SHARDS = {"a": "kneecap-shard-a", "b": "kneecap-shard-b"}  # shard -> Helm release (its fullname)
TICK = ["--tick", "0.5"]
OWNED = ("deployments", "services")


def install_shard(plane: ControlPlane, release: str, selector: str) -> dict:
    """`helm install RELEASE charts/kneecap --set-string operator.shardSelector=SELECTOR` (its
    Deployment scaled to 0, as conftest's chart_installed), its manifest as parsed documents."""
    helm(plane, "install", release, str(ROOT / "charts" / "kneecap"), "-n", RELEASE_NS, "--wait=false",
         "--set-string", f"operator.shardSelector={selector}")
    docs = [d for d in yaml.safe_load_all(helm(plane, "get", "manifest", release, "-n", RELEASE_NS).stdout) if d]
    kubectl(plane, "-n", RELEASE_NS, "scale", "deployment", release, "--replicas=0")
    return {"documents": docs}


def resource(name: str, shard: str | None, finalizers: list[str] | None = None) -> dict:
    doc = copy.deepcopy(llmdeployment(ROOT / "examples" / "colocated.yaml"))
    doc["metadata"] = {"name": name, "namespace": NS}
    if shard:
        doc["metadata"]["labels"] = {SHARD_LABEL: shard}
    if finalizers:
        doc["metadata"]["finalizers"] = finalizers
    doc["spec"]["control"].update(interval="1s", window="1s")
    return doc


def finalizers(admin, name: str) -> list[str]:
    return ((admin.get(LLMD, NS, name) or {}).get("metadata") or {}).get("finalizers") or []


def owned(admin, llmd: dict) -> dict[str, str]:
    """{resource: name} of the Deployment and Service the LLMDeployment controls, once both exist."""
    uid, found = llmd["metadata"]["uid"], {}
    for res in OWNED:
        for obj in admin.list(f"{'apps/v1' if res == 'deployments' else 'v1'}/{res}", NS):
            if any(r.get("uid") == uid and r.get("controller") for r in obj["metadata"].get("ownerReferences") or []):
                found[res] = obj["metadata"]["name"]
    return found if set(found) == set(OWNED) else {}


def summary(events: list[dict]) -> list[tuple]:
    return [(e["user"]["username"].rsplit(":", 1)[-1], e["verb"], e["objectRef"].get("resource"),
             e["objectRef"].get("subresource"), e["objectRef"].get("name"), e["responseStatus"]["code"])
            for e in events]


def test_two_shards_split_the_llmdeployments_by_label_and_never_share_one(control_plane: ControlPlane,
                                                                          chart_installed, ns, tmp_path):
    plane, admin = control_plane, control_plane.admin
    selectors = {s: f"{SHARD_LABEL}={s}" for s in SHARDS}
    final = {s: parse_selector(sel).finalizer for s, sel in selectors.items()}
    assert final["a"] != final["b"]
    users = {s: f"system:serviceaccount:{RELEASE_NS}:{rel}" for s, rel in SHARDS.items()}
    charts, creds, ops = {}, {}, {}
    # a1, a2, b1, b2 by label; b3 predates the split (the unsharded operator's finalizer on it);
    # "stray" carries no shard label: neither shard may touch it
    labels = {"a1": "a", "a2": "a", "b1": "b", "b2": "b", "b3": "b", "stray": None}
    mark = plane.audit_mark()
    try:
        for s, release in SHARDS.items():
            charts[s] = install_shard(plane, release, selectors[s])
            kc, creds[s] = service_account_kubeconfig(plane, tmp_path / f"{s}.kubeconfig", RELEASE_NS, release)
            args = next(d for d in charts[s]["documents"] if d["kind"] == "Deployment")[
                "spec"]["template"]["spec"]["containers"][0]["args"]
            assert f"--selector={selectors[s]}" in args and f"--peering={release}" in args
            ops[s] = start_chart_operator(plane, charts[s], kc, tmp_path / f"{s}.log", f"shard-{s}", TICK)
        # each shard elects its leader in its own peering object
        plane.wait_for(lambda: all(set(((admin.get(PEERINGS, None, rel) or {}).get("status") or {})) == {f"shard-{s}"}
                                   for s, rel in SHARDS.items()), 30, "each shard's keep-alive in its own peering")

        created = {}
        for name, shard in labels.items():
            created[name] = admin.create(LLMD, resource(name, shard, [UNSHARDED_FINALIZER] if name == "b3" else None))

        def served(name: str, shard: str, after_s: float | None = None) -> bool:
            events = plane.audit(users[shard], since_line=mark)
            return (len(tick_writes(events, NS, name, after_s)) >= 2 and final[shard] in finalizers(admin, name)
                    and bool(owned(admin, created[name])))

        try:
            plane.wait_for(lambda: all(served(n, s) for n, s in labels.items() if s), 120,
                           "each labelled LLMDeployment's owned objects, finalizer and 2 ticks from its shard")
            plane.wait_for(lambda: finalizers(admin, "b3") == [final["b"]], 30, "b3's unsharded finalizer released")
            owned_names = {n: owned(admin, created[n]) for n, s in labels.items() if s}

            # move a2 to shard b
            relabelled_at = time.time()
            admin.patch(LLMD, NS, "a2", {"metadata": {"labels": {SHARD_LABEL: "b"}}})
            plane.wait_for(lambda: finalizers(admin, "a2") == [final["b"]] and served("a2", "b", relabelled_at),
                           60, "a2 released by shard a, served by shard b")
            # shard a no longer ticks it: 3 ticks of a1 after a2's release, none of a2
            released_at = time.time()
            plane.wait_for(lambda: len(tick_writes(plane.audit(users["a"], since_line=mark), NS, "a1",
                                                   released_at)) >= 3, 30, "3 ticks of a1 after a2 moved")
            assert tick_writes(plane.audit(users["a"], since_line=mark), NS, "a2", released_at) == []

            # the stray one: never touched (checked before its deletion, which needs no operator)
            assert finalizers(admin, "stray") == [] and not owned(admin, created["stray"])
            assert "status" not in admin.get(LLMD, NS, "stray")
            # deletions go through: each shard removes its own finalizer
            for name in labels:
                admin.delete(LLMD, NS, name)
            plane.wait_for(lambda: not admin.list(LLMD, NS), 60, "every LLMDeployment deleted")
        except Exception as exc:
            logs = "\n".join(f"shard {s} log:\n{op.tail(30)}" for s, op in ops.items())
            raise AssertionError(f"{exc}\n{logs}") from None
        deleted_at = time.time()
    finally:
        for op in ops.values():
            op.stop()
        for release in SHARDS.values():
            helm(plane, "uninstall", release, "-n", RELEASE_NS, "--wait=false", check=False)

    events = plane.audit(since_line=mark)
    by_user = {s: [e for e in events if e.get("user", {}).get("username") == users[s]] for s in SHARDS}
    # each shard ran on its own token, and the two on different ones
    assert all(by_user[s] and {credential_id(e) for e in by_user[s]} == {creds[s]} for s in SHARDS)
    assert creds["a"] != creds["b"]
    writes = {s: [e for e in audit_writes(by_user[s], exclude=PEERING_RESOURCES)
                  if e["objectRef"].get("namespace") == NS] for s in SHARDS}
    # what each write was to: the LLMDeployment itself or one it owns
    target = {}
    for name, objs in owned_names.items():
        target[("llmdeployments", name)] = name
        for res, obj_name in objs.items():
            target[(res, obj_name)] = name
    for s in SHARDS:
        for e in writes[s]:
            key = (e["objectRef"].get("resource"), e["objectRef"].get("name"))
            if key[0] == "events":
                continue  # (kopf posts Events under generated names)
            assert key in target, f"shard {s} wrote to something not an LLMDeployment's: {summary([e])}"
            name = target[key]
            if name == "a2" and s == "a":
                # before the move; after it, its release of a2 (kopf's finalizer patch) and the
                # status write of a tick that was in flight at the relabel (below)
                assert audit_time(e) < relabelled_at or (key[0] == "llmdeployments" and e["verb"] == "patch"), \
                    summary([e])
            elif name == "a2":
                assert audit_time(e) >= relabelled_at, summary([e])
            else:
                assert labels[name] == s, f"shard {s} wrote to {name} (shard {labels[name]}): {summary([e])}"
    # a2's release by shard a after the move: a patch of the object itself; at most one tick in
    # flight at the relabel finished after it (kopf stops the timer between ticks), none later
    late_a2 = [e for e in writes["a"] if e["objectRef"].get("name") == "a2" and audit_time(e) >= relabelled_at]
    assert [e for e in late_a2 if e["objectRef"].get("subresource") is None and e["responseStatus"]["code"] < 300]
    assert len([e for e in late_a2 if e["objectRef"].get("subresource") == "status"]) <= 1, summary(late_a2)
    assert all(audit_time(e) < released_at for e in late_a2), summary(late_a2)
    # the stray one: no write from either shard, ever
    assert not [e for s in SHARDS for e in writes[s] if e["objectRef"].get("name") == "stray"]
    # together they cover all: each labelled one's Deployment and Service created by its shard
    # (a2 by a, before the move), its status written, its finalizer removed at deletion
    for name, shard in labels.items():
        if shard is None:
            continue
        mine = [e for e in writes[shard] if target.get((e["objectRef"].get("resource"), e["objectRef"].get("name")))
                == name and e["responseStatus"]["code"] < 300]
        done = {(e["verb"], e["objectRef"]["resource"], e["objectRef"].get("subresource")) for e in mine}
        assert {("create", "deployments", None), ("create", "services", None), ("patch", "llmdeployments", "status"),
                ("patch", "llmdeployments", None)} <= done, (name, sorted(done, key=str))
    assert [e for e in writes["b"] if e["objectRef"].get("name") == "a2" and e["verb"] == "patch"
            and e["objectRef"].get("resource") == "llmdeployments" and audit_time(e) <= deleted_at]
    first_b = min(audit_time(e) for e in writes["b"] if e["objectRef"].get("name") == "a2")
    print(f"shard a: {len(writes['a'])} writes, shard b: {len(writes['b'])} writes in {NS}; a2 relabelled: "
          f"shard a's last write to it {max(audit_time(e) for e in late_a2) - relabelled_at:.2f} s after, shard b's "
          f"first {first_b - relabelled_at:.2f} s after ({summary(late_a2)})")
