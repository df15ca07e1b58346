import csv
import json

import numpy as np
import pytest

from kneecap.cli import main
from kneecap.errors import InputError
from kneecap.model.arch import GIB, get_arch
from kneecap.model.hardware import get_gpu
from kneecap.model.memory import (
    block_round_tokens, kv_cache_memory_bytes_for_tokens, kv_tokens_for_cap, memory_split,
    non_kv_from_cache_config, released_bytes, utilization_for_kv_tokens,
)

H100_64 = get_gpu("h100-64gb")


def test_block_rounding():
    assert block_round_tokens(1) == 16 and block_round_tokens(16) == 16 and block_round_tokens(17) == 32
    assert list(block_round_tokens([0, 15, 33], 8)) == [0, 16, 40]


def test_kv_tokens_for_cap_margin_grows_with_spread():
    base = kv_tokens_for_cap(64, 500)
    wide = kv_tokens_for_cap(64, 500, std_len_tok=300)
    # B·μ + half a block per sequence, then + z·√B·σ = 1.645·8·300
    assert base == 64 * 500 + 64 * 8
    assert wide - base == pytest.approx(1.645 * 8 * 300, abs=16)
    assert kv_tokens_for_cap(4, 500, 300, max_model_len=512) <= 4 * (512 + 16)
    assert list(kv_tokens_for_cap(np.array([1, 2]), 100)) == [112, 224]


@pytest.mark.parametrize("model,util,seqs,budget,measured", [
    # rows of data/real-h100/profiles.csv (vLLM-reported kv_capacity_tokens)
    ("llama-2-7b", 0.9, 64, 2048, 90544),
    ("llama-2-7b", 0.9, 512, 512, 89728),
    ("opt-1.3b", 0.9, 768, 2048, 290160),
    ("opt-2.7b", 0.9, 8, 512, 170304),
])
def test_memory_split_matches_vllm_reported_capacity(model, util, seqs, budget, measured):
    split = memory_split(get_arch(model), H100_64, util, seqs, budget)
    assert split.kv_capacity_tokens == pytest.approx(measured, rel=0.002)
    assert split.kv_capacity_tokens % 16 == 0
    assert split.weights_bytes + split.reserve_bytes + split.kv_bytes <= split.reserved_bytes


def test_reserve_grows_with_max_num_seqs_and_token_budget():
    a = get_arch("opt-1.3b")
    caps = [memory_split(a, H100_64, 0.9, s, 2048).kv_capacity_tokens for s in (32, 256, 768)]
    assert caps[0] > caps[1] > caps[2]
    assert memory_split(a, H100_64, 0.9, 1, 512).kv_capacity_tokens > memory_split(a, H100_64, 0.9, 1, 8192).kv_capacity_tokens


def test_inverse_roundtrip_holds_the_tokens_with_least_memory():
    a, g = get_arch("llama-3.1-8b"), get_gpu("h100-80gb")
    split = utilization_for_kv_tokens(a, g, 100_000, 64)
    assert split.kv_capacity_tokens >= 100_000
    smaller = memory_split(a, g, split.gpu_memory_utilization - 0.001, 64)
    assert smaller.kv_capacity_tokens < 100_000
    assert released_bytes(memory_split(a, g, 0.9, 64), split) / GIB > 40


def test_measured_non_kv_from_cache_config_reproduces_the_pod():
    a = get_arch("llama-2-7b")
    non_kv = non_kv_from_cache_config(a, H100_64, 0.9, num_gpu_blocks=5659, block_size=16)
    split = memory_split(a, H100_64, 0.9, 64, measured_non_kv_bytes=non_kv)
    assert split.measured and split.num_gpu_blocks == 5659
    inv = utilization_for_kv_tokens(a, H100_64, 40_000, 64, measured_non_kv_bytes=non_kv)
    assert inv.kv_capacity_tokens >= 40_000 and inv.gpu_memory_utilization < 0.9


def test_kv_cache_memory_bytes_whole_blocks():
    assert kv_cache_memory_bytes_for_tokens(get_arch("opt-13b"), 17) == 32 * 819_200


def test_bad_inputs_name_the_field():
    a = get_arch("opt-66b")
    with pytest.raises(InputError, match="gpu_memory_utilization: 0.9 leaves no KV cache"):
        memory_split(a, get_gpu("l4"), 0.9, 8)
    with pytest.raises(InputError, match="gpu_memory_utilization: expected a fraction"):
        memory_split(get_arch("opt-125m"), H100_64, 1.5, 8)
    with pytest.raises(InputError, match="max_num_seqs"):
        memory_split(get_arch("opt-125m"), H100_64, 0.5, 0)
    with pytest.raises(InputError, match="kv_tokens: .* above the bound"):
        utilization_for_kv_tokens(get_arch("llama-2-7b"), H100_64, 10_000_000, 8)


def test_memory_cli_json(capsys):
    assert main(["memory", "--model", "llama-2-7b", "--gpu", "h100-64gb", "--max-num-seqs", "64",
                 "--max-num-batched-tokens", "2048", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("kv_capacity_tokens", "non_kv_bytes", "weights_bytes", "gpu_memory_utilization"):
        assert key in out
    assert out["kv_capacity_tokens"] == pytest.approx(90544, rel=0.002)
    assert main(["memory", "--model", "llama-2-7b", "--gpu", "h100-64gb", "--max-num-seqs", "64",
                 "--kv-tokens", "20000", "--json"]) == 0
    inv = json.loads(capsys.readouterr().out)
    assert inv["kv_capacity_tokens"] >= 20000 and inv["gpu_memory_utilization"] < 0.5


def test_every_profile_row_within_two_percent(profiles_csv):
    from kneecap.model.memory import default_max_num_batched_tokens
    worst = 0.0
    for r in csv.DictReader(profiles_csv.open()):
        if not r["kv_capacity_tokens"]:
            continue
        budget = int(r["max_num_batched_tokens"]) if r["max_num_batched_tokens"] else \
            default_max_num_batched_tokens(int(r["max_model_len"]), r["chunked_prefill"] == "True")
        split = memory_split(get_arch(r["model"]), H100_64, float(r["gpu_memory_utilization"]),
                             int(r["max_num_seqs"]), budget)
        worst = max(worst, abs(split.kv_capacity_tokens / int(r["kv_capacity_tokens"]) - 1))
    assert worst < 0.02


def test_memory_cli_token_budget_follows_the_served_context(capsys):
    """data/real-h100/profiles.csv: llama-2-7b served at max_model_len 2048 (its context is 4096),
    max_num_seqs 64, no token budget given: vLLM reported 90544 KV tokens. The budget is vLLM's
    default for the served context (2048), not the model's (4096)."""
    base = ["memory", "--model", "llama-2-7b", "--gpu", "h100-64gb", "--max-num-seqs", "64", "--json"]
    assert main([*base, "--max-model-len", "2048"]) == 0
    served = json.loads(capsys.readouterr().out)
    assert served["max_num_batched_tokens"] == 2048 and served["max_model_len"] == 2048
    assert served["kv_capacity_tokens"] == pytest.approx(90544, rel=0.0005)
    assert main(base) == 0
    context = json.loads(capsys.readouterr().out)
    assert context["max_num_batched_tokens"] == 4096
    assert abs(context["kv_capacity_tokens"] / 90544 - 1) > 0.003  # the error --max-model-len removes
    assert main([*base, "--max-model-len", "8192"]) == 2
    assert "expected 1 to 4096 (the context of llama-2-7b)" in capsys.readouterr().err
