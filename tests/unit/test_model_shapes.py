"""Any model, any GPU: the extended catalogs, MoE and MLA shapes, and what the memory split and
the SLIM prior make of a model outside the catalog and of an MoE (checked against hand counts)."""

from __future__ import annotations

import numpy as np
import pytest

from kneecap.control.spec import parse_spec
from kneecap.errors import InputError
from kneecap.model import calibrate, memory, slim
from kneecap.model.arch import CATALOG, arch_from_hf_config, get_arch
from kneecap.model.hardware import GPUS, get_gpu

GB = 1e9


def test_every_catalog_entry_names_its_source():
    assert all(a.source for a in CATALOG.values()), [k for k, a in CATALOG.items() if not a.source]
    assert all(g.source for g in GPUS.values()), [k for k, g in GPUS.items() if not g.source]


def test_catalog_has_the_current_families_and_gpus():
    assert {"llama-3.1-8b", "llama-3.1-70b", "llama-3.2-1b", "llama-3.2-3b", "llama-3.3-70b", "qwen2.5-7b",
            "qwen2.5-72b", "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b", "mistral-7b",
            "mixtral-8x7b", "gemma-2-9b", "gemma-2-27b", "gemma-3-12b", "gemma-3-27b", "deepseek-v2-lite",
            "deepseek-v3"} <= set(CATALOG)
    assert {"l4", "a10g", "l40s", "a100-40gb", "a100-80gb", "h100-80gb", "h100-pcie-80gb", "h100-64gb", "h200",
            "b200", "mi300x"} <= set(GPUS)
    assert get_gpu("h100-sxm") is GPUS["h100-80gb"] and get_gpu("H100-64GB") is GPUS["h100-64gb"]
    assert get_arch("Qwen/Qwen3-30B-A3B") is CATALOG["qwen3-30b-a3b"]
    assert get_arch("mistralai/Mixtral-8x7B-Instruct-v0.1") is CATALOG["mixtral-8x7b"]


@pytest.mark.parametrize("key", [k for k, a in CATALOG.items() if a.gated_ffn])
def test_published_parameter_counts_follow_from_the_shapes(key):
    """Each published count is what the shape gives (the shape and the count were typed apart);
    Gemma 3's published count includes its ~0.42 B vision tower."""
    from kneecap.model.arch import mla_attention_params, params_from_shape

    a = CATALOG[key]
    attn = None
    if a.kv_latent_dim:  # DeepSeek MLA: kv_lora_rank 512, rope 64, nope 128, v 128; V3 has q_lora_rank 1536
        attn = mla_attention_params(a.hidden, a.q_heads, 512, 1536 if key == "deepseek-v3" else None, 128, 64, 128)
    est = params_from_shape(a.layers, a.hidden, a.d_kv, a.ffn, True, a.vocab, a.tied, q_dim=a.q_heads * a.head_dim,
                            num_experts=a.num_experts, moe_ffn=a.moe_ffn, shared_expert_ffn=a.shared_expert_ffn,
                            dense_layers=a.dense_layers, attn_params=attn)
    if key.startswith("gemma-3"):
        assert a.params - est == pytest.approx(0.42e9, rel=0.05)
    else:
        assert est == pytest.approx(a.params, rel=2e-3)


@pytest.mark.parametrize("key,active_b", [("mixtral-8x7b", 12.9), ("qwen3-30b-a3b", 3.3), ("qwen3-235b-a22b", 22.0),
                                          ("deepseek-v3", 37.0)])
def test_moe_active_parameters_match_the_model_cards(key, active_b):
    assert get_arch(key).active_params / 1e9 == pytest.approx(active_b, rel=0.025)


def test_mla_and_gqa_kv_bytes_per_token():
    # DeepSeek-V2-Lite: one latent of kv_lora_rank 512 + rope 64 per layer, 27 layers, bf16
    assert get_arch("deepseek-v2-lite").kv_bytes_per_token == 27 * 576 * 2 == 31_104
    # Qwen3-8B: 2 (K, V) x 36 layers x 8 KV heads x 128 x 2 bytes; Gemma 2 9B: head_dim 256
    assert get_arch("qwen3-8b").kv_bytes_per_token == 2 * 36 * 8 * 128 * 2
    assert get_arch("gemma-2-9b").kv_bytes_per_token == 2 * 42 * 8 * 256 * 2
    # SARA's g·γ is the cache's bytes per token whatever Hq·dh is
    a = get_arch("qwen3-32b")
    assert a.gqa_factor * a.kv_bytes_per_token_mha == a.kv_bytes_per_token


