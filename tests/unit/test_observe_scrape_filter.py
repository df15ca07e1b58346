"""parse_metrics' two speed paths on the real vLLM captures: the family filter (``keep``) the
operator scrapes with, and the series cache (prometheus-client's sample parser once per series,
its value parser after that), each checked against the plain whole-family parse."""

from __future__ import annotations

import importlib

import pytest

from kneecap.control.loop import WINDOW_FAMILIES
from kneecap.observe import NoObservation, Observation, observe, parse_metrics
from tests.support.capture_windows import CAPTURES, T0, T1, cut_inside, zeroed
from tests.support.data import read_capture
from tests.support.scrape_reference import reference_samples

S = importlib.import_module("kneecap.observe.scrape")


def as_plain(snap):
    return ({k: dict(v) for k, v in snap.series.items()}, snap.invalid, snap.dropped_family, snap.truncated)


def whole_family_parse(monkeypatch, text: str, **kw):
    with monkeypatch.context() as m:
        m.setattr(S, "_parse_sample", None)  # the fallback: text_string_to_metric_families
        return parse_metrics(text, **kw)


def edits(text: str) -> list[str]:
    """The capture, dirty (NaN, garbage, half-written line), cut in a kept family and cut at the end."""
    dirty = text.replace("# HELP vllm:num_requests_running", 'garbage{{ line "with no value\n'
                         "# HELP vllm:num_requests_running") + "vllm:half_written_metric{engine=\n"
    dirty = dirty.replace('vllm:prompt_tokens_total{engine="0",model_name="tiny"} ',
                          'vllm:prompt_tokens_total{engine="0",model_name="tiny"} NaN #', 1)
    return [text, dirty, cut_inside(text, 'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5"'),
            text[:-40]]


@pytest.mark.parametrize("name", CAPTURES)
@pytest.mark.parametrize("keep", [None, WINDOW_FAMILIES])
def test_cached_parse_equals_whole_family_parse(monkeypatch, name, keep):
    cache = S.ParseCache()
    for text in edits(read_capture(name)):
        cold = parse_metrics(text, t_s=T0, keep=keep, cache=cache)
        warm = parse_metrics(text, t_s=T0, keep=keep, cache=cache)  # every series from the cache
        assert as_plain(cold) == as_plain(warm) == as_plain(whole_family_parse(monkeypatch, text, t_s=T0, keep=keep))


def test_dirty_lines_are_named_in_invalid():
    snap = parse_metrics(edits(read_capture("vllm-0.32-cpu-20req.txt"))[1])
    assert {"garbage", "vllm:half_written_metric"} <= snap.invalid


def test_cache_reads_new_values_of_known_series():
    cache = S.ParseCache()
    body = '# TYPE x_total counter\nx_total{a="1"} {v}\n# TYPE y gauge\ny {v}\n'
    for v in (1.0, 2.5, 7.0):
        snap = parse_metrics(body.replace("{v}", str(v)), cache=cache)
        assert snap.series["x_total"][(("a", "1"),)] == v and snap.value("y") == v
    snap = parse_metrics(body.replace("{v}", "nope"), cache=cache)
    assert snap.get("x_total") is None and {"x_total", "y"} <= snap.invalid


def test_counter_sample_without_total_is_renamed_like_prometheus_client(monkeypatch):
    body = "# HELP jobs Jobs.\n# TYPE jobs counter\njobs 3\n# TYPE other gauge\njobs 4\n"
    for snap in (parse_metrics(body), whole_family_parse(monkeypatch, body)):
        assert snap.value("jobs_total") == 3 and snap.value("jobs") == 4  # the second is an untyped singleton


@pytest.mark.parametrize("name", CAPTURES)
def test_window_from_filtered_scrapes_is_the_same(name):
    text = read_capture(name)
    full = observe(parse_metrics(zeroed(text), t_s=T0), parse_metrics(text, t_s=T1))
    kept = [parse_metrics(t, t_s=ts, keep=WINDOW_FAMILIES) for t, ts in ((zeroed(text), T0), (text, T1))]
    assert isinstance(full, Observation) and observe(*kept) == full
    assert len(kept[1].series) < len(parse_metrics(text).series)


