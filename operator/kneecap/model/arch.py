"""Transformer shapes: what the performance and memory models need to know about a model.

Symbols follow DESIGN.md §5: L layers, D hidden size, Hq query heads, Hkv KV heads, dh head
dim, D_kv = Hkv·dh, r_ff = D_ff/D (×1.5 for gated MLPs, which have three matrices).

Mixture-of-experts models (Mixtral, Qwen3-MoE, DeepSeek) carry E routed experts of width
D_e per MoE layer, k of which each token uses, plus optional always-on shared experts and
leading dense layers. Multi-head latent attention (DeepSeek MLA) caches one compressed latent
of ``kv_latent_dim`` elements per token and layer instead of K and V.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np

from kneecap.errors import InputError

GIB = 1024**3


@dataclass(frozen=True)
class ModelArch:
    """Shape of a decoder-only transformer served by vLLM."""

    key: str
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # dense MLP width (the dense layers' width in an MoE with leading dense layers)
    gated_ffn: bool
    vocab: int
    params: float  # parameter count, as published (or estimated from the shape); all experts
    dtype_bytes: int = 2  # bytes per activation / KV-cache element (b_kv)
    max_position: int | None = None
    nominal_params: float | None = None  # the size in the model's name (SARA Table I uses it)
    tied_embeddings: bool | None = None  # None: tied unless the MLP is gated (OPT vs the Llama family)
    num_experts: int = 0  # routed experts per MoE layer (0: dense model)
    experts_per_token: int = 0  # k: routed experts each token uses
    moe_ffn: int = 0  # width of one routed expert (0: ffn)
    shared_expert_ffn: int = 0  # total width of the always-on shared experts per MoE layer
    dense_layers: int = 0  # leading layers with a dense MLP (DeepSeek first_k_dense_replace)
    kv_latent_dim: int = 0  # MLA: cached elements per token and layer (kv_lora_rank + rope dim)
    weight_dtype_bytes: float | None = None  # bytes per weight when quantised (None: dtype_bytes)
    source: str = ""  # where the shape comes from (Hugging Face repo id of its config.json)

    def __post_init__(self):
        for name in ("layers", "hidden", "q_heads", "kv_heads", "head_dim", "ffn", "vocab", "dtype_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
                raise InputError(f"arch.{name}", f"expected a positive integer, got {value!r}")
        if self.q_heads % self.kv_heads:
            raise InputError("arch.kv_heads", f"must divide q_heads ({self.q_heads}), got {self.kv_heads}")
        if not self.params > 0:
            raise InputError("arch.params", f"expected a positive count, got {self.params!r}")
        for name in ("num_experts", "experts_per_token", "moe_ffn", "shared_expert_ffn", "dense_layers",
                     "kv_latent_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise InputError(f"arch.{name}", f"expected a non-negative integer, got {value!r}")
        if self.num_experts and not 1 <= self.experts_per_token <= self.num_experts:
            raise InputError("arch.experts_per_token",
                             f"expected 1..num_experts ({self.num_experts}), got {self.experts_per_token}")
        if not self.num_experts and (self.experts_per_token or self.moe_ffn or self.shared_expert_ffn):
            raise InputError("arch.num_experts", "expert fields are set but num_experts is 0")
        if self.dense_layers >= self.layers and self.num_experts:
            raise InputError("arch.dense_layers", f"expected fewer than layers ({self.layers}), got {self.dense_layers}")
        w = self.weight_dtype_bytes
        if w is not None and not (isinstance(w, (int, float)) and 0 < w <= 8):
            raise InputError("arch.weight_dtype_bytes", f"expected a number in (0, 8], got {w!r}")

    @property
    def d_kv(self) -> int:
        """D_kv = Hkv·dh (DESIGN §5): width of one layer's K (or V) per token."""
        return self.kv_heads * self.head_dim

    @property
    def tied(self) -> bool:
        return (not self.gated_ffn) if self.tied_embeddings is None else self.tied_embeddings

    @property
    def moe(self) -> bool:
        return self.num_experts > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.moe else 0

    @property
    def expert_params(self) -> float:
        """Parameters of one routed expert in one layer: 3·D·D_e (gated) or 2·D·D_e."""
        return float((3 if self.gated_ffn else 2) * self.hidden * (self.moe_ffn or self.ffn)) if self.moe else 0.0

    @property
    def routed_expert_params(self) -> float:
        """All routed experts of all MoE layers: what decode reads only in part."""
        return self.moe_layers * self.num_experts * self.expert_params

    @property
    def active_params(self) -> float:
        """Parameters one token uses: everything but the routed experts, plus k of them per layer."""
        return self.params - self.routed_expert_params + self.moe_layers * self.experts_per_token * self.expert_params

    @property
    def ffn_active(self) -> float:
        """MLP width one token passes through, averaged over layers (k·D_e + shared in MoE layers)."""
        if not self.moe:
            return float(self.ffn)
        moe_w = self.experts_per_token * (self.moe_ffn or self.ffn) + self.shared_expert_ffn
        return (self.dense_layers * self.ffn + self.moe_layers * moe_w) / self.layers

    @property
    def r_ff(self) -> float:
        """r_ff = D_ff/D, ×1.5 for gated MLPs (DESIGN §5); the active width for an MoE."""
        return self.ffn_active / self.hidden * (1.5 if self.gated_ffn else 1.0)

    @property
    def kv_bytes_per_token(self) -> int:
        """2·L·D_kv·b_kv (DESIGN §5.3; OPT-13B: 819,200); MLA: L·latent·b_kv (one latent, no V)."""
        if self.kv_latent_dim:
            return self.layers * self.kv_latent_dim * self.dtype_bytes
        return 2 * self.layers * self.d_kv * self.dtype_bytes

    @property
    def kv_bytes_per_token_mha(self) -> int:
        """2·L·D·b_kv: SARA's γ before the GQA factor g (SARA Table I)."""
        return 2 * self.layers * self.hidden * self.dtype_bytes

    @property
    def gqa_factor(self) -> float:
        """g = N_KV/N_head (SARA Table I), taken as KV bytes / MHA KV bytes so that g·γ is the
        cache's bytes per token also where Hq·dh ≠ D (Qwen3, Gemma) or under MLA."""
        return self.kv_bytes_per_token / self.kv_bytes_per_token_mha

    @property
    def bytes_per_weight(self) -> float:
        return float(self.weight_dtype_bytes or self.dtype_bytes)

    @property
    def weight_bytes(self) -> float:
        """All weights, every expert included: what the GPU holds."""
        return self.params * self.bytes_per_weight

    @property
    def nominal_weight_bytes(self) -> float:
        """Weights from the nominal size: SARA's Ω_LLM (Table I)."""
        return (self.nominal_params or self.params) * self.bytes_per_weight

    def with_dtype(self, dtype_bytes: int) -> "ModelArch":
        return replace(self, dtype_bytes=dtype_bytes)