MIXTRAL_CONFIG = {  # mistralai/Mixtral-8x7B-v0.1 config.json (fields that matter)
    "model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000, "num_local_experts": 8,
    "num_experts_per_tok": 2, "hidden_act": "silu", "max_position_embeddings": 32768, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
QWEN3_MOE_CONFIG = {  # Qwen/Qwen3-30B-A3B config.json
    "model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "vocab_size": 151936, "hidden_act": "silu", "max_position_embeddings": 40960, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
DEEPSEEK_V2_LITE_CONFIG = {  # deepseek-ai/DeepSeek-V2-Lite config.json
    "model_type": "deepseek_v2", "hidden_size": 2048, "num_hidden_layers": 27, "num_attention_heads": 16,
    "num_key_value_heads": 16, "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_routed_experts": 64,
    "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1, "kv_lora_rank": 512,
    "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "vocab_size": 102400, "hidden_act": "silu", "max_position_embeddings": 163840, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
GEMMA3_27B_CONFIG = {  # google/gemma-3-27b-it config.json: the language model under text_config
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "torch_dtype": "bfloat16",
    "text_config": {"model_type": "gemma3_text", "hidden_size": 5376, "num_hidden_layers": 62,
                    "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
                    "intermediate_size": 21504, "vocab_size": 262208, "hidden_activation": "gelu_pytorch_tanh",
                    "max_position_embeddings": 131072, "sliding_window": 1024},
}

_SHAPE = ("layers", "hidden", "q_heads", "kv_heads", "head_dim", "ffn", "gated_ffn", "vocab", "tied", "num_experts",
          "experts_per_token", "moe_ffn", "shared_expert_ffn", "dense_layers", "kv_latent_dim", "kv_bytes_per_token")


@pytest.mark.parametrize("config,key,rel", [(MIXTRAL_CONFIG, "mixtral-8x7b", 1e-3), (QWEN3_MOE_CONFIG, "qwen3-30b-a3b", 1e-3),
                                            (DEEPSEEK_V2_LITE_CONFIG, "deepseek-v2-lite", 1e-3),
                                            (GEMMA3_27B_CONFIG, "gemma-3-27b", 0.02)])
def test_hf_configs_of_moe_mla_and_multimodal_models_give_the_catalog_shape(config, key, rel):
    a, ref = arch_from_hf_config(config, key="x"), get_arch(key)
    assert {f: getattr(a, f) for f in _SHAPE} == {f: getattr(ref, f) for f in _SHAPE}
    assert a.params == pytest.approx(ref.params, rel=rel)  # Gemma 3: the text model, without its vision tower


def test_quantised_checkpoint_weight_bytes():
    cfg = {**MIXTRAL_CONFIG, "quantization_config": {"quant_method": "awq", "bits": 4}}
    a = arch_from_hf_config(cfg)
    assert a.bytes_per_weight == 0.5 and a.weight_bytes == a.params * 0.5 and a.kv_bytes_per_token == 131_072
    with pytest.raises(InputError, match="config.num_local_experts"):
        arch_from_hf_config({**MIXTRAL_CONFIG, "num_local_experts": 2.5})


# ---------------------------------------------------------------- a model outside the catalog

HOUSE = {"hiddenSize": 5120, "numLayers": 48, "numAttentionHeads": 40, "numKeyValueHeads": 8,
         "intermediateSize": 13824, "vocabSize": 100352}
GPU_SHAPE = {"name": "h100-nvl", "memoryGiB": 93.1, "bandwidthGBps": 3900, "peakDenseTFLOPS": 835}
BASE = {"engine": {"image": "vllm/vllm-openai:v0.11.0"}}


def _house():
    s = parse_spec({**BASE, "model": {"name": "acme/house-14b", "shape": HOUSE}, "accelerator": {"shape": GPU_SHAPE}})
    return s.model.architecture, s.accelerator.gpu


def test_memory_split_of_a_model_outside_the_catalog_matches_the_hand_count():
    arch, gpu = _house()
    params = 48 * (2 * 5120**2 + 2 * 5120 * 1024 + 3 * 5120 * 13824 + 4 * 5120) + 2 * 100352 * 5120
    kv_per_token = 2 * 48 * (8 * 128) * 2  # K and V, 48 layers, 8 KV heads x 128, bf16
    split = memory.memory_split(arch, gpu, 0.9, 256, max_num_batched_tokens=8192)
    assert split.weights_bytes == params * 2 == pytest.approx(28.48e9, rel=1e-3)
    assert arch.kv_bytes_per_token == kv_per_token == 196_608
    # reserve: base + max(activations a·D·T, sampler s·V·S) (memory.py), then whole 16-token blocks
    reserve = memory.RESERVE_BASE_BYTES + max(memory.ACTIVATION_BYTES_PER_HIDDEN_TOKEN * 5120 * 8192,
                                              memory.SAMPLER_BYTES_PER_VOCAB_SEQ * 100352 * 256)
    blocks = int((93.1 * 2**30 * 0.9 - params * 2 - reserve) // (16 * kv_per_token))
    assert split.num_gpu_blocks == blocks and split.kv_capacity_tokens == 16 * blocks
    assert 280_000 < split.kv_capacity_tokens < 320_000  # ~56 GiB of KV at 192 KiB per token


def _prior(gpu):
    pri = calibrate.form_priors("kneecap", gpu)
    return slim.SlimParams(**{k: pri[k].center for k in slim.FORM_PARAMS["kneecap"]})


def test_slim_prior_of_a_model_outside_the_catalog_matches_the_hand_calculation():
    arch, gpu = _house()
    p = _prior(gpu)
    il, ol = 512.0, 256.0
    pred = slim.predict("kneecap", p, arch, gpu, 1.0, il, ol)
    # by hand, kneecap form at B = 1 (slim.py): prefill eqs 7–8, per-step floor + weight read, eq. 10, eqs 11–12
    D, L, Dkv, r_ff = 5120.0, 48.0, 1024.0, 13824 / 5120 * 1.5
    t_pre = L * (il * (4 * D * D + 4 * D * Dkv + 4 * r_ff * D * D) + 4 * il * il * D) / (p.eta_c * 835e12)
    w_read = arch.weight_bytes - 100352 * 5120 * 2  # the untied input table is gathered, not streamed
    t_step = p.t_step_s + p.t_layer_s * L + w_read / (p.eta_w * 3.9e12)
    t_d = p.alpha_s * ol + p.gamma_s * L * (D / 1024) ** 2 * ol
    m_dec = 196_608 * (ol * (il + 1) + ol * (ol - 1) / 2)
    e2e = t_pre + ol * t_step + t_d + m_dec / (p.eta_m * 3.9e12) + p.t_fixed_s
    assert float(pred.e2e_s) == pytest.approx(e2e, rel=1e-12)
    assert float(pred.throughput_tok_s) == pytest.approx((il + ol) / e2e, rel=1e-12)
    # sensible: at B = 1 a token costs one read of the 27.45 GB streamed weights at 0.9 x 3.9 TB/s
    # (7.8 ms) plus the prior's kernel floor (48 layers x 80 µs): ~11.8 ms
    assert w_read == pytest.approx(27.45e9, rel=1e-3)
    tpot_s = (e2e - t_pre - p.t_fixed_s) / ol
    assert w_read / 3.9e12 < tpot_s < 2 * w_read / 3.9e12


# ---------------------------------------------------------------- MoE

def test_mixtral_weight_read_at_batch_1_is_two_of_eight_experts_plus_the_rest():
    """Hand count: attention Q,O 2·4096² and K,V 2·4096·1024 per layer, 2 experts of 3·4096·14336,
    router 4096·8 and norms 2·4096 per layer, the final norm and the LM head 32000·4096 (the
    input table is gathered, not streamed); bf16."""
    a = get_arch("mixtral-8x7b")
    aa = slim.arch_arrays(a)
    expert = 3 * 4096 * 14336
    per_layer = 2 * 4096**2 + 2 * 4096 * 1024 + 2 * expert + 4096 * 8 + 2 * 4096
    hand = (32 * per_layer + 4096 + 32000 * 4096) * 2
    assert float(slim.weight_read_bytes(aa, 1)) == pytest.approx(hand, rel=2e-4)  # published 46.7e9 rounds
    assert hand / 1e9 == pytest.approx(25.5, abs=0.05)
    # B tokens route to E·(1 − (1 − k/E)^B) distinct experts per layer: 3.5 at B = 2, 7.97 at B = 16
    b = np.array([1, 2, 4, 8, 16, 64, 256])
    distinct = slim.distinct_experts(8, 2, b)
    np.testing.assert_allclose(distinct, 8 * (1 - 0.75**b))
    assert distinct[1] == 3.5 and distinct[4] == pytest.approx(7.9198, abs=1e-4)
    w = slim.weight_read_bytes(aa, b)
    assert np.all(np.diff(w) > 0)
    everything = a.weight_bytes - 32000 * 4096 * 2  # every expert, no input table
    assert float(w[-1]) == pytest.approx(everything, rel=1e-9) and float(w[4]) / everything > 0.99
    # a dense model reads the same bytes at every batch
    d = slim.arch_arrays(get_arch("llama-3.1-70b"))
    assert float(slim.weight_read_bytes(d, 1)) == float(slim.weight_read_bytes(d, 256))


def test_moe_memory_split_holds_every_expert():
    a = get_arch("mixtral-8x7b")
    with pytest.raises(InputError, match="leaves no KV cache"):  # 93.4 GB of weights on an 80 GB H100
        memory.memory_split(a, get_gpu("h100-80gb"), 0.9, 256)
    split = memory.memory_split(a, get_gpu("h200"), 0.9, 256, max_num_batched_tokens=8192)
    assert split.weights_bytes == a.params * 2 == pytest.approx(93.4e9, rel=1e-3)
    assert a.kv_bytes_per_token == 131_072
    assert split.kv_capacity_tokens == 16 * int((139.8 * 2**30 * 0.9 - split.non_kv_bytes) // (16 * 131_072))


def test_moe_decode_in_the_slim_prior_costs_its_active_experts():
    """At B = 1 Mixtral's decode step costs about what a 12.9 B dense model's does (its active
    weights), far less than one reading all 46.7 B; at large B the expert reads saturate."""
    gpu = get_gpu("h200")
    p = _prior(gpu)
    moe = slim.arch_arrays(get_arch("mixtral-8x7b"))
    step = lambda aa, b: p.t_step_s + p.t_layer_s * aa.layers + slim.weight_read_bytes(aa, b) / (p.eta_w * gpu.mem_bw_bytes_s)  # noqa: E731
    w1, w256 = float(slim.weight_read_bytes(moe, 1)), float(slim.weight_read_bytes(moe, 256))
    assert w256 / w1 == pytest.approx(93.14 / 25.50, rel=1e-3)  # every expert vs 2 of 8
    assert 2.5 < float(step(moe, 256)) / float(step(moe, 1)) < w256 / w1  # the per-layer floor is shared
    thr = slim.predict("kneecap", p, "mixtral-8x7b", gpu, np.array([1.0, 256.0]), 512, 256).throughput_tok_s
    # B = 1: a decode step is the floor + 25.5 GB at 0.9 x 4.8 TB/s (8.5 ms); the output rate is just
    # under 1/step (prefill and t_fixed add to E2E); 46.7 B dense would need 3.65x the weight read
    rate = float(thr[0]) * 256 / 768
    assert 0.9 / float(step(moe, 1)) < rate < 1.0 / float(step(moe, 1))
    assert float(thr[1]) / float(thr[0]) > 20  # batching still pays while the experts saturate


def test_gauss_step_cost_reads_every_expert():
    from kneecap.model import gauss

    a, gpu = get_arch("mixtral-8x7b"), get_gpu("h200")
    coef = gauss.coefficients_for(a, gpu, _prior(gpu))
    p = _prior(gpu)
    w = (coef.decode_step_s - p.t_step_s - p.t_layer_s * 32) * p.eta_w * gpu.mem_bw_bytes_s
    assert w == pytest.approx(a.weight_bytes - 32000 * 4096 * 2, rel=1e-9)


@pytest.mark.parametrize("model,gpu", [("qwen3-30b-a3b", "mi300x"), ("mixtral-8x7b", "h200"), ("gemma-3-27b", "b200"),
                                       ("llama-3.2-1b", "l4"), ("Qwen/Qwen3-8B", "a10g"), ("deepseek-v2-lite", "h100-pcie")])
def test_cli_memory_takes_the_new_keys(model, gpu, capsys):
    import json

    from kneecap.cli import main

    assert main(["memory", "--model", model, "--gpu", gpu, "--max-num-seqs", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    a, g = get_arch(model), get_gpu(gpu)
    assert out["weights_bytes"] == a.weight_bytes and out["total_bytes"] == g.memory_bytes
    assert out["kv_capacity_tokens"] * a.kv_bytes_per_token == out["kv_bytes"]


def test_twin_step_reads_the_routed_experts():
    """The twin's roofline (sim/roofline.py) at one decode token reads 2 of Mixtral's 8 experts;
    at 256 tokens all of them (1 − 0.75^256 ≈ 1), memory-bound both times on an H200."""
    from kneecap.sim.roofline import DEFAULT_STEP_COST, step_time_s

    a, gpu = get_arch("mixtral-8x7b"), get_gpu("h200")
    routed = a.routed_expert_params * 2
    for n, weights in ((1, a.weight_bytes - routed * 0.75), (256, a.weight_bytes)):
        t = step_time_s(a, gpu, num_seqs=n, num_tokens=n, kv_read_tokens=0.0, attn_flops=0.0, has_prefill=False)
        assert t == pytest.approx(DEFAULT_STEP_COST.step_overhead_s + DEFAULT_STEP_COST.per_seq_overhead_s * n
                                  + weights / (DEFAULT_STEP_COST.bw_efficiency * gpu.mem_bw_bytes_s), rel=1e-9), n
    assert (a.weight_bytes - routed * 0.75) / 1e9 == pytest.approx(25.76, abs=0.01)  # the twin streams the input table too
