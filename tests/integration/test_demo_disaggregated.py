"""The demo's disaggregated pools end to end: the Deployments kneecap renders for a
disaggregated LLMDeployment (their --kv-transfer-config), the twin node's processes, and
the P/D router: each request is prefilled on a prefill twin, its KV read by a decode twin, and
decoded there; no decode starts before its prefill finished."""

from __future__ import annotations

import asyncio


from kneecap.control import reconcile
from kneecap.control.kube import KubeClient
from kneecap.control.spec import parse_spec
from kneecap.emulation.kubeapi import LLMD, KubeAPIThread
from kneecap.demo.twin_node import TwinNode
from kneecap.demo.pd_router import PDRouter
from tests.support.specs import NS, llmd
from tests.support.twins import post_completions

PROMPT_TOKENS, MAX_TOKENS, N = 300, 8, 6


async def test_prefill_kv_decode_through_the_kubelets_twins():
    doc = llmd("pd", topology={"mode": "disaggregated", "prefill": {"min": 1, "max": 2}, "decode": {"min": 1, "max": 2},
                               "kvTransfer": {"connector": "NixlConnector"}})
    with KubeAPIThread() as kube:
        kube.add_namespace(NS)
        owner = kube.create(LLMD, doc)
        client = KubeClient(kube.url)
        try:
            res = await reconcile.reconcile(client, owner, parse_spec(owner["spec"]))
        finally:
            await client.close()
        assert sorted(p.pool.name for p in res.pools) == ["pd-decode", "pd-prefill"]
        router = await PDRouter().start()
        node = TwinNode(kube, NS, time_scale=1.0, on_endpoints=router.on_endpoints)
        stop = asyncio.Event()
        task = asyncio.create_task(node.run(stop))
        try:
            for _ in range(600):
                if router.prefill.endpoints and router.decode.endpoints:
                    break
                assert not task.done(), task.exception()
                await asyncio.sleep(0.1)
            body = {"prompt": " ".join(["knee"] * PROMPT_TOKENS), "max_tokens": MAX_TOKENS}
            answers = await post_completions(router.url, body, N)
            (p_url,), (d_url,) = router.prefill.endpoints, router.decode.endpoints
        finally:
            stop.set()
            await task
            await router.stop()
    assert router.routed == [(p_url, d_url)] * N
    for a in answers:
        t = a["kneecap_timing"]
        assert t["remote_prefill_finish_s"] < t["arrival_s"] <= t["scheduled_s"] < t["finish_s"]
        assert a["usage"]["completion_tokens"] == MAX_TOKENS and a["usage"]["prompt_tokens"] == PROMPT_TOKENS