def params_from_shape(
    layers: int, hidden: int, kv_dim: int, ffn: int, gated_ffn: bool, vocab: int,
    tied_embeddings: bool = True, learned_positions: int = 0, bias: bool = False, *,
    q_dim: int | None = None, num_experts: int = 0, moe_ffn: int = 0, shared_expert_ffn: int = 0,
    dense_layers: int = 0, attn_params: float | None = None,
) -> float:
    """Parameter count from the shape: embeddings (+ untied head) + per layer Q,O (D·Hq·dh each),
    K,V (D·D_kv each) and the MLP (2 or 3 matrices of D·D_ff); an MoE layer has E experts of
    D_e, shared experts and a D·E router instead. ``attn_params`` replaces the attention count
    (MLA). Biases and norms are O(L·D)."""
    qd = q_dim or hidden
    attn = attn_params if attn_params is not None else 2 * hidden * qd + 2 * hidden * kv_dim
    mats = 3 if gated_ffn else 2
    dense_mlp = mats * hidden * ffn
    small = (4 * hidden + 2 * kv_dim + ffn + hidden if bias else 0) + 4 * hidden
    emb = vocab * hidden * (1 if tied_embeddings else 2) + learned_positions * hidden
    if not num_experts:
        return float(layers * (attn + dense_mlp + small) + emb)
    moe_mlp = mats * hidden * (num_experts * (moe_ffn or ffn) + shared_expert_ffn) + hidden * num_experts
    return float(dense_layers * (attn + dense_mlp + small) + (layers - dense_layers) * (attn + moe_mlp + small) + emb)


