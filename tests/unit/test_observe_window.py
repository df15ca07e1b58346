"""Parsing and window observations on the real vLLM 0.32 captures, and every robustness case
(reset, rename, multi-engine, idle, NaN/garbage, truncated) built from them by text edits.

Each capture is cumulative since its server started; its window is taken from a copy with
every vLLM counter, histogram and gauge zeroed (a freshly started server, same series) to the
capture, 10 s later. Expected values were read off the files by hand (bucket counts quoted).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from kneecap.observe import NoObservation, Observation, Reason, observe, parse_metrics
from kneecap.observe import window as window_module
from kneecap.observe.histogram import Histogram
from tests.support.capture_windows import CAPTURES, T0, T1, cut_inside, zeroed
from tests.support.data import read_capture

def window(name: str, edit=lambda t: t, edit_prev=None):
    text = read_capture(name)
    prev_text = zeroed(text)
    prev = parse_metrics((edit_prev or edit)(prev_text), t_s=T0)
    cur = parse_metrics(edit(text), t_s=T1)
    return observe(prev, cur)


def uniform_cv(edges_counts: list[tuple[float, float, float]]) -> float:
    """CV of a histogram with mass uniform inside each (lo, hi] bucket: [(lo, hi, count)]."""
    n = sum(c for _, _, c in edges_counts)
    m1 = sum(c * (lo + hi) / 2 for lo, hi, c in edges_counts) / n
    m2 = sum(c * (lo * lo + lo * hi + hi * hi) / 3 for lo, hi, c in edges_counts) / n
    return math.sqrt(m2 - m1 * m1) / m1


# --- exact values on every capture ----------------------------------------------------------
def test_capture_20req():
    o = window("vllm-0.32-cpu-20req.txt")
    assert isinstance(o, Observation), o
    assert o.window_s == 10.0 and o.pods == 1
    assert o.finished_requests == 20  # request_success_total{finished_reason="length"} 20
    assert o.request_rate_rps == 2.0
    assert o.prompt_tokens == 372 and o.generation_tokens == 848
    assert o.prompt_tok_s == pytest.approx(37.2) and o.generation_tok_s == pytest.approx(84.8)
    assert o.input_len_mean == pytest.approx(372 / 20) and o.output_len_mean == pytest.approx(848 / 20)
    # prompt buckets: <=10: 4, <=20: 14, <=50: 20 -> rank 19 in (20, 50]: 20 + 30*(19-14)/6
    assert o.input_len_p95 == pytest.approx(45.0)
    assert o.input_len_cv == pytest.approx(uniform_cv([(5, 10, 4), (10, 20, 10), (20, 50, 6)]))
    # generation buckets: <=20: 6, <=50: 12, <=100: 20 -> 50 + 50*(19-12)/8
    assert o.output_len_p95 == pytest.approx(93.75)
    assert o.output_len_cv == pytest.approx(uniform_cv([(10, 20, 6), (20, 50, 6), (50, 100, 8)]))
    # TTFT: sum 4.1649415493011475; <=0.1: 0, <=0.25: 12, <=0.5: 20 -> 0.25 + 0.25*7/8
    assert o.ttft_mean_s == pytest.approx(4.1649415493011475 / 20)
    assert o.ttft_p95_s == pytest.approx(0.46875)
    # ITL: 828 samples, sum 3.5062735290001683, <=0.01: 802 -> 0.01 * 786.6/802
    assert o.itl_mean_s == pytest.approx(3.5062735290001683 / 828)
    assert o.itl_p95_s == pytest.approx(0.01 * 0.95 * 828 / 802)
    assert o.tpot_mean_s == pytest.approx(0.08257322100496885 / 20)
    assert o.tpot_p95_s == pytest.approx(0.0095)  # all 20 in (0, 0.01]
    # E2E: sum 7.600830316543579; <=0.3: 7, <=0.5: 15, <=0.8: 20 -> 0.5 + 0.3*4/5
    assert o.e2e_mean_s == pytest.approx(7.600830316543579 / 20)
    assert o.e2e_p95_s == pytest.approx(0.74)
    # each p95's floor: the lower edge of the bucket its rank falls in (the least it can be)
    assert (o.ttft_p95_floor_s, o.itl_p95_floor_s, o.tpot_p95_floor_s, o.e2e_p95_floor_s) == (0.25, 0.0, 0.0, 0.5)
    # the share of requests surely past an SLO: none observed without targets; TTFT 0.25 s (an
    # edge) 8 of 20; E2E 0.5 s 5 of 20; TPOT 10 ms none; together the most of any one
    assert o.slo_missed_fraction is None
    d = window_module.window_deltas(parse_metrics(zeroed(read_capture("vllm-0.32-cpu-20req.txt")), t_s=T0),
                                    parse_metrics(read_capture("vllm-0.32-cpu-20req.txt"), t_s=T1))
    share = lambda **targets: window_module.combine([d], targets).slo_missed_fraction  # noqa: E731
    assert share(ttft=0.25) == pytest.approx(8 / 20) and share(e2e=0.5, tpot=0.01) == pytest.approx(5 / 20)
    assert share(ttft=0.25, e2e=0.5, tpot=None) == pytest.approx(8 / 20) and share(tpot=0.01) == 0.0
    assert share(ttft=None) is None
    assert o.queue_time_mean_s == pytest.approx(2.2316796289998706 / 20)
    assert o.queue_time_p95_s == pytest.approx(0.3)  # <=0.3: 19 of 20
    assert o.prefill_time_mean_s == pytest.approx(0.24866555200014773 / 20)
    assert o.prefill_time_p95_s == pytest.approx(0.285)
    assert o.decode_time_mean_s == pytest.approx(3.5062735290001683 / 20)
    assert o.mean_batch_little == pytest.approx(3.754939081000316 / 10)
    assert o.preemptions == 0
    assert o.mean_batch == 0 and o.max_batch == 0 and o.queue_len == 0 and o.kv_usage == 0
    # cache_config_info: num_gpu_blocks="8192", block_size="128", gpu_memory_utilization="0.92"
    assert o.kv_capacity_tokens == 8192 * 128
    assert o.gpu_memory_utilization == 0.92
    assert o.kv_cache_memory_bytes == 1073741824


def test_capture_kv_saturated():
    o = window("vllm-0.32-cpu-kv-saturated.txt")
    assert isinstance(o, Observation), o
    assert o.finished_requests == 44 and o.request_rate_rps == pytest.approx(4.4)
    assert o.prompt_tokens == 1660 and o.generation_tokens == 10448
    assert o.input_len_mean == pytest.approx(1660 / 44) and o.output_len_mean == pytest.approx(10448 / 44)
    # prompt: <=20: 14, <=50: 30, <=100: 44 -> rank 41.8: 50 + 50*11.8/14
    assert o.input_len_p95 == pytest.approx(50 + 50 * 11.8 / 14)
    # generation: <=200: 20, <=500: 44 -> 200 + 300*21.8/24
    assert o.output_len_p95 == pytest.approx(200 + 300 * 21.8 / 24)
    # TTFT: sum 64.56146693229675; <=5.0: 40, <=7.5: 44 -> 5 + 2.5*1.8/4
    assert o.ttft_mean_s == pytest.approx(64.56146693229675 / 44)
    assert o.ttft_p95_s == pytest.approx(6.125)
    assert o.itl_mean_s == pytest.approx(31.47763643100052 / 10404)
    assert o.e2e_mean_s == pytest.approx(96.0290310382843 / 44)
    assert o.queue_time_mean_s == pytest.approx(63.65650862099949 / 44)
    assert o.preemptions == 43  # num_preemptions_total 43
    assert o.kv_capacity_tokens == 8 * 128  # num_gpu_blocks="8" (--num-gpu-blocks-override 8)


def test_capture_run4():
    o = window("vllm-0.32-cpu-run4.txt")
    assert isinstance(o, Observation), o
    assert o.finished_requests == 44 and o.prompt_tokens == 1660 and o.generation_tokens == 10448
    # TTFT: sum 17.630914211273193; <=1.0: 36, <=2.5: 44 -> 1 + 1.5*5.8/8
    assert o.ttft_mean_s == pytest.approx(17.630914211273193 / 44)
    assert o.ttft_p95_s == pytest.approx(1 + 1.5 * 5.8 / 8)
    assert o.itl_mean_s == pytest.approx(17.536895548998473 / 10404)
    assert o.tpot_mean_s == pytest.approx(0.07354584758880367 / 44)
    assert o.e2e_mean_s == pytest.approx(35.16685485839844 / 44)
    assert o.prefill_time_mean_s == pytest.approx(0.4310820150011523 / 44)
    assert o.mean_batch_little == pytest.approx(17.967977563999625 / 10)
    assert o.preemptions == 0 and o.kv_capacity_tokens == 8192 * 128


@pytest.mark.parametrize("name", CAPTURES)
def test_every_capture_parses_clean(name):
    snap = parse_metrics(read_capture(name), t_s=T1)
    assert not snap.truncated and snap.invalid == frozenset() and snap.dropped_family is None
    assert snap.value("vllm:num_requests_running") == 0
    assert len(snap.get("vllm:request_prompt_tokens_bucket")) == 10
    assert snap.process_start_s is not None


# --- robustness -----------------------------------------------------------------------------
def _fields(o: Observation) -> dict:
    return {k: v for k, v in o.__dict__.items()}


def test_renamed_metrics_read_the_same():
    def old_names(t: str) -> str:
        return t.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc").replace(
            "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"
        )

    new = window("vllm-0.32-cpu-20req.txt")
    old = window("vllm-0.32-cpu-20req.txt", old_names)
    assert isinstance(old, Observation)
    assert old == new


def _two_engines(t: str) -> str:
    out = []
    for line in t.split("\n"):
        out.append(line)
        if 'engine="0"' in line and not line.startswith("#"):
            out.append(line.replace('engine="0"', 'engine="1"'))
    return "\n".join(out)


def test_two_engines_add_up():
    one = window("vllm-0.32-cpu-20req.txt")
    two = window("vllm-0.32-cpu-20req.txt", _two_engines)
    assert isinstance(two, Observation)
    assert two.finished_requests == 40 and two.prompt_tokens == 744 and two.generation_tokens == 1696
    assert two.request_rate_rps == 4.0
    assert two.input_len_mean == pytest.approx(one.input_len_mean)
    assert two.input_len_p95 == pytest.approx(one.input_len_p95)
    assert two.ttft_p95_s == pytest.approx(one.ttft_p95_s) and two.itl_mean_s == pytest.approx(one.itl_mean_s)
    assert two.kv_capacity_tokens == 2 * 8192 * 128


def test_engine_appearing_is_series_changed():
    o = window("vllm-0.32-cpu-20req.txt", lambda t: t, edit_prev=lambda t: _two_engines(t))
    assert isinstance(o, NoObservation) and o.reason is Reason.SERIES_CHANGED


def test_process_restart_is_counter_reset():
    big = read_capture("vllm-0.32-cpu-kv-saturated.txt")
    small = read_capture("vllm-0.32-cpu-20req.txt")
    o = observe(parse_metrics(big, t_s=T0), parse_metrics(small, t_s=T1))
    assert isinstance(o, NoObservation)
    assert o.code == "counter_reset:process restarted"


def test_counter_going_down_is_counter_reset():
    # no restart marker left (start time and *_created lines removed): the decrease itself tells
    def strip(t: str) -> str:
        return "\n".join(
            x for x in t.split("\n") if "process_start_time_seconds" not in x and "_created" not in x.split(" ")[0]
        )

    big = strip(read_capture("vllm-0.32-cpu-kv-saturated.txt"))
    small = strip(read_capture("vllm-0.32-cpu-20req.txt"))
    o = observe(parse_metrics(big, t_s=T0), parse_metrics(small, t_s=T1))
    assert isinstance(o, NoObservation)
    assert o.code == "counter_reset:vllm:request_success_total"


def test_created_timestamp_change_is_counter_reset():
    text = read_capture("vllm-0.32-cpu-20req.txt")
    later = text.replace(
        'vllm:request_success_created{engine="0",finished_reason="length",model_name="tiny"} 1.796009202647013e+09',
        'vllm:request_success_created{engine="0",finished_reason="length",model_name="tiny"} 1.796009999e+09',
    )
    assert later != text
    o = observe(parse_metrics(text, t_s=T0), parse_metrics(later, t_s=T1))
    assert isinstance(o, NoObservation) and o.reason is Reason.COUNTER_RESET


def test_idle_window():
    text = read_capture("vllm-0.32-cpu-20req.txt")
    o = observe(parse_metrics(text, t_s=T0), parse_metrics(text, t_s=T1))
    assert isinstance(o, NoObservation) and o.code == "idle"


def test_work_without_finished_requests():
    text = read_capture("vllm-0.32-cpu-20req.txt")
    busy = text.replace(
        'vllm:generation_tokens_total{engine="0",model_name="tiny"} 848.0',
        'vllm:generation_tokens_total{engine="0",model_name="tiny"} 900.0',
    ).replace(
        'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0',
        'vllm:num_requests_running{engine="0",model_name="tiny"} 3.0',
    )
    o = observe(parse_metrics(text, t_s=T0), parse_metrics(busy, t_s=T1))
    assert isinstance(o, NoObservation) and o.reason is Reason.NO_FINISHED


def test_non_positive_window():
    text = read_capture("vllm-0.32-cpu-20req.txt")
    o = observe(parse_metrics(zeroed(text), t_s=T1), parse_metrics(text, t_s=T1))
    assert isinstance(o, NoObservation) and o.reason is Reason.BAD_WINDOW


def test_nan_in_needed_gauge_is_invalid():
    def nan_kv(t: str) -> str:
        return t.replace(
            'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.0',
            'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} NaN',
        )

    o = window("vllm-0.32-cpu-20req.txt", nan_kv)
    assert isinstance(o, NoObservation)
    assert o.code == "invalid_value:vllm:kv_cache_usage_perc"


def test_nan_in_histogram_sum_is_invalid():
    def nan_sum(t: str) -> str:
        return re.sub(r"(vllm:request_prompt_tokens_sum\{[^}]*\}) \S+", r"\1 NaN", t)

    o = window("vllm-0.32-cpu-20req.txt", nan_sum)
    assert isinstance(o, NoObservation) and o.code == "invalid_value:vllm:request_prompt_tokens_sum"


def test_nan_and_garbage_in_unneeded_lines_are_ignored():
    def dirty(t: str) -> str:
        t = t.replace(
            'vllm:estimated_flops_per_gpu_total{engine="0",model_name="tiny"} 0.0',
            'vllm:estimated_flops_per_gpu_total{engine="0",model_name="tiny"} NaN',
        )
        t = t.replace("# HELP vllm:num_requests_running", 'garbage{{ line "with no value\n# HELP vllm:num_requests_running')
        return t + "vllm:half_written_metric{engine=\n"

    clean = window("vllm-0.32-cpu-20req.txt")
    o = window("vllm-0.32-cpu-20req.txt", dirty)
    assert isinstance(o, Observation)
    assert o == clean
    snap = parse_metrics(dirty(read_capture("vllm-0.32-cpu-20req.txt")))
    assert {"garbage", "vllm:half_written_metric", "vllm:estimated_flops_per_gpu_total"} <= snap.invalid


def test_garbage_value_is_dropped_not_misread():
    def bad(t: str) -> str:
        return t.replace(
            'vllm:prompt_tokens_total{engine="0",model_name="tiny"} 372.0',
            'vllm:prompt_tokens_total{engine="0",model_name="tiny"} 37two',
        )

    o = window("vllm-0.32-cpu-20req.txt", bad, edit_prev=lambda t: t)
    assert isinstance(o, NoObservation) and o.code == "invalid_value:vllm:prompt_tokens_total"


def test_inconsistent_histogram_is_invalid():
    def bad(t: str) -> str:  # +Inf bucket says 19, count says 20
        return t.replace(
            'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 20.0',
            'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 19.0',
        )

    o = window("vllm-0.32-cpu-20req.txt", bad, edit_prev=lambda t: t)
    assert isinstance(o, NoObservation) and o.reason is Reason.INVALID_VALUE


def test_body_cut_inside_a_needed_histogram_is_truncated():
    text = read_capture("vllm-0.32-cpu-20req.txt")
    cut = cut_inside(text, 'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5"')
    snap = parse_metrics(cut)
    assert snap.truncated and snap.dropped_family == "vllm:time_to_first_token_seconds"
    assert snap.get("vllm:time_to_first_token_seconds_bucket") is None  # not a partial histogram
    o = observe(parse_metrics(zeroed(text), t_s=T0), parse_metrics(cut, t_s=T1))
    assert isinstance(o, NoObservation)
    assert o.reason is Reason.TRUNCATED


def test_body_cut_inside_a_counter_family_drops_it():
    text = _two_engines(read_capture("vllm-0.32-cpu-20req.txt"))
    # cut after engine 0's line, inside engine 1's: a sum over engines would be half the truth
    cut = cut_inside(text, 'vllm:prompt_tokens_total{engine="1"')
    snap = parse_metrics(cut)
    assert snap.truncated and snap.get("vllm:prompt_tokens_total") is None


def test_body_cut_in_trailing_unneeded_lines_still_observes():
    text = read_capture("vllm-0.32-cpu-20req.txt")
    cut = cut_inside(text, "http_request_duration_seconds_bucket{", 30)
    o = observe(parse_metrics(zeroed(text), t_s=T0), parse_metrics(cut, t_s=T1))
    assert isinstance(o, Observation)
    assert o == window("vllm-0.32-cpu-20req.txt")


def test_missing_metric_is_named():
    def drop_ttft(t: str) -> str:
        return "\n".join(x for x in t.split("\n") if "vllm:time_to_first_token_seconds" not in x)

    o = window("vllm-0.32-cpu-20req.txt", drop_ttft)
    assert isinstance(o, NoObservation)
    assert o.code == "missing_metric:vllm:time_to_first_token_seconds_count"


def test_optional_metric_absent_gives_none():
    def drop_tpot(t: str) -> str:
        return "\n".join(x for x in t.split("\n") if "vllm:request_time_per_output_token_seconds" not in x)

    o = window("vllm-0.32-cpu-20req.txt", drop_tpot)
    assert isinstance(o, Observation)
    assert o.tpot_mean_s is None and o.tpot_p95_s is None
    assert o.ttft_mean_s == pytest.approx(4.1649415493011475 / 20)


def test_gauge_samples_between_scrapes_are_averaged():
    text = read_capture("vllm-0.32-cpu-20req.txt")

    def running(n: float, kv: float):
        t = text.replace(
            'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0',
            f'vllm:num_requests_running{{engine="0",model_name="tiny"}} {n}',
        ).replace(
            'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.0',
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="tiny"}} {kv}',
        )
        return parse_metrics(t, t_s=T0 + 5)

    prev = parse_metrics(zeroed(text), t_s=T0)
    cur = parse_metrics(text, t_s=T1)
    o = observe(prev, cur, [running(4, 0.5), running(2, 1.0)])
    assert isinstance(o, Observation)
    assert o.mean_batch == pytest.approx((0 + 4 + 2 + 0) / 4)
    assert o.max_batch == 4 and o.batch_samples == 4
    assert o.kv_usage == pytest.approx(1.5 / 4) and o.kv_usage_max == 1.0


def test_intermediate_scrape_without_the_gauge_is_skipped():
    text = read_capture("vllm-0.32-cpu-20req.txt")
    cut = parse_metrics(text[: text.index("vllm:num_requests_running{") + 5], t_s=T0 + 5)
    o = observe(parse_metrics(zeroed(text), t_s=T0), parse_metrics(text, t_s=T1), [cut])
    assert isinstance(o, Observation) and o.batch_samples == 2


def test_body_cut_at_a_line_end_inside_a_histogram_is_no_observation():
    # no partial line to give the cut away: the bucket series that vanished still tell
    text = read_capture("vllm-0.32-cpu-20req.txt")
    i = text.index('vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0"')
    cut = text[:i]
    assert cut.endswith("\n")
    o = observe(parse_metrics(zeroed(text), t_s=T0), parse_metrics(cut, t_s=T1))
    assert isinstance(o, NoObservation)
    assert o.reason in (Reason.SERIES_CHANGED, Reason.MISSING_METRIC)


# --- the fast paths: bucket plans, the merge shortcut, cached bound moments ---------------------
def _general_deltas(monkeypatch, prev, cur, between=()):
    """window_deltas with every histogram read label by label (no bucket plan)."""

    with monkeypatch.context() as m:
        m.setattr(window_module, "bucket_plan", lambda keys, cache=None: None)
        return window_module.window_deltas(prev, cur, between)


def test_window_histograms_are_the_capture_buckets():
    from kneecap.observe.window import window_deltas

    text = read_capture("vllm-0.32-cpu-20req.txt")
    d = window_deltas(parse_metrics(zeroed(text), t_s=T0), parse_metrics(text, t_s=T1))
    inp, ttft = d.histograms["input_len"], d.histograms["ttft"]
    # vllm:request_prompt_tokens_bucket le=1.0 .. +Inf, _sum 372.0, _count 20.0
    assert inp.bounds.tolist() == [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, math.inf]
    assert inp.cumulative.tolist() == [0.0, 0.0, 0.0, 4.0, 14.0, 20.0, 20.0, 20.0, 20.0, 20.0]
    assert (inp.sum, inp.count) == (372.0, 20.0)
    # vllm:time_to_first_token_seconds_bucket: 0 up to le=0.1, 12 at 0.25, 20 from 0.5 on
    assert ttft.bounds.tolist() == [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                                    5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0, math.inf]
    assert ttft.cumulative.tolist() == [0.0] * 8 + [12.0] + [20.0] * 14
    assert (ttft.sum, ttft.count) == (4.1649415493011475, 20.0)


def _same_histogram(h, g) -> bool:
    return (h is None and g is None) or (
        h.bounds.tobytes() == g.bounds.tobytes() and h.cumulative.tobytes() == g.cumulative.tobytes()
        and (h.sum, h.count) == (g.sum, g.count))


@pytest.mark.parametrize("name", CAPTURES)
@pytest.mark.parametrize("engines", [1, 2])
def test_bucket_plans_give_the_general_path_bit_for_bit(monkeypatch, name, engines):
    from kneecap.observe.window import HistogramCache, combine, window_deltas

    text = read_capture(name)
    if engines == 2:
        text = _two_engines(text)
    prev, cur = parse_metrics(zeroed(text), t_s=T0), parse_metrics(text, t_s=T1)
    between = (parse_metrics(text, t_s=T0 + 5),)
    from kneecap.observe.window import _histograms_batched

    assert _histograms_batched(prev, cur) is not None  # the batched path answers for these
    plans = HistogramCache()
    fast = window_deltas(prev, cur, between, cache=plans)
    again = window_deltas(prev, cur, between, cache=plans)  # the plans cached
    alone = window_deltas(prev, cur, between)  # no cache: planned afresh
    slow = _general_deltas(monkeypatch, prev, cur, between)
    assert plans.plans and plans.batches
    for k in slow.histograms:
        assert _same_histogram(fast.histograms[k], slow.histograms[k]), k
        assert _same_histogram(again.histograms[k], slow.histograms[k]), k
        assert _same_histogram(alone.histograms[k], slow.histograms[k]), k
        if fast.histograms[k] is not None:
            assert again.histograms[k].bounds is fast.histograms[k].bounds, k  # the same plan
    assert fast.counters == slow.counters and fast.running == slow.running
    assert combine([fast, again]) == combine([slow, slow]) == combine([slow, fast]) == combine([alone, alone])
    assert combine([fast]).input_len_cv == combine([slow]).input_len_cv == combine([alone]).input_len_cv


def test_a_histogram_cache_checks_its_entries_and_stays_bounded():
    from kneecap.observe.histogram import HistogramCache, bucket_plan

    one, two, inf = (("le", "1.0"),), (("le", "2.0"),), (("le", "+Inf"),)
    keys, other = (one, inf), (one, two, inf)  # the same first label tuple
    cache = HistogramCache(max_plans=1)
    cache.plans[id(keys[0])] = (other, None)  # an entry for other series under keys' id
    plan = bucket_plan(keys, cache)
    assert plan is not None and plan[0][2].bounds.tolist() == [1.0, math.inf]
    assert cache.plans == {id(keys[0]): (keys, plan)} and bucket_plan(keys, cache) is plan
    assert bucket_plan((two, inf), cache) is not None and len(cache.plans) == 1  # emptied when full


def test_bad_le_label_is_invalid():
    def bad(t: str) -> str:
        return t.replace('vllm:request_prompt_tokens_bucket{engine="0",le="10.0"',
                         'vllm:request_prompt_tokens_bucket{engine="0",le="ten"')

    o = window("vllm-0.32-cpu-20req.txt", bad)
    assert isinstance(o, NoObservation) and o.code == "invalid_value:vllm:request_prompt_tokens_bucket le='ten'"


def test_merge_histograms_sums_over_common_bounds():
    import numpy as np

    from kneecap.observe.histogram import Histogram, merge_histograms

    inf = math.inf
    a = Histogram(np.array([1.0, 2.0, 5.0, inf]), np.array([1.0, 3.0, 4.0, 6.0]), 10.5, 6.0)
    b = Histogram(np.array([1.0, 2.0, 5.0, inf]), np.array([0.0, 2.0, 2.0, 2.0]), 7.25, 2.0)  # equal, not same
    c = Histogram(np.array([1.0, 5.0, 10.0, inf]), np.array([2.0, 2.0, 3.0, 3.0]), 9.0, 3.0)
    same = merge_histograms([a, b])
    assert same.bounds.tolist() == [1.0, 2.0, 5.0, inf] and same.cumulative.tolist() == [1.0, 5.0, 6.0, 8.0]
    assert (same.sum, same.count) == (17.75, 8.0)
    mixed = merge_histograms([a, c])  # common bounds 1, 5, +inf
    assert mixed.bounds.tolist() == [1.0, 5.0, inf] and mixed.cumulative.tolist() == [3.0, 6.0, 9.0]
    assert (mixed.sum, mixed.count) == (19.5, 9.0)
    one = merge_histograms([a])
    assert one.cumulative.tolist() == [1.0, 3.0, 4.0, 6.0] and one.cumulative is not a.cumulative


def test_cv_is_the_same_with_plan_bounds_and_fresh_bounds():
    from kneecap.observe.histogram import Histogram
    from kneecap.observe.window import window_deltas

    text = read_capture("vllm-0.32-cpu-kv-saturated.txt")
    d = window_deltas(parse_metrics(zeroed(text), t_s=T0), parse_metrics(text, t_s=T1))
    for k in ("input_len", "output_len", "e2e"):
        h = d.histograms[k]
        assert not h.bounds.flags.writeable  # a plan's shared bounds
        fresh = Histogram(h.bounds.copy(), h.cumulative.copy(), h.sum, h.count)
        assert h.cv() == fresh.cv() and h.quantile(0.95) == fresh.quantile(0.95)
    # prompt: <=10: 4, <=20: 14, <=50: 30, <=100: 44 (kv-saturated capture), mass uniform in each bucket
    assert d.histograms["input_len"].cv() == pytest.approx(
        uniform_cv([(5, 10, 4), (10, 20, 10), (20, 50, 16), (50, 100, 14)]))


def _reference_cv(h) -> float:
    """Histogram.cv as first written (np.diff, np.sum, moments recomputed every call)."""
    import numpy as np

    counts = np.diff(np.concatenate([[0.0], h.cumulative]))
    hi = h.bounds.astype(float)
    lo = np.concatenate([[min(0.0, hi[0])], hi[:-1]])
    finite = np.isfinite(hi)
    m1 = np.where(finite, (lo + np.where(finite, hi, 0.0)) / 2.0, 0.0)
    m2 = np.where(finite, (lo**2 + lo * np.where(finite, hi, 0.0) + np.where(finite, hi, 0.0) ** 2) / 3.0, 0.0)
    n_inf = float(counts[~finite].sum())
    if n_inf > 0:
        rest = float(np.sum(counts[finite] * m1[finite]))
        x_inf = max(float(lo[~finite][0]), (h.sum - rest) / n_inf)
        m1 = np.where(finite, m1, x_inf)
        m2 = np.where(finite, m2, x_inf**2)
    mean_b = float(np.sum(counts * m1)) / h.count
    var_b = max(float(np.sum(counts * m2)) / h.count - mean_b**2, 0.0)
    return math.sqrt(var_b) / mean_b if mean_b > 0 else 0.0


@pytest.mark.parametrize("name", CAPTURES)
def test_cv_is_the_reference_cv_exactly(name):
    from kneecap.observe.histogram import Histogram
    from kneecap.observe.window import window_deltas

    text = read_capture(name)
    d = window_deltas(parse_metrics(zeroed(text), t_s=T0), parse_metrics(text, t_s=T1))
    for k, h in d.histograms.items():
        if h is not None and h.count > 0:
            assert h.cv() == _reference_cv(h), k
    # mass in the +Inf bucket: it sits at max(lower edge, where the exact mean puts it)
    import numpy as np
    tail = Histogram(np.array([1.0, 10.0, math.inf]), np.array([2.0, 5.0, 8.0]), 150.0, 8.0)
    assert tail.cv() == _reference_cv(tail)


def test_histogram_one_by_one_reads_reordered_series(monkeypatch):
    # the earlier scrape lists the TTFT buckets in reverse: same series, other order. The
    # batched path steps aside; histogram by histogram reads the same deltas.
    from kneecap.observe.vllm_metric_names import HISTOGRAMS

    text = read_capture("vllm-0.32-cpu-20req.txt")
    lines = zeroed(text).split("\n")
    ttft = [i for i, ln in enumerate(lines) if ln.startswith("vllm:time_to_first_token_seconds_bucket")]
    for i, ln in zip(ttft, [lines[i] for i in reversed(ttft)]):
        lines[i] = ln
    prev, cur = parse_metrics("\n".join(lines), t_s=T0), parse_metrics(text, t_s=T1)
    assert window_module._histograms_batched(prev, cur) is None
    d = window_module.window_deltas(prev, cur)
    slow = _general_deltas(monkeypatch, prev, cur)
    for k, (names, req) in HISTOGRAMS.items():
        assert _same_histogram(d.histograms[k], slow.histograms[k]), k
        assert _same_histogram(window_module._histogram(names, prev, cur, req), slow.histograms[k]), k
    assert d.histograms["ttft"].cumulative.tolist() == [0.0] * 8 + [12.0] + [20.0] * 14


def test_a_quantile_floor_is_the_lower_edge_of_the_bucket_its_rank_falls_in():
    """vLLM's TPOT buckets (…, 0.01, 0.025, 0.05, …): 85 of 100 requests within 10 ms and 15 in
    (10, 25] put the p95 at 20 ms by interpolation, and its floor at 10 ms (every one of the
    15 may have taken 12 ms); 6 in (25, 50] put the floor at 25 ms: more than 5% surely took
    longer than 25 ms. A rank in the +Inf bucket has the highest finite bound as floor."""
    bounds = np.array([0.01, 0.025, 0.05, 0.075, math.inf])
    straddling = Histogram(bounds, np.array([85.0, 100.0, 100.0, 100.0, 100.0]), 1.1, 100.0)
    assert straddling.quantile(0.95) == pytest.approx(0.02) and straddling.quantile_floor(0.95) == 0.01
    above = Histogram(bounds, np.array([85.0, 94.0, 100.0, 100.0, 100.0]), 1.3, 100.0)
    assert above.quantile(0.95) > 0.025 and above.quantile_floor(0.95) == 0.025
    first = Histogram(bounds, np.array([100.0, 100.0, 100.0, 100.0, 100.0]), 0.5, 100.0)
    assert first.quantile_floor(0.95) == 0.0 and first.quantile(0.95) == pytest.approx(0.0095)
    overflow = Histogram(bounds, np.array([10.0, 20.0, 30.0, 40.0, 100.0]), 50.0, 100.0)
    assert overflow.quantile_floor(0.95) == overflow.quantile(0.95) == 0.075


def test_the_share_surely_above_a_target_counts_the_buckets_past_its_edge():
    """vLLM's TPOT buckets: at a 50 ms target (an edge) the share above is exact, the 6 requests
    past 50 ms; at 20 ms (inside (10, 25]) only the 15 past 25 ms surely exceed it, the 15 in the
    straddling bucket may not; past the last finite edge nothing is sure; an empty window 0."""
    bounds = np.array([0.01, 0.025, 0.05, 0.075, math.inf])
    h = Histogram(bounds, np.array([70.0, 85.0, 94.0, 97.0, 100.0]), 2.0, 100.0)
    assert h.fraction_surely_above(0.05) == pytest.approx(0.06)
    assert h.fraction_surely_above(0.02) == pytest.approx(0.15)
    assert h.fraction_surely_above(0.001) == pytest.approx(0.30)
    assert h.fraction_surely_above(0.1) == 0.0
    assert Histogram(bounds, np.zeros(5), 0.0, 0.0).fraction_surely_above(0.05) == 0.0
