"""`kneecap load`'s library against a twin served in process on a loopback port (aiohttp's
TestServer): every token counted, the twin's simulated seconds, a trace replayed in order with
its lengths, pacing on the twin's clock. The draws and the argument checks:
tests/unit/test_load.py."""

from __future__ import annotations

import numpy as np
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from kneecap.cli import build_parser
from kneecap.commands.twin import build_server
from kneecap.errors import InputError
from kneecap.sim.loadgen import SIM_CLOCK_POLL_S, run_load, run_schedule
from kneecap.sim.server import SIM_TIME_HEADER
from kneecap.sim.trace import compress, read_trace


async def test_run_load_against_the_twin_counts_every_token():
    args = build_parser("twin").parse_args(["twin", "opt-125m", "--time-scale", "200", "--gpu", "l4",
                                            "--max-model-len", "1024"])
    twin = build_server(args)
    async with TestServer(twin.app()) as srv, ClientSession() as session:
        report = await run_load(str(srv.make_url("/")), rate_rps=40.0, duration_s=1.0, input_mean=60,
                                input_cv=0.8, output_mean=20, output_cv=0.5, seed=5, session=session)
    sent = list(report.records)
    assert report.failed == 0 and report.completed == report.sent == len(sent) > 20
    assert report.prompt_tokens_total == sum(r.prompt_tokens for r in sent)
    assert report.completion_tokens_total == sum(r.max_tokens for r in sent)
    assert report.ttft_s["p50"] <= report.e2e_s["p50"]
    assert report.model == "opt-125m"
    assert twin.engine.num_steps > 0 and not twin.engine.has_work()


async def test_time_scale_reports_the_twins_simulated_seconds():
    args = build_parser("twin").parse_args(["twin", "llama-3.1-8b", "--time-scale", "20", "--gpu", "h100-80gb",
                                            "--max-model-len", "4096"])
    twin = build_server(args)
    async with TestServer(twin.app()) as srv, ClientSession() as session:
        report = await run_load(str(srv.make_url("/")), rate_rps=2.0, duration_s=4.0, input_mean=200,
                                output_mean=100, seed=2, time_scale=20.0, session=session)
    text = twin.metrics.render(twin.engine).decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("vllm:e2e_request_latency_seconds_sum"))
    sim_mean_s = float(line.split()[-1]) / report.completed
    assert report.completed > 2 and report.failed == 0
    # ~100 decode steps of ~8 ms. Scaled back, the client sees at least the twin's simulated latency
    # (unscaled it would see 1/20 of it); HTTP and a busy CPU only add to it, so no upper bound here.
    assert 0.5 < sim_mean_s < 2.0
    assert report.e2e_s["mean"] >= 0.95 * sim_mean_s


def _recording_twin(*flags: str):
    """An in-process twin whose engine notes every request it accepts (prompt, max_tokens, arrival)."""
    twin = build_server(build_parser("twin").parse_args(["twin", "opt-125m", "--gpu", "l4", "--max-model-len",
                                                         "1024", *flags]))
    seen = []
    add = twin.engine.add_request

    def add_request(prompt_tokens, max_tokens, arrival_s=None, request_id=None, **kwargs):
        seen.append((prompt_tokens, max_tokens, arrival_s))
        return add(prompt_tokens, max_tokens, arrival_s=arrival_s, request_id=request_id, **kwargs)

    twin.engine.add_request = add_request
    return twin, seen


async def test_trace_replay_sends_each_request_in_order_with_its_lengths(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(
        f"{0.5 * i},{10 + 7 * i},{3 + (5 * i) % 11}\n" for i in range(12)))
    trace = compress(read_trace(p), 2.0)  # a request every 0.25 s: far apart next to a send's cost
    twin, seen = _recording_twin()
    async with TestServer(twin.app()) as srv, ClientSession() as session:
        report = await run_schedule(str(srv.make_url("/")), trace.arrival_s, trace.input_tokens,
                                    trace.output_tokens, session=session)
    assert [(a, b) for a, b, _ in seen] == list(zip(trace.input_tokens.tolist(), trace.output_tokens.tolist()))
    assert [s for _, _, s in seen] == sorted(s for _, _, s in seen)  # the twin got them in trace order
    assert report.sent == report.completed == 12 and report.failed == 0
    assert report.prompt_tokens_total == int(trace.input_tokens.sum())
    assert report.completion_tokens_total == int(trace.output_tokens.sum())
    assert report.duration_s == pytest.approx(2.75) and report.offered_rate_rps == pytest.approx(12 / 2.75)
    # sends never leave before their instant; lateness is what they were late by
    assert all(r.sent_s >= a for r, a in zip(report.records, trace.arrival_s))
    assert 0 <= report.send_lateness_s["p99"] <= report.send_lateness_s["max"]
    assert report.clock == "wall"


async def test_sim_clock_paces_on_the_twins_header(tmp_path):
    twin, seen = _recording_twin("--time-scale", "20")
    arrivals = np.arange(8) * 1.5
    async with TestServer(twin.app()) as srv, ClientSession() as session:
        async with session.get(srv.make_url("/health")) as r:
            before = float(r.headers[SIM_TIME_HEADER])
        report = await run_schedule(str(srv.make_url("/")), arrivals, np.full(8, 20), np.full(8, 4),
                                    time_scale=20.0, sim_clock=True, stream=False, session=session)
        async with session.get(srv.make_url("/health")) as r:
            after = float(r.headers[SIM_TIME_HEADER])
    assert report.clock == "sim" and report.completed == 8
    # one JSON response per request: usage counted, no client-side TTFT
    assert report.completion_tokens_total == 32 and report.prompt_tokens_total == 160 and not report.ttft_s
    stamps = np.array([s for _, _, s in seen])
    # each request reached the twin no earlier on its clock than scheduled (relative to the first),
    # give or take one clock poll's extrapolation
    assert np.all(stamps - stamps[0] >= arrivals - SIM_CLOCK_POLL_S * 20.0)
    assert twin.sim_origin_s + stamps[0] >= before and after - before >= report.elapsed_s >= arrivals[-1]


async def test_start_at_waits_for_the_servers_clock():
    twin, seen = _recording_twin("--time-scale", "20")
    async with TestServer(twin.app()) as srv, ClientSession() as session:
        async with session.get(srv.make_url("/health")) as r:
            start = float(r.headers[SIM_TIME_HEADER]) + 10.0
        report = await run_schedule(str(srv.make_url("/")), [0.0, 1.0], [5, 5], [2, 2], time_scale=20.0,
                                    sim_clock=True, start_at_s=start, session=session)
    assert report.completed == 2
    assert twin.sim_origin_s + seen[0][2] >= start - SIM_CLOCK_POLL_S * 20.0
    assert twin.sim_origin_s + seen[1][2] >= start + 1.0 - SIM_CLOCK_POLL_S * 20.0
    with pytest.raises(InputError) as exc:
        await run_schedule("http://127.0.0.1:9", [0.0], [1], [1], start_at_s=5.0)
    assert exc.value.field == "start_at"


async def test_sim_clock_needs_the_header():
    from aiohttp import web

    async def health(request):
        return web.Response()

    async def models(request):
        return web.json_response({"data": [{"id": "m"}]})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    async with TestServer(app) as srv:
        with pytest.raises(InputError) as exc:
            await run_schedule(str(srv.make_url("/")), [0.0], [1], [1], sim_clock=True)
    assert exc.value.field == "sim_clock" and SIM_TIME_HEADER in str(exc.value)
