"""`kneecap twin` takes vLLM's command line: flags, served names, the KV cache, tensor
parallelism. Its HTTP layer and the command as a process: tests/integration/test_twin_http.py."""

from __future__ import annotations

import argparse

import pytest

from kneecap.cli import build_parser, main
from kneecap.commands.twin import build_server, human_int, split_unknown
from kneecap.errors import InputError


def parse(argv: list[str]):
    return build_parser("twin").parse_args(["twin", *argv])


def test_vllm_command_line_with_unknown_flags_and_equals_forms():
    args = parse(["facebook/opt-1.3b", "--enforce-eager", "--dtype", "half", "--max-num-seqs=48",
                  "--gpu-memory-utilization", "0.5", "--max-model-len=2k", "--no-enable-chunked-prefill",
                  "--port=8123", "--tensor-parallel-size=1", "--trust-remote-code", "--gpu", "h100-64gb"])
    assert args.tensor_parallel_size == 1  # modelled (kneecap.model.parallel), not ignored
    assert args.model_pos == "facebook/opt-1.3b"
    assert args.max_num_seqs == 48 and args.gpu_memory_utilization == 0.5 and args.max_model_len == 2000
    assert args.enable_chunked_prefill is False and args.port == 8123
    assert args.ignored_flags == ["--enforce-eager", "--dtype", "half", "--trust-remote-code"]
    server = build_server(args)
    cfg = server.config
    assert (cfg.arch.key, cfg.gpu.key, cfg.max_num_seqs, cfg.max_model_len) == ("opt-1.3b", "h100-64gb", 48, 2000)
    assert cfg.max_num_batched_tokens == 2048 and not cfg.enable_chunked_prefill
    assert server.names == ["facebook/opt-1.3b"]


def test_model_flag_served_names_and_kv_bytes():
    args = parse(["--model", "my-model", "--arch", "llama-3.1-8b", "--served-model-name", "a", "b",
                  "--kv-cache-memory-bytes", "2G", "--enable-chunked-prefill=true", "--max-num-batched-tokens", "1024"])
    server = build_server(args)
    assert server.names == ["a", "b"] and server.root_model == "my-model"
    assert server.config.num_gpu_blocks == 2 * 2**30 // (131072 * 16)
    assert server.config.enable_chunked_prefill and server.config.max_num_batched_tokens == 1024


def test_unknown_model_without_arch_is_a_clear_error():
    with pytest.raises(InputError) as err:
        build_server(parse(["some/unknown-model"]))
    assert err.value.field == "arch" and "--arch" in str(err.value)
    assert main(["twin", "some/unknown-model"]) == 2


def test_split_unknown_and_human_int():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port")
    kept, ignored = split_unknown(parser, ["m", "--swap-space", "4", "--port", "1", "--enforce-eager", "x"])
    assert kept == ["m", "--port", "1", "x"] and ignored == ["--swap-space", "4", "--enforce-eager"]
    assert human_int("4096") == 4096 and human_int("1K") == 1024 and human_int("8G") == 8 * 2**30
    with pytest.raises(argparse.ArgumentTypeError):
        human_int("lots")


def test_tensor_parallel_flag_splits_the_twin_engine():
    """`vllm serve` spells it --tensor-parallel-size or -tp; the twin's KV cache is one rank's."""
    from kneecap.model.arch import get_arch
    from kneecap.model.hardware import get_gpu
    from kneecap.model.memory import memory_split

    for flag in (["--tensor-parallel-size", "4"], ["-tp", "4"], ["--tensor-parallel-size=4"]):
        cfg = build_server(parse(["meta-llama/Llama-3.1-70B", *flag])).config
        assert cfg.tensor_parallel_size == 4
        assert cfg.num_gpu_blocks == memory_split(get_arch("llama-3.1-70b"), get_gpu("h100-80gb"), 0.9, cfg.max_num_seqs,
                                                  cfg.max_num_batched_tokens, tensor_parallel_size=4).num_gpu_blocks
    with pytest.raises(InputError, match="leaves no KV cache"):  # 141 GB of weights on one 80 GB GPU
        build_server(parse(["meta-llama/Llama-3.1-70B"]))
    with pytest.raises(InputError, match="does not divide the 64 attention heads") as exc:
        build_server(parse(["meta-llama/Llama-3.1-70B", "-tp", "3"]))
    assert exc.value.field == "--tensor-parallel-size"
