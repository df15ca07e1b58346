"""Transformer shapes: what the performance and memory models need to know about a model.

Symbols follow DESIGN.md §5: L layers, D hidden size, Hq query heads, Hkv KV heads, dh head
dim, D_kv = Hkv·dh, r_ff = D_ff/D (×1.5 for gated MLPs, which have three matrices).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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
    ffn: int
    gated_ffn: bool
    vocab: int
    params: float  # parameter count, as published (or estimated from the shape)
    dtype_bytes: int = 2
    max_position: int | None = None
    nominal_params: float | None = None  # the size in the model's name (SARA Table I uses it)

    def __post_init__(self):
        for name in ("layers", "hidden", "q_heads", "kv_heads", "head_dim", "ffn", "vocab", "dtype_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise InputError(f"arch.{name}", f"expected a positive integer, got {value!r}")
        if self.q_heads % self.kv_heads:
            raise InputError("arch.kv_heads", f"must divide q_heads ({self.q_heads}), got {self.kv_heads}")
        if not self.params > 0:
            raise InputError("arch.params", f"expected a positive count, got {self.params!r}")

    @property
    def d_kv(self) -> int:
        """D_kv = Hkv·dh (DESIGN §5): width of one layer's K (or V) per token."""
        return self.kv_heads * self.head_dim

    @property
    def gqa_factor(self) -> float:
        """g = N_KV/N_head (SARA Table I)."""
        return self.kv_heads / self.q_heads

    @property
    def r_ff(self) -> float:
        """r_ff = D_ff/D, ×1.5 for gated MLPs (DESIGN §5)."""
        return self.ffn / self.hidden * (1.5 if self.gated_ffn else 1.0)

    @property
    def kv_bytes_per_token(self) -> int:
        """2·L·D_kv·b_kv (DESIGN §5.3; OPT-13B: 819,200)."""
        return 2 * self.layers * self.d_kv * self.dtype_bytes

    @property
    def kv_bytes_per_token_mha(self) -> int:
        """2·L·D·b_kv: SARA's γ before the GQA factor g (SARA Table I)."""
        return 2 * self.layers * self.hidden * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @property
    def nominal_weight_bytes(self) -> float:
        """Weights from the nominal size: SARA's Ω_LLM (Table I)."""
        return (self.nominal_params or self.params) * self.dtype_bytes

    def with_dtype(self, dtype_bytes: int) -> "ModelArch":
        return replace(self, dtype_bytes=dtype_bytes)


def params_from_shape(
    layers: int, hidden: int, kv_dim: int, ffn: int, gated_ffn: bool, vocab: int,
    tied_embeddings: bool = True, learned_positions: int = 0, bias: bool = False,
) -> float:
    """Parameter count from the shape: embeddings (+ untied head) + per layer Q,O (D²), K,V
    (D·D_kv) and the MLP (2 or 3 matrices of D·D_ff). Biases and norms are O(L·D)."""
    attn = 2 * hidden * hidden + 2 * hidden * kv_dim
    mlp = (3 if gated_ffn else 2) * hidden * ffn
    small = (4 * hidden + 2 * kv_dim + ffn + hidden if bias else 0) + 4 * hidden
    emb = vocab * hidden * (1 if tied_embeddings else 2) + learned_positions * hidden
    return float(layers * (attn + mlp + small) + emb)


def _opt(key, layers, hidden, heads, params, nominal):
    return ModelArch(key, layers, hidden, heads, heads, hidden // heads, 4 * hidden, False,
                     50272, params, max_position=2048, nominal_params=nominal)


def _gated(key, layers, hidden, q, kv, ffn, vocab, params, max_pos, nominal, head_dim=None):
    return ModelArch(key, layers, hidden, q, kv, head_dim or hidden // q, ffn, True, vocab, params,
                     max_position=max_pos, nominal_params=nominal)