def test_filtered_cut_outside_the_kept_families_keeps_them():
    text = read_capture("vllm-0.32-cpu-20req.txt")
    cut = cut_inside(text, "http_request_duration_seconds_bucket{", 30)
    snap = parse_metrics(cut, keep=WINDOW_FAMILIES)
    assert snap.truncated and snap.dropped_family == "http_request_duration_seconds"
    assert isinstance(observe(parse_metrics(zeroed(text), t_s=T0, keep=WINDOW_FAMILIES),
                              parse_metrics(cut, t_s=T1, keep=WINDOW_FAMILIES)), Observation)


def test_filtered_cut_inside_a_kept_family_drops_it():
    text = read_capture("vllm-0.32-cpu-20req.txt")
    cut = cut_inside(text, 'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5"')
    snap = parse_metrics(cut, keep=WINDOW_FAMILIES)
    assert snap.dropped_family == "vllm:time_to_first_token_seconds"
    assert snap.get("vllm:time_to_first_token_seconds_bucket") is None
    o = observe(parse_metrics(zeroed(text), t_s=T0, keep=WINDOW_FAMILIES), snap)
    assert isinstance(o, NoObservation) and o.code.startswith("truncated")


# --- the line cache (a seen line: rpartition, dict lookup, float) against the reference -------
def reference(text: str, keep=None):
    """What parse_metrics gave before the line cache: the reference reader's samples, collected."""
    lines = text.split("\n")[:-1]
    return S._collect(reference_samples(lines, keep), None)


VALUE_FORMS = ["7", "1e3", "+Inf", "-Inf", "NaN", "1_5", "3 1700000000000", "2.5\r", "2.5\t", "\t2.5", "1.0}",
               "x1", "", "4 # {a=\"b\"} 1"]


@pytest.mark.parametrize("keep", [None, WINDOW_FAMILIES])
def test_line_cache_reads_every_value_form_as_the_reference(monkeypatch, keep):
    cache = S.ParseCache()
    text = read_capture("vllm-0.32-cpu-20req.txt")
    targets = ['vllm:prompt_tokens_total{engine="0",model_name="tiny"} ',
               'vllm:num_requests_running{engine="0",model_name="tiny"} ',
               'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.25",model_name="tiny"} ',
               'python_gc_objects_collected_total{generation="0"} ', "process_start_time_seconds "]
    for form in VALUE_FORMS:
        edited = text
        for t in targets:
            i = edited.index("\n" + t) + 1
            j = edited.index("\n", i)
            edited = edited[:i] + t + form + edited[j:]
        for _ in range(2):  # cold (or warm from the form before), then warm
            snap = parse_metrics(edited, t_s=T0, keep=keep, cache=cache)
            series, invalid = reference(edited, keep)
            assert ({k: dict(v) for k, v in snap.series.items()}, snap.invalid) == (series, invalid), repr(form)
        assert as_plain(parse_metrics(text, t_s=T0, keep=keep, cache=cache)) == as_plain(
            whole_family_parse(monkeypatch, text, t_s=T0, keep=keep))


def test_line_cache_follows_a_changed_type_line():
    # "# TYPE jobs gauge" and "# TYPE jobs counter" share the text before their last space
    gauge, counter = "# TYPE jobs gauge\njobs 3\n", "# TYPE jobs counter\njobs 3\n"
    cache = S.ParseCache()
    for body in (gauge, gauge, counter, counter, gauge):
        snap = parse_metrics(body, cache=cache)
        assert dict(snap.series) == ({"jobs_total": {(): 3.0}} if body == counter else {"jobs": {(): 3.0}})


def test_warm_parse_skips_the_sample_parser_and_a_cleared_cache_does_not(monkeypatch):
    text = read_capture("vllm-0.32-cpu-run4.txt")
    calls = []
    parse_sample = S._parse_sample
    monkeypatch.setattr(S, "_parse_sample", lambda line: calls.append(line) or parse_sample(line))
    cache = S.ParseCache()
    cold = parse_metrics(text, keep=WINDOW_FAMILIES, cache=cache)
    n_cold = len(calls)
    warm = parse_metrics(text, keep=WINDOW_FAMILIES, cache=cache)
    assert n_cold > 200 and len(calls) == n_cold and as_plain(warm) == as_plain(cold)
    cache.series.clear()  # the line cache goes with it
    parse_metrics(text, keep=WINDOW_FAMILIES, cache=cache)
    assert len(calls) == 2 * n_cold
    parse_metrics(text, keep=WINDOW_FAMILIES)  # no cache: this page alone
    assert len(calls) == 3 * n_cold
