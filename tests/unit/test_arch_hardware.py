import json

import pytest

from kneecap.errors import InputError
from kneecap.model.arch import CATALOG, GIB, arch_from_hf_config, get_arch, params_from_shape
from kneecap.observe.hf_config import load_hf_config
from kneecap.model.hardware import get_gpu

REQUIRED = ["opt-125m", "opt-350m", "opt-1.3b", "opt-2.7b", "opt-6.7b", "opt-13b", "opt-30b", "opt-66b",
            "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3.1-8b", "llama-3.1-70b", "mistral-7b",
            "qwen2.5-7b", "qwen2.5-32b", "qwen2.5-72b", "granite-8b", "gpt-3-175b"]


def test_catalog_covers_the_issue_list():
    assert set(REQUIRED) <= set(CATALOG)


def test_opt13b_kv_bytes_per_token_matches_pagedattention_paper():
    assert get_arch("opt-13b").kv_bytes_per_token == 819_200


def test_llama31_8b_sara_table1_shapes():
    a = get_arch("llama-3.1-8b")
    assert a.kv_bytes_per_token == 131_072
    # SARA Table I: γ = 4.883e-4 GiB/token before the GQA factor g = 0.25
    assert a.kv_bytes_per_token_mha / GIB == pytest.approx(4.883e-4, rel=1e-3)
    assert a.gqa_factor == 0.25
    assert a.weight_bytes / GIB == pytest.approx(14.90, rel=0.01)


def test_derived_quantities():
    a = get_arch("llama-2-7b")
    assert a.d_kv == 4096 and a.r_ff == pytest.approx(11008 / 4096 * 1.5)
    assert get_arch("opt-1.3b").r_ff == 4.0
    assert get_arch("llama-3.1-70b").d_kv == 1024


@pytest.mark.parametrize("key", ["opt-1.3b", "opt-13b", "llama-2-7b", "llama-3.1-8b", "mistral-7b", "qwen2.5-32b"])
def test_catalog_param_counts_agree_with_shapes(key):
    a = get_arch(key)
    opt = key.startswith("opt")
    est = params_from_shape(a.layers, a.hidden, a.d_kv, a.ffn, a.gated_ffn, a.vocab, tied_embeddings=opt,
                            learned_positions=2050 if opt else 0, bias=opt)
    assert est == pytest.approx(a.params, rel=0.01)


def test_hf_alias_and_unknown_key():
    assert get_arch("facebook/opt-1.3b") is CATALOG["opt-1.3b"]
    with pytest.raises(InputError, match="unknown model 'gpt-9'"):
        get_arch("gpt-9")


OPT_13B_CONFIG = {  # facebook/opt-13b config.json (fields that matter)
    "model_type": "opt", "hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 40,
    "ffn_dim": 20480, "vocab_size": 50272, "max_position_embeddings": 2048, "torch_dtype": "float16",
    "activation_function": "relu", "word_embed_proj_dim": 5120,
}
LLAMA_31_8B_CONFIG = {  # meta-llama/Llama-3.1-8B config.json (fields that matter)
    "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "hidden_act": "silu",
    "max_position_embeddings": 131072, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}


def test_load_opt_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(OPT_13B_CONFIG))
    a = load_hf_config(tmp_path, key="opt-13b-local")
    ref = get_arch("opt-13b")
    assert (a.layers, a.hidden, a.q_heads, a.kv_heads, a.head_dim, a.ffn, a.gated_ffn, a.vocab) == \
        (ref.layers, ref.hidden, ref.q_heads, ref.kv_heads, ref.head_dim, ref.ffn, ref.gated_ffn, ref.vocab)
    assert a.kv_bytes_per_token == 819_200
    assert a.params == pytest.approx(ref.params, rel=0.01)


def test_load_llama_config():
    a = arch_from_hf_config(LLAMA_31_8B_CONFIG, key="l8")
    assert (a.kv_heads, a.head_dim, a.gated_ffn, a.dtype_bytes) == (8, 128, True, 2)
    assert a.kv_bytes_per_token == get_arch("llama-3.1-8b").kv_bytes_per_token
    assert a.params == pytest.approx(8.03e9, rel=0.01)


def test_bad_config_names_the_field(tmp_path):
    cfg = dict(LLAMA_31_8B_CONFIG)
    del cfg["intermediate_size"]
    with pytest.raises(InputError, match="config.intermediate_size"):
        arch_from_hf_config(cfg)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_hf_config(tmp_path)


def test_gpu_catalog_and_overrides():
    g = get_gpu("h100-64gb")
    assert (g.peak_flops, g.mem_bw_bytes_s, g.memory_gib) == (989e12, 1.62e12, 63.43)
    for key in ["h100-80gb", "h100-pcie-80gb", "h200", "a100-40gb", "a100-80gb", "l40s", "l4"]:
        assert get_gpu(key).memory_gib > 20
    assert get_gpu("h100-80gb", cost_per_hour=2.5).cost_per_hour == 2.5
    with pytest.raises(InputError, match="unknown GPU"):
        get_gpu("tpu-v5")
    with pytest.raises(InputError, match="cannot override"):
        get_gpu("l4", key="x")
    with pytest.raises(InputError, match="gpu.mem_bw_bytes_s"):
        get_gpu("l4", mem_bw_bytes_s=-1)


@pytest.mark.parametrize("family,variants", [("h100", "h100-64gb, h100-80gb, h100-nvl, h100-pcie-80gb"),
                                             ("a100", "a100-40gb, a100-80gb")])
def test_a_gpu_family_name_alone_is_ambiguous(family, variants):
    """`--gpu h100` must not silently mean one H100: the data's is the 64 GB one (half the bandwidth)."""
    with pytest.raises(InputError) as exc:
        get_gpu(family)
    assert f"ambiguous GPU {family!r}: say which variant, one of {variants}" in str(exc.value)
    assert get_gpu("h100-sxm").key == "h100-80gb"  # an unambiguous spelling still resolves


def test_every_catalog_gpu_names_its_interconnect_with_a_source():
    """TP all-reduces run over the GPU's link: each entry carries one, and its source says which."""
    from kneecap.model.hardware import GPUS

    for g in GPUS.values():
        assert g.link_bw_bytes_s > 0 and g.link_latency_s > 0, g.key
        assert any(w in g.source for w in ("NVLink", "PCIe", "Infinity Fabric")), g.key
    # NVLink 4 (900 GB/s both ways) is 7× PCIe 5.0 x16 (128 GB/s both ways)
    assert get_gpu("h100-80gb").link_bw_bytes_s / get_gpu("h100-pcie-80gb").link_bw_bytes_s == pytest.approx(900 / 128)
    for key in ("a100-sxm4-80gb", "h100-sxm5-80gb", "h100-nvl", "h200", "rtx-4090", "rtx-pro-6000"):
        assert get_gpu(key).memory_gib > 20
    with pytest.raises(InputError, match="gpu.link_bw_bytes_s"):
        get_gpu("l4", link_bw_bytes_s=0)