# Shapes from each model's Hugging Face config.json; parameter counts as published.
CATALOG: dict[str, ModelArch] = {a.key: a for a in [
    _opt("opt-125m", 12, 768, 12, 125.2e6, 125e6),
    _opt("opt-350m", 24, 1024, 16, 331.2e6, 350e6),
    _opt("opt-1.3b", 24, 2048, 32, 1.316e9, 1.3e9),
    _opt("opt-2.7b", 32, 2560, 32, 2.652e9, 2.7e9),
    _opt("opt-6.7b", 32, 4096, 32, 6.658e9, 6.7e9),
    _opt("opt-13b", 40, 5120, 40, 12.853e9, 13e9),
    _opt("opt-30b", 48, 7168, 56, 29.975e9, 30e9),
    _opt("opt-66b", 64, 9216, 72, 65.7e9, 66e9),
    _gated("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 6.738e9, 4096, 7e9),
    _gated("llama-2-13b", 40, 5120, 40, 40, 13824, 32000, 13.016e9, 4096, 13e9),
    _gated("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 68.977e9, 4096, 70e9),
    _gated("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, 8.030e9, 131072, 8e9),
    _gated("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256, 70.554e9, 131072, 70e9),
    _gated("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 7.242e9, 32768, 7e9),
    _gated("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, 7.616e9, 131072, 7e9),
    _gated("qwen2.5-32b", 64, 5120, 40, 8, 27648, 152064, 32.764e9, 131072, 32e9),
    _gated("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064, 72.706e9, 131072, 72e9),
    _gated("granite-8b", 40, 4096, 32, 8, 12800, 49155, 8.171e9, 131072, 8e9),
    ModelArch("gpt-3-175b", 96, 12288, 96, 96, 128, 49152, False, 50257, 175e9,
              max_position=2048, nominal_params=175e9),
]}

ALIASES = {
    "facebook/opt-125m": "opt-125m", "facebook/opt-350m": "opt-350m", "facebook/opt-1.3b": "opt-1.3b",
    "facebook/opt-2.7b": "opt-2.7b", "facebook/opt-6.7b": "opt-6.7b", "facebook/opt-13b": "opt-13b",
    "facebook/opt-30b": "opt-30b", "facebook/opt-66b": "opt-66b",
    "meta-llama/llama-2-7b-hf": "llama-2-7b", "meta-llama/llama-2-13b-hf": "llama-2-13b",
    "meta-llama/llama-2-70b-hf": "llama-2-70b", "meta-llama/llama-3.1-8b": "llama-3.1-8b",
    "meta-llama/llama-3.1-8b-instruct": "llama-3.1-8b", "meta-llama/llama-3.1-70b-instruct": "llama-3.1-70b",
    "mistralai/mistral-7b-v0.1": "mistral-7b", "qwen/qwen2.5-7b-instruct": "qwen2.5-7b",
    "qwen/qwen2.5-32b-instruct": "qwen2.5-32b", "qwen/qwen2.5-72b-instruct": "qwen2.5-72b",
    "llama-3-8b": "llama-3.1-8b", "gpt3-175b": "gpt-3-175b",
}


def get_arch(key: str) -> ModelArch:
    """Catalog lookup by key (case-insensitive, Hugging Face ids accepted)."""
    if isinstance(key, ModelArch):
        return key
    k = str(key).strip().lower()
    k = ALIASES.get(k, k)
    if k not in CATALOG:
        raise InputError("model", f"unknown model {key!r}; expected one of {', '.join(sorted(CATALOG))}")
    return CATALOG[k]


_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float8": 1, "fp8": 1, "half": 2}


def arch_from_hf_config(config: dict, key: str | None = None) -> ModelArch:
    """Shape from a Hugging Face ``config.json`` (OPT or Llama/Mistral/Qwen/Granite field names)."""
    if not isinstance(config, dict):
        raise InputError("config", "expected a JSON object")
    model_type = str(config.get("model_type", "")).lower()

    def need(*names):
        for n in names:
            if n in config and config[n] is not None:
                return config[n]
        raise InputError(f"config.{names[0]}", f"missing (model_type {model_type or '?'}); expected one of {names}")

    hidden = int(need("hidden_size", "d_model", "n_embd"))
    layers = int(need("num_hidden_layers", "n_layer", "num_layers"))
    q_heads = int(need("num_attention_heads", "n_head"))
    kv_heads = int(config.get("num_key_value_heads") or q_heads)
    head_dim = int(config.get("head_dim") or hidden // q_heads)
    vocab = int(need("vocab_size"))
    is_opt = model_type == "opt" or "ffn_dim" in config
    ffn = int(need("ffn_dim", "intermediate_size", "n_inner") if is_opt else need("intermediate_size", "n_inner"))
    gated = not is_opt and str(config.get("hidden_act", "silu")).lower() in ("silu", "swiglu", "swish", "geglu")
    tied = bool(config.get("tie_word_embeddings", is_opt))
    max_pos = config.get("max_position_embeddings")
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float16").replace("torch.", "")
    if dtype not in _DTYPE_BYTES:
        raise InputError("config.torch_dtype", f"unsupported dtype {dtype!r}; expected one of {sorted(_DTYPE_BYTES)}")
    params = params_from_shape(layers, hidden, kv_heads * head_dim, ffn, gated, vocab, tied,
                               learned_positions=(int(max_pos) + 2) if is_opt and max_pos else 0, bias=is_opt)
    name = key or str(config.get("_name_or_path") or model_type or "custom").lower()
    return ModelArch(name, layers, hidden, q_heads, kv_heads, head_dim, ffn, gated, vocab, params,
                     dtype_bytes=_DTYPE_BYTES[dtype], max_position=int(max_pos) if max_pos else None)
