"""`kneecap simulate`: JSON keys, exit codes, plot, calibration file."""

from __future__ import annotations

import json
import math

import pytest

from kneecap.cli import main

ENGINE = ["--prefill-s-per-token", "3e-5", "--prefill-s-per-attended-token", "1e-9", "--decode-step-s", "0.012",
          "--decode-s-per-seq", "5e-4", "--decode-s-per-resident-token", "4e-8",
          "--input-mean", "800", "--output-mean", "150"]


def run_json(capsys, argv):
    code = main(["simulate", *argv, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def test_raw_queue_json_keys_and_values(capsys):
    code, out, _ = run_json(capsys, ["--rate", "0.5", "--service-mean", "1", "--samples", "200000", "--seed", "3",
                                     "--slo-ttft-s", "10", "--sweep-points", "4"])
    assert code == 0
    for key in ("ttft_s", "tbt_s", "wait_s"):
        assert set(out[key]) >= {"p50", "p95", "p99"}
    assert out["wait_s"]["mean"] == pytest.approx(1.0, rel=0.05)  # M/M/1, ρ = 0.5
    assert out["tbt_s"]["p95"] is None  # no decode in a raw queue
    assert out["service_rate_rps"] == pytest.approx(1.0)
    assert out["sustainable_rate_rps"] == pytest.approx(1 - math.log(20) / 10, rel=0.03)  # sojourn p95 = ln20/(μ−λ)
    assert out["samples"] == 200000 and len(out["sweep"]) == 4


def test_engine_json_and_plot(capsys, tmp_path):
    png = tmp_path / "gauss.png"
    code, out, _ = run_json(capsys, ["--rate", "2", *ENGINE, "--samples", "100000", "--slo-ttft-s", "0.6",
                                     "--slo-tpot-s", "0.06", "--plot", str(png), "--sweep-points", "5"])
    assert code == 0
    assert 0 < out["ttft_s"]["p50"] < out["ttft_s"]["p95"] < out["ttft_s"]["p99"]
    assert 0 < out["tbt_s"]["p50"] < out["tbt_s"]["p95"] < out["tbt_s"]["p99"]
    assert 2.0 < out["sustainable_rate_rps"] < out["stable_rate_rps"]
    assert out["mode"] == "engine" and out["coefficients"]["chunk_tokens"] == 2048
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_calibration_from_kneecap_fit(capsys, tmp_path, profiles_csv):
    calib = tmp_path / "calib.json"
    assert main(["fit", str(profiles_csv), "--gpu", "h100-64gb", "--where", "model=llama-2-7b", "-o", str(calib)]) == 0
    capsys.readouterr()
    # model and GPU come from the calibration file (one model, its GPU)
    code, out, _ = run_json(capsys, ["--rate", "2", "--calibration", str(calib), "--input-mean", "1000",
                                     "--output-mean", "200", "--samples", "50000", "--sweep-points", "0"])
    assert code == 0 and out["service_model"].startswith("calibration")
    assert out["tbt_s"]["p50"] > 0.005 and out["ttft_s"]["p50"] > 0.01  # a 7B model on an H100
    code, out2, _ = run_json(capsys, ["--rate", "2", "--calibration", str(calib), "--input-mean", "1000",
                                      "--output-mean", "200", "--samples", "50000", "--sweep-points", "0",
                                      "--decode-step-s", "0.05"])
    assert out2["coefficients"]["decode_step_s"] == 0.05 and out2["tbt_s"]["p50"] > out["tbt_s"]["p50"] + 0.04
    code, _, err = run_json(capsys, ["--rate", "2", "--calibration", str(calib), "--model", "no-such-model",
                                     "--input-mean", "1000", "--output-mean", "200"])
    assert code == 2 and json.loads(err.splitlines()[0])["field"] == "model"
    calib.write_text(json.dumps({"form": "kneecap"}))
    code, _, err = run_json(capsys, ["--rate", "2", "--calibration", str(calib), "--model", "llama-2-7b",
                                     "--input-mean", "1000", "--output-mean", "200"])
    assert code == 2 and json.loads(err.splitlines()[0])["field"].startswith("calibration")


def test_catalog_keys_without_calibration_use_slim_defaults(capsys):
    code, out, _ = run_json(capsys, ["--rate", "1", "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                                     "--input-mean", "1000", "--output-mean", "200", "--samples", "20000",
                                     "--sweep-points", "0"])
    assert code == 0 and out["service_model"].startswith("uncalibrated")


@pytest.mark.parametrize("argv, field", [
    (["--rate", "-1", "--service-mean", "1"], "rate"),
    (["--rate", "0.5", "--service-mean", "1", "--samples", "10"], "samples"),
    (["--rate", "0.5", "--service-cv", "2"], "service_mean"),
    (["--rate", "0.5", "--prefill-s-per-token", "1e-5", "--decode-step-s", "0.01", "--output-mean", "10"], "input_mean"),
    (["--rate", "0.5", "--decode-step-s", "0.01", "--input-mean", "10", "--output-mean", "10"], "prefill_s_per_token"),
    (["--rate", "0.5", "--input-mean", "100", "--output-mean", "10"], "model"),
    (["--rate", "0.5", "--model", "llama-3.1-8b", "--input-mean", "100", "--output-mean", "10"], "gpu"),
    (["--rate", "0.5", "--calibration", "/nonexistent.json", "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
      "--input-mean", "100", "--output-mean", "10"], "calibration"),
])
def test_bad_arguments_exit_2_naming_the_field(capsys, argv, field):
    code, out, err = run_json(capsys, argv)
    assert code == 2 and out is None
    (line,) = err.splitlines()  # reported once
    assert json.loads(line) == {"error": json.loads(line)["error"], "field": field, "exitCode": 2}


@pytest.mark.parametrize("q", ["0", "1", "1.5", "nan", "high"])
def test_a_quantile_outside_0_1_is_a_usage_error_reported_once(capsys, q):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--rate", "0.5", "--service-mean", "1", "--quantile", q, "--json"])
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == ""
    (line,) = err.splitlines()
    assert json.loads(line)["field"] == "quantile" and "expected a quantile in (0, 1)" in json.loads(line)["error"]


def test_any_quantile_mm1_sojourn(capsys):
    """M/M/1 at ρ = 0.5 (μ = 1): the sojourn is exponential with rate μ − λ, so its q-quantile is
    −ln(1 − q)/(μ − λ) and the rate meeting a sojourn SLO s at q is μ + ln(1 − q)/s."""
    code, out, _ = run_json(capsys, ["--rate", "0.5", "--service-mean", "1", "--samples", "200000", "--seed", "3",
                                     "--slo-ttft-s", "10", "--quantile", "0.9", "--sweep-points", "0"])
    assert code == 0 and out["quantile"] == 0.9
    assert out["ttft_s"]["p90"] == pytest.approx(math.log(10) / 0.5, rel=0.05)
    assert out["ttft_s"]["ci95_halfwidth"]["p90"] > 0
    assert out["sustainable_rate_rps"] == pytest.approx(1 - math.log(10) / 10, rel=0.03)
    main(["simulate", "--rate", "0.5", "--service-mean", "1", "--samples", "20000", "--quantile", "0.9",
          "--sweep-points", "0"])
    text = capsys.readouterr().out
    assert "p90" in text.splitlines()[0] and "±95% CI of p90" in text


def test_the_old_tbt_spelling_still_works_with_a_warning(capsys):
    code, out, err = run_json(capsys, ["--rate", "2", *ENGINE, "--samples", "20000", "--slo-tbt-s", "0.06",
                                       "--sweep-points", "0"])
    assert code == 0 and "--slo-tbt-s is deprecated, use --slo-tpot-s" in err
    code2, out2, _ = run_json(capsys, ["--rate", "2", *ENGINE, "--samples", "20000", "--slo-tpot-s", "0.06",
                                       "--sweep-points", "0"])
    assert out["sustainable_rate_rps"] == out2["sustainable_rate_rps"]


def test_argparse_errors_exit_2():
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--rate", "abc", "--service-mean", "1"])
    assert exc.value.code == 2


def test_unstable_rate_is_an_infeasible_answer(capsys):
    code, out, _ = run_json(capsys, ["--rate", "2", "--service-mean", "1"])
    assert code == 1
    assert out["feasible"] is False and out["stage"] == "queue" and out["infeasible"].startswith("infeasible: queue stage")


def test_vllm_histogram_workload(capsys):
    code, out, _ = run_json(capsys, ["--rate", "1", *ENGINE[:10], "--input-histogram", "128:0,512:70,2048:100,+Inf:100",
                                     "--output-histogram", "64:50,256:100,+Inf:100", "--samples", "50000",
                                     "--sweep-points", "0"])
    assert code == 0 and out["ttft_s"]["p99"] > out["ttft_s"]["p50"] > 0
    code, _, err = run_json(capsys, ["--rate", "1", *ENGINE[:10], "--input-histogram", "128:10,512",
                                     "--output-mean", "100"])
    assert code == 2 and json.loads(err.splitlines()[0])["field"] == "input_histogram"


def test_e2e_quantiles_and_prefill_packing_switch(capsys):
    """E2E = TTFT + (OL − 1)·TBT per request: its quantiles lie above TTFT's; the paper's slot
    (--no-prefill-packing) is reported in the coefficients and, near saturation, is slower."""
    argv = ["--rate", "12", *ENGINE[:-4], "--input-mean", "100", "--output-mean", "40", "--samples", "100000",
            "--sweep-points", "0"]
    code, packed, _ = run_json(capsys, argv)
    assert code == 0 and packed["coefficients"]["prefill_packing"] is True
    for q in ("p50", "p95", "p99"):
        assert packed["e2e_s"][q] > packed["ttft_s"][q]
    assert packed["e2e_s"]["mean"] == pytest.approx(
        packed["ttft_s"]["mean"] + 39 * packed["tbt_s"]["mean"], rel=0.25)  # lengths vary (CV 1)
    code, paper, _ = run_json(capsys, [*argv, "--no-prefill-packing"])
    assert code == 0 and paper["coefficients"]["prefill_packing"] is False
    assert paper["ttft_s"]["p99"] > packed["ttft_s"]["p99"]


@pytest.mark.parametrize("argv, field", [
    (["--max-num-seqs", "0"], "max_num_seqs"),
    (["--max-num-active-seqs", "-1"], "max_num_active_seqs"),
    (["--max-num-batched-tokens", "128"], "max_num_batched_tokens"),  # below vLLM's default cap 256
    (["--kv-cache-memory-bytes", "4G"], "kv_cache_memory_bytes"),  # explicit coefficients: no KV bytes per token
    (["--num-gpu-blocks-override", "0"], "num_gpu_blocks_override"),
    (["--gpu-memory-utilization", "1.5"], "gpu_memory_utilization"),
    (["--block-size", "0"], "block_size"),
    (["--max-model-len", "0"], "max_model_len"),
    (["--num-gpu-blocks-override", "100", "--max-model-len", "2000"], "max_model_len"),  # 1,600 KV tokens
])
def test_bad_engine_limits_exit_2_naming_the_flag(capsys, argv, field):
    code, out, err = run_json(capsys, ["--rate", "1", *ENGINE, "--samples", "1000", "--sweep-points", "0", *argv])
    assert code == 2 and out is None
    (line,) = err.splitlines()
    assert json.loads(line)["field"] == field


def test_memory_flags_are_mutually_exclusive(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--rate", "1", "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--input-mean", "100",
              "--output-mean", "10", "--gpu-memory-utilization", "0.5", "--kv-cache-memory-bytes", "4G", "--json"])
    (line,) = capsys.readouterr().err.splitlines()
    assert exc.value.code == 2 and "not allowed with argument" in json.loads(line)["error"]


def test_engine_limits_default_to_vllms_and_move_latency(capsys):
    """vLLM's defaults per GPU; a tight --max-num-seqs moves latency from TPOT to TTFT; a small
    KV cache (--num-gpu-blocks-override) preempts; prefix caching off recomputes --cached-tokens."""
    wl = ["--input-mean", "2000", "--output-mean", "300", "--samples", "40000", "--sweep-points", "0"]
    code, big, _ = run_json(capsys, ["--rate", "1", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", *wl])
    assert code == 0 and big["limits"]["max_num_seqs"] == 1024 and big["limits"]["max_num_batched_tokens"] == 8192
    assert big["coefficients"]["chunk_tokens"] == 8192 and big["limits"]["kv_capacity_tokens"] > 100_000
    assert big["admission_wait_probability"] == 0.0 and big["preempted_fraction"] == 0.0
    base = ["--rate", "3", *ENGINE, "--samples", "100000", "--sweep-points", "0"]
    code, free, _ = run_json(capsys, base)
    assert code == 0 and free["limits"] == {"max_num_seqs": 256, "max_num_active_seqs": None,
                                            "max_num_batched_tokens": 2048, "kv_capacity_tokens": None,
                                            "block_size": 16, "enable_prefix_caching": True}
    code, tight, _ = run_json(capsys, [*base, "--max-num-seqs", "10"])
    assert code == 0 and tight["limits"]["max_num_seqs"] == 10
    assert tight["ttft_s"]["p95"] > 2 * free["ttft_s"]["p95"] and tight["tbt_s"]["p95"] < free["tbt_s"]["p95"]
    assert tight["admission_wait_probability"] > 0.05 and tight["admission_wait_s"]["mean"] > 0
    code, small, _ = run_json(capsys, [*base, "--num-gpu-blocks-override", "1500"])
    assert code == 0 and small["limits"]["kv_capacity_tokens"] == 24_000 and small["preempted_fraction"] > 0
    assert small["preemption_mean_s"] > 0 and small["e2e_s"]["mean"] > free["e2e_s"]["mean"]
    cached = [*base, "--cached-tokens", "400"]
    code, on, _ = run_json(capsys, cached)
    code, off, _ = run_json(capsys, [*cached, "--no-enable-prefix-caching"])
    assert on["ttft_s"]["p50"] < off["ttft_s"]["p50"] and off["limits"]["enable_prefix_caching"] is False


def test_the_old_chunk_tokens_spelling_still_works_with_a_warning(capsys):
    code, out, err = run_json(capsys, ["--rate", "1", *ENGINE, "--samples", "1000", "--sweep-points", "0",
                                       "--chunk-tokens", "1024"])
    assert code == 0 and "--chunk-tokens is deprecated, use --max-num-batched-tokens" in err
    assert out["coefficients"]["chunk_tokens"] == 1024 == out["limits"]["max_num_batched_tokens"]


def test_a_calibration_used_on_another_gpu_is_transferred_through_its_hardware_terms(capsys, tmp_path, profiles_csv):
    from dataclasses import asdict

    from kneecap.model import gauss
    from kneecap.model.arch import get_arch
    from kneecap.model.calibrate import Calibration
    from kneecap.model.hardware import get_gpu
    from kneecap.model.transfer import transfer_params

    calib = tmp_path / "calib.json"
    assert main(["fit", str(profiles_csv), "--gpu", "h100-64gb", "--where", "model=llama-2-7b", "-o", str(calib)]) == 0
    capsys.readouterr()
    argv = ["--rate", "1", "--calibration", str(calib), "--input-mean", "1000", "--output-mean", "200",
            "--samples", "20000", "--sweep-points", "0"]
    code, here, _ = run_json(capsys, argv)
    code2, there, _ = run_json(capsys, [*argv, "--gpu", "a100-80gb"])
    assert code == code2 == 0 and "transferred" not in here["service_model"]
    assert "transferred from h100-64gb to a100-80gb" in there["service_model"]
    cal = Calibration.from_json(calib.read_text())
    moved = transfer_params(cal.slim_params, get_gpu("h100-64gb"), get_gpu("a100-80gb"))
    want = gauss.coefficients_for(get_arch("llama-2-7b"), get_gpu("a100-80gb"), moved, form=cal.form,
                                  chunk_tokens=there["coefficients"]["chunk_tokens"])
    assert there["coefficients"]["decode_s_per_seq"] == pytest.approx(asdict(want)["decode_s_per_seq"])
    assert there["coefficients"]["decode_s_per_seq"] > here["coefficients"]["decode_s_per_seq"]  # A100: 1/3 the FLOP/s


def test_max_model_len_is_vllms_start_up_check(capsys):
    """vLLM V1 refuses to start when its KV cache cannot hold one request of max_model_len: Llama-3.1-70B
    at TP 2 on H100s at vLLM's defaults (1,024 sequences' sampler buffers, 0.9) leaves 4,992 tokens.
    Without --max-model-len (the model's 131,072-token context) the answer says so; a --max-model-len
    the cache holds runs without the note, one it does not is refused naming the flag."""
    wl = ["--model", "llama-3.1-70b", "--gpu", "h100-80gb", "--tensor-parallel-size", "2", "--input-mean", "1000",
          "--output-mean", "200", "--samples", "20000", "--sweep-points", "0"]
    code, out, _ = run_json(capsys, ["--rate", "0.1", *wl])
    assert code == 0 and out["limits"]["kv_capacity_tokens"] == 4992
    assert "131072" in out["startup_note"] and "4992" in out["startup_note"]
    code, out, _ = run_json(capsys, ["--rate", "0.5", *wl])  # past the cache's stability limit: the note too
    assert code == 1 and out["feasible"] is False and "would not start" in out["startup_note"]
    code, out, _ = run_json(capsys, ["--rate", "0.1", *wl, "--max-model-len", "4096"])
    assert code == 0 and out["startup_note"] is None
    code, out, err = run_json(capsys, ["--rate", "0.1", *wl, "--max-model-len", "8192"])
    (line,) = err.splitlines()
    assert code == 2 and out is None and json.loads(line)["field"] == "max_model_len" and "4992" in line
    code, out, err = run_json(capsys, ["--rate", "1", "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                                       "--input-mean", "100", "--output-mean", "10", "--max-model-len", "200000"])
    (line,) = err.splitlines()
    assert code == 2 and json.loads(line)["field"] == "max_model_len" and "131072" in line