def mla_attention_params(hidden: int, heads: int, kv_lora_rank: int, q_lora_rank: int | None,
                         qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int) -> float:
    """One layer's MLA projections (DeepSeek-V2 §2.1): Q (direct, or through a q_lora_rank
    bottleneck), the joint KV down-projection with the decoupled rope key, the KV
    up-projection and the output."""
    qk = qk_nope_head_dim + qk_rope_head_dim
    q = hidden * heads * qk if not q_lora_rank else hidden * q_lora_rank + q_lora_rank * heads * qk
    kv_down = hidden * (kv_lora_rank + qk_rope_head_dim)
    kv_up = kv_lora_rank * heads * (qk_nope_head_dim + v_head_dim)
    return float(q + kv_down + kv_up + heads * v_head_dim * hidden)


def _opt(key, layers, hidden, heads, params, nominal):
    return ModelArch(key, layers, hidden, heads, heads, hidden // heads, 4 * hidden, False,
                     50272, params, max_position=2048, nominal_params=nominal, source=f"facebook/{key}")


def _gated(key, layers, hidden, q, kv, ffn, vocab, params, max_pos, nominal, head_dim=None, *, source,
           tied=None, moe=(0, 0, 0), shared=0, dense_layers=0, kv_latent=0, weight_bytes=None):
    experts, k, moe_ffn = moe
    return ModelArch(key, layers, hidden, q, kv, head_dim or hidden // q, ffn, True, vocab, params,
                     max_position=max_pos, nominal_params=nominal, tied_embeddings=tied, num_experts=experts,
                     experts_per_token=k, moe_ffn=moe_ffn, shared_expert_ffn=shared, dense_layers=dense_layers,
                     kv_latent_dim=kv_latent, weight_dtype_bytes=weight_bytes, source=source)


