"""Build a tiny random-weight Llama, with a tokenizer trained offline, into a directory.

No model hub is reachable here (DESIGN.md §7), so the real-vLLM tests serve this model.
Runs under ``.venv-vllm`` (it needs transformers/tokenizers/torch):

    .venv-vllm/bin/python tests/support/tiny_llama.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

VOCAB_SIZE = 512
HIDDEN = 128
HEADS = 4  # head_dim 32: vLLM's CPU attention supports 32/64/80/...
LAYERS = 2
MAX_POSITIONS = 2048


def _corpus() -> list[str]:
    words = [
        "knee", "batch", "token", "cache", "decode", "prefill", "latency", "throughput",
        "memory", "bandwidth", "queue", "request", "model", "server", "pool", "scale",
    ]
    lines = []
    for i in range(400):
        lines.append(" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12)) + f" {i}")
    return lines


def build(out_dir: str | Path) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.model_max_length = MAX_POSITIONS
    fast.save_pretrained(out)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=HIDDEN,
        intermediate_size=4 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_llama.py OUT_DIR")
    print(build(sys.argv[1]))
