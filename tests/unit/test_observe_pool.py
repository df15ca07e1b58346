"""Pool aggregation over pods, and Observation <-> Kubernetes status dicts."""

from __future__ import annotations

import json

import pytest

from kneecap.observe import NoObservation, Observation, from_status, observe, observe_pool, parse_metrics, to_status
from tests.support.capture_windows import T0, T1, zeroed
from tests.support.data import read_capture


def _pair(name, url, t0=T0, t1=T1, edit=lambda t: t):
    text = read_capture(name)
    return parse_metrics(zeroed(text), t_s=t0, url=url), parse_metrics(edit(text), t_s=t1, url=url)


def test_pool_of_two_pods():
    a = _pair("vllm-0.32-cpu-20req.txt", "http://a/metrics")
    b = _pair("vllm-0.32-cpu-run4.txt", "http://b/metrics", t0=T0, t1=T0 + 20)
    res = observe_pool([a, b])
    o = res.observation
    assert isinstance(o, Observation) and res.excluded == {}
    assert o.pods == 2
    assert o.finished_requests == 64
    # rates add, each over its own window: 20/10 + 44/20
    assert o.request_rate_rps == pytest.approx(2.0 + 2.2)
    assert o.generation_tok_s == pytest.approx(848 / 10 + 10448 / 20)
    assert o.prompt_tokens == 372 + 1660
    # means weighted by request counts
    assert o.input_len_mean == pytest.approx((372 + 1660) / 64)
    assert o.output_len_mean == pytest.approx((848 + 10448) / 64)
    assert o.ttft_mean_s == pytest.approx((4.1649415493011475 + 17.630914211273193) / 64)
    assert o.itl_mean_s == pytest.approx((3.5062735290001683 + 17.536895548998473) / (828 + 10404))
    # p95 of the merged prompt buckets: <=10: 4+4, <=20: 14+14, <=50: 20+30, <=100: 20+44
    # rank 60.8 in (50, 100]: 50 + 50*(60.8-50)/14
    assert o.input_len_p95 == pytest.approx(50 + 50 * 10.8 / 14)
    # TTFT merged: <=0.5: 20+28=48, <=0.75: 20+36=56, <=1.0: 56, <=2.5: 64 -> 1 + 1.5*(60.8-56)/8
    assert o.ttft_p95_s == pytest.approx(1 + 1.5 * 4.8 / 8)
    # per-pod quantities average over pods
    assert o.kv_capacity_tokens == 8192 * 128
    assert o.mean_batch_little == pytest.approx((3.754939081000316 / 10 + 17.967977563999625 / 20) / 2)
    assert o.window_s == pytest.approx(15.0)


def test_pool_of_one_equals_the_pod():
    a = _pair("vllm-0.32-cpu-kv-saturated.txt", "http://a/metrics")
    assert observe_pool([a]).observation == observe(*a)


def test_broken_pod_is_excluded_and_named():
    good = _pair("vllm-0.32-cpu-20req.txt", "http://a/metrics")
    text = read_capture("vllm-0.32-cpu-run4.txt")
    cut = text[: text.index("vllm:time_to_first_token_seconds_sum") + 10]
    bad = (parse_metrics(zeroed(text), t_s=T0, url="http://b/metrics"), parse_metrics(cut, t_s=T1, url="http://b/metrics"))
    res = observe_pool([good, bad])
    assert res.observation == observe(*good)
    assert set(res.excluded) == {"http://b/metrics"}
    assert res.excluded["http://b/metrics"].reason.value == "truncated"


def test_all_pods_idle_is_idle():
    text = read_capture("vllm-0.32-cpu-20req.txt")
    p = (parse_metrics(text, t_s=T0), parse_metrics(text, t_s=T1))
    res = observe_pool([p, p])
    assert isinstance(res.observation, NoObservation) and res.observation.code == "idle"
    assert res.excluded == {}


def test_no_pods():
    assert observe_pool([]).observation.code == "no_pods"


def test_status_round_trip():
    o = observe(*_pair("vllm-0.32-cpu-20req.txt", "u"))
    d = to_status(o)
    assert d["requestsPerSecond"] == 2.0 and d["ttftP95Seconds"] == pytest.approx(0.46875)
    assert d["kvCapacityTokens"] == 1048576
    assert d["inputLengthCoefficientOfVariation"] == pytest.approx(o.input_len_cv)
    assert all("_" not in k for k in d)
    back = from_status(json.loads(json.dumps(d)))
    assert back == o
    # status.workload as an earlier version wrote it (abbreviated CV keys) reads the same
    earlier = {k.replace("CoefficientOfVariation", "CV"): v for k, v in d.items()}
    assert "inputLengthCV" in earlier and from_status(earlier) == o


def test_status_omits_none_and_restores_it():
    def drop(t: str) -> str:
        return "\n".join(x for x in t.split("\n") if "vllm:cache_config_info" not in x)

    o = observe(*_pair("vllm-0.32-cpu-20req.txt", "u", edit=drop))
    assert o.kv_capacity_tokens is None
    d = to_status(o)
    assert "kvCapacityTokens" not in d
    assert from_status(d) == o


def test_status_bad_input_names_the_key():
    d = to_status(observe(*_pair("vllm-0.32-cpu-20req.txt", "u")))
    with pytest.raises(ValueError, match=r"observation\.ttftP95Seconds: expected a finite number"):
        from_status({**d, "ttftP95Seconds": "fast"})
    with pytest.raises(ValueError, match=r"unknown keys \['bogus'\]"):
        from_status({**d, "bogus": 1})
    missing = dict(d)
    del missing["windowSeconds"]
    with pytest.raises(ValueError, match=r"observation\.windowSeconds: missing"):
        from_status(missing)


def test_pool_takes_intermediate_gauge_samples():
    prev, cur = _pair("vllm-0.32-cpu-20req.txt", "http://a/metrics")
    text = read_capture("vllm-0.32-cpu-20req.txt").replace(
        'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0',
        'vllm:num_requests_running{engine="0",model_name="tiny"} 3.0',
    )
    mid = parse_metrics(text, t_s=T0 + 5)
    o = observe_pool([(prev, cur, [mid]), (prev, cur)]).observation
    assert o.mean_batch == pytest.approx((1.0 + 0.0) / 2)  # pod a: (0+3+0)/3, pod b: 0
    assert o.max_batch == 3 and o.batch_samples == 5