# Shapes from each model's Hugging Face config.json (``source``: the repo id); parameter counts
# as published on the model card / safetensors index (all experts; Gemma 3 with its vision
# tower). Sliding-window layers (Mistral, Gemma 2/3) are counted as full attention: an upper
# bound on KV bytes per token. DeepSeek's MLA is modelled by its cached latent (kv_lora_rank 512
# + rope 64 per layer); its attention FLOPs are approximated by heads × (128 + 64).
CATALOG: Mapping[str, ModelArch] = MappingProxyType({a.key: a for a in [
    _opt("opt-125m", 12, 768, 12, 125.2e6, 125e6),
    _opt("opt-350m", 24, 1024, 16, 331.2e6, 350e6),
    _opt("opt-1.3b", 24, 2048, 32, 1.316e9, 1.3e9),
    _opt("opt-2.7b", 32, 2560, 32, 2.652e9, 2.7e9),
    _opt("opt-6.7b", 32, 4096, 32, 6.658e9, 6.7e9),
    _opt("opt-13b", 40, 5120, 40, 12.853e9, 13e9),
    _opt("opt-30b", 48, 7168, 56, 29.975e9, 30e9),
    _opt("opt-66b", 64, 9216, 72, 65.7e9, 66e9),
    _gated("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 6.738e9, 4096, 7e9, source="meta-llama/Llama-2-7b-hf"),
    _gated("llama-2-13b", 40, 5120, 40, 40, 13824, 32000, 13.016e9, 4096, 13e9, source="meta-llama/Llama-2-13b-hf"),
    _gated("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 68.977e9, 4096, 70e9, source="meta-llama/Llama-2-70b-hf"),
    _gated("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, 8.030e9, 131072, 8e9, source="meta-llama/Llama-3.1-8B"),
    _gated("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256, 70.554e9, 131072, 70e9,
           source="meta-llama/Llama-3.1-70B"),
    _gated("llama-3.2-1b", 16, 2048, 32, 8, 8192, 128256, 1.236e9, 131072, 1e9, head_dim=64, tied=True,
           source="meta-llama/Llama-3.2-1B"),
    _gated("llama-3.2-3b", 28, 3072, 24, 8, 8192, 128256, 3.213e9, 131072, 3e9, head_dim=128, tied=True,
           source="meta-llama/Llama-3.2-3B"),
    _gated("llama-3.3-70b", 80, 8192, 64, 8, 28672, 128256, 70.554e9, 131072, 70e9,
           source="meta-llama/Llama-3.3-70B-Instruct"),
    _gated("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 7.242e9, 32768, 7e9, source="mistralai/Mistral-7B-v0.1"),
    _gated("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 46.703e9, 32768, 46.7e9, moe=(8, 2, 14336),
           source="mistralai/Mixtral-8x7B-v0.1"),
    _gated("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, 7.616e9, 131072, 7e9, source="Qwen/Qwen2.5-7B"),
    _gated("qwen2.5-32b", 64, 5120, 40, 8, 27648, 152064, 32.764e9, 131072, 32e9, source="Qwen/Qwen2.5-32B"),
    _gated("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064, 72.706e9, 131072, 72e9, source="Qwen/Qwen2.5-72B"),
    _gated("qwen3-8b", 36, 4096, 32, 8, 12288, 151936, 8.191e9, 40960, 8e9, head_dim=128, tied=False,
           source="Qwen/Qwen3-8B"),
    _gated("qwen3-32b", 64, 5120, 64, 8, 25600, 151936, 32.762e9, 40960, 32e9, head_dim=128, tied=False,
           source="Qwen/Qwen3-32B"),
    _gated("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, 30.532e9, 40960, 30e9, head_dim=128, tied=False,
           moe=(128, 8, 768), source="Qwen/Qwen3-30B-A3B"),
    _gated("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 151936, 235.094e9, 40960, 235e9, head_dim=128, tied=False,
           moe=(128, 8, 1536), source="Qwen/Qwen3-235B-A22B"),
    _gated("gemma-2-9b", 42, 3584, 16, 8, 14336, 256000, 9.242e9, 8192, 9e9, head_dim=256, tied=True,
           source="google/gemma-2-9b"),
    _gated("gemma-2-27b", 46, 4608, 32, 16, 36864, 256000, 27.227e9, 8192, 27e9, head_dim=128, tied=True,
           source="google/gemma-2-27b"),
    _gated("gemma-3-12b", 48, 3840, 16, 8, 15360, 262208, 12.187e9, 131072, 12e9, head_dim=256, tied=True,
           source="google/gemma-3-12b-it (text_config)"),
    _gated("gemma-3-27b", 62, 5376, 32, 16, 21504, 262208, 27.432e9, 131072, 27e9, head_dim=128, tied=True,
           source="google/gemma-3-27b-it (text_config)"),
    _gated("deepseek-v2-lite", 27, 2048, 16, 16, 10944, 102400, 15.706e9, 163840, 16e9, head_dim=192, tied=False,
           moe=(64, 6, 1408), shared=2 * 1408, dense_layers=1, kv_latent=512 + 64,
           source="deepseek-ai/DeepSeek-V2-Lite"),
    _gated("deepseek-v3", 61, 7168, 128, 128, 18432, 129280, 671e9, 163840, 671e9, head_dim=192, tied=False,
           moe=(256, 8, 2048), shared=2048, dense_layers=3, kv_latent=512 + 64, weight_bytes=1,
           source="deepseek-ai/DeepSeek-V3 (FP8 weights, BF16 KV cache)"),
    _gated("granite-8b", 40, 4096, 32, 8, 12800, 49155, 8.171e9, 131072, 8e9, tied=True,
           source="ibm-granite/granite-3.0-8b-instruct"),
    ModelArch("gpt-3-175b", 96, 12288, 96, 96, 128, 49152, False, 50257, 175e9,
              max_position=2048, nominal_params=175e9, source="Brown et al. 2020, Table 2.1 (no config.json)"),
]})

ALIASES = MappingProxyType({
    "llama-3-8b": "llama-3.1-8b", "gpt3-175b": "gpt-3-175b", "mixtral-8x7b-instruct": "mixtral-8x7b",
    "meta-llama/llama-3.1-8b-instruct": "llama-3.1-8b", "meta-llama/llama-3.1-70b-instruct": "llama-3.1-70b",
    "meta-llama/llama-3.2-1b-instruct": "llama-3.2-1b", "meta-llama/llama-3.2-3b-instruct": "llama-3.2-3b",
    "mistralai/mistral-7b-instruct-v0.1": "mistral-7b", "mistralai/mixtral-8x7b-instruct-v0.1": "mixtral-8x7b",
    "google/gemma-2-9b-it": "gemma-2-9b", "google/gemma-2-27b-it": "gemma-2-27b",
    "google/gemma-3-12b-it": "gemma-3-12b", "google/gemma-3-27b-it": "gemma-3-27b",
    "deepseek-ai/deepseek-v2-lite-chat": "deepseek-v2-lite",
    **{f"qwen/qwen2.5-{s}-instruct": f"qwen2.5-{s}" for s in ("7b", "32b", "72b")},
    # each entry's own source repo id
    **{a.source.split(" ")[0].lower(): a.key for a in CATALOG.values() if "/" in a.source},
})


def get_arch(key: "str | ModelArch") -> ModelArch:
    """Catalog lookup by key (case-insensitive, Hugging Face ids accepted); a ModelArch passes through."""
    if isinstance(key, ModelArch):
        return key
    k = str(key).strip().lower()
    k = ALIASES.get(k, k)
    if k not in CATALOG:
        raise InputError("model", f"unknown model {key!r}; expected one of {', '.join(sorted(CATALOG))}")
    return CATALOG[k]


_DTYPE_BYTES = MappingProxyType({"float16": 2, "bfloat16": 2, "float32": 4, "float8": 1, "fp8": 1, "half": 2})
# model types whose MLP is two matrices with a plain activation (no gate)
_UNGATED = frozenset({"opt", "gpt2", "gptj", "gpt_neox", "gpt_bigcode", "bloom", "falcon", "phi", "starcoder2"})


def _weight_dtype_bytes(config: dict) -> float | None:
    """Bytes per weight of a quantised checkpoint (``quantization_config``), else None."""
    q = config.get("quantization_config")
    if not isinstance(q, dict):
        return None
    method = str(q.get("quant_method", "")).lower()
    if method in ("fp8", "fbgemm_fp8", "compressed-tensors") and "bits" not in q:
        return 1.0
    bits = q.get("bits") or q.get("w_bit")
    if isinstance(bits, (int, float)) and not isinstance(bits, bool) and 0 < bits <= 16:
        return bits / 8.0
    return None


def arch_from_hf_config(config: dict, key: str | None = None) -> ModelArch:
    """Shape from a Hugging Face ``config.json``: OPT, the Llama family (Llama, Mistral, Qwen,
    Granite, Gemma; a multimodal config's ``text_config``), MoE (Mixtral ``num_local_experts``,
    Qwen-MoE ``num_experts``/``moe_intermediate_size``, DeepSeek ``n_routed_experts`` with shared
    experts, leading dense layers and MLA). Errors name the config field."""
    if not isinstance(config, dict):
        raise InputError("config", "expected a JSON object")
    if isinstance(config.get("text_config"), dict):  # Gemma 3, Llava...: the language model's shape
        config = {**{k: v for k, v in config.items() if k != "text_config"}, **config["text_config"]}
    model_type = str(config.get("model_type", "")).lower()

    def need(*names):
        for n in names:
            if n in config and config[n] is not None:
                return config[n]
        raise InputError(f"config.{names[0]}", f"missing (model_type {model_type or '?'}); expected one of {names}")

    def count(*names, optional=False, default=0):
        value = config.get(names[0]) if optional else need(*names)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 0:
            raise InputError(f"config.{names[0]}", f"expected a non-negative integer, got {value!r}")
        return int(value)

    hidden = count("hidden_size", "d_model", "n_embd")
    layers = count("num_hidden_layers", "n_layer", "num_layers")
    q_heads = count("num_attention_heads", "n_head")
    if not (hidden and layers and q_heads):
        raise InputError("config.hidden_size", "hidden_size, num_hidden_layers and num_attention_heads must be positive")
    kv_heads = count("num_key_value_heads", optional=True) or q_heads
    vocab = count("vocab_size")
    is_opt = model_type == "opt" or "ffn_dim" in config
    ffn = count("ffn_dim", "intermediate_size", "n_inner") if is_opt else count("intermediate_size", "n_inner")
    gated = not is_opt and model_type not in _UNGATED
    tied = bool(config.get("tie_word_embeddings", True))
    max_pos = config.get("max_position_embeddings")
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float16").replace("torch.", "")
    if dtype not in _DTYPE_BYTES:
        raise InputError("config.torch_dtype", f"unsupported dtype {dtype!r}; expected one of {sorted(_DTYPE_BYTES)}")
    # MoE
    experts = (count("num_local_experts", optional=True) or count("n_routed_experts", optional=True)
               or count("num_experts", optional=True))
    k = count("num_experts_per_tok", optional=True) if experts else 0
    moe_ffn = (count("moe_intermediate_size", optional=True) or ffn) if experts else 0
    shared = 0
    if experts:
        shared = (count("shared_expert_intermediate_size", optional=True)
                  or count("n_shared_experts", optional=True) * (moe_ffn or ffn))
    dense_layers = count("first_k_dense_replace", optional=True) if experts else 0
    # MLA (DeepSeek-V2/V3): the cache holds kv_lora_rank + qk_rope_head_dim per token and layer
    kv_lora = count("kv_lora_rank", optional=True)
    attn_params = None
    head_dim = count("head_dim", optional=True) or hidden // q_heads
    if kv_lora:
        rope, nope = count("qk_rope_head_dim"), count("qk_nope_head_dim")
        head_dim = rope + nope
        attn_params = mla_attention_params(hidden, q_heads, kv_lora, count("q_lora_rank", optional=True),
                                           nope, rope, count("v_head_dim"))
    params = params_from_shape(layers, hidden, kv_heads * head_dim, ffn, gated, vocab, tied,
                               learned_positions=(int(max_pos) + 2) if is_opt and max_pos else 0, bias=is_opt,
                               q_dim=q_heads * head_dim, num_experts=experts, moe_ffn=moe_ffn,
                               shared_expert_ffn=shared, dense_layers=dense_layers, attn_params=attn_params)
    name = key or str(config.get("_name_or_path") or model_type or "custom").lower()
    return ModelArch(name, layers, hidden, q_heads, kv_heads, head_dim, ffn, gated, vocab, params,
                     dtype_bytes=_DTYPE_BYTES[dtype], max_position=int(max_pos) if max_pos else None,
                     tied_embeddings=tied, num_experts=experts, experts_per_token=k, moe_ffn=moe_ffn,
                     shared_expert_ffn=shared, dense_layers=dense_layers,
                     kv_latent_dim=kv_lora + count("qk_rope_head_dim") if kv_lora else 0,
                     weight_dtype_bytes=_weight_dtype_bytes(config), source=str(config.get("_name_or_path") or ""))
