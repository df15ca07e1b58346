"""`kneecap twin`: a vLLM-compatible server whose engine is a GPU-scale twin (kneecap.sim).

Takes ``vllm serve``'s flags for what matters (``MODEL`` or ``--model``, ``--max-num-seqs``,
``--gpu-memory-utilization``, ``--kv-cache-memory-bytes``, ``--max-num-batched-tokens``,
``--max-model-len``, ``--block-size``, ``--num-gpu-blocks-override``,
``--[no-]enable-chunked-prefill``, ``--served-model-name``, ``--host``, ``--port``), so the
operator can start it where it would start vLLM. Other vLLM flags (``--enforce-eager``,
``--dtype half``, …) are accepted and ignored, with a note on stderr. Twin-only flags:
``--arch`` (catalog shape, default from the model name), ``--gpu``, ``--time-scale``, ``--seed``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import sys
import types
from pathlib import Path

from kneecap.commands import common
from kneecap.commands.common import human_int
from kneecap.errors import InputError

HELP = "serve a vLLM-compatible twin with GPU-scale batching, KV cache and step times"

# vLLM flags that take no value: an unknown flag followed by a non-flag word takes that word as
# its value unless it is one of these.
VLLM_SWITCHES = {
    "--enforce-eager", "--trust-remote-code", "--disable-log-requests", "--disable-log-stats",
    "--enable-prefix-caching", "--no-enable-prefix-caching", "--disable-frontend-multiprocessing",
    "--enable-log-requests", "--no-enable-log-requests", "--disable-custom-all-reduce",
    "--enable-auto-tool-choice", "--disable-fastapi-docs", "--enable-lora", "--skip-tokenizer-init",
    "--disable-sliding-window", "--enable-sleep-mode", "--async-scheduling", "--no-async-scheduling",
}



def _bool(text: str) -> bool:
    s = str(text).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def split_unknown(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
    """Separate flags this parser does not know (and their values) from the rest."""
    known = set(parser._option_string_actions)
    kept, ignored = [], []
    i = 0
    while i < len(argv):
        tok = argv[i]
        name = tok.split("=", 1)[0]
        if tok.startswith("--") and tok != "--" and name not in known:
            ignored.append(tok)
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if "=" not in tok and name not in VLLM_SWITCHES and nxt is not None and not nxt.startswith("-"):
                ignored.append(nxt)
                i += 1
        else:
            kept.append(tok)
        i += 1
    return kept, ignored


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_pos", nargs="?", metavar="MODEL", help="model name (as for `vllm serve MODEL`)")
    parser.add_argument("--model", help="model name (alternative to MODEL)")
    parser.add_argument("--served-model-name", nargs="+", help="name(s) the API answers to (default: MODEL)")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-num-seqs", type=int, help="batch cap (vLLM default: 1024 on ≥70 GiB GPUs, else 256)")
    parser.add_argument("--max-num-batched-tokens", type=human_int, help="token budget per step")
    parser.add_argument("--max-model-len", type=human_int, help="context limit (default: the model's)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--kv-cache-memory-bytes", type=human_int, help="KV cache size; overrides the utilisation")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-gpu-blocks-override", type=int)
    parser.add_argument("--enable-chunked-prefill", nargs="?", const=True, default=True, type=_bool,
                        help="mixed prefill/decode steps under the token budget (default on, as vLLM V1)")
    parser.add_argument("--no-enable-chunked-prefill", dest="enable_chunked_prefill", action="store_false",
                        help="V0-style whole-prompt prefill steps")
    parser.add_argument("--kv-transfer-config", help="vLLM's KV-transfer JSON: its kv_role (kv_producer, "
                                                     "kv_consumer, kv_both) makes a disaggregated prefill or decode twin")
    parser.add_argument("--kv-transfer-gib-s", type=float, default=25.0,
                        help="twin: KV link bandwidth a decode twin reads remote KV at, GiB/s")
    common.add_tensor_parallel(parser, short=True)
    parser.add_argument("--arch", help="twin: catalog model shape (default: from the model name)")
    parser.add_argument("--gpu", default="h100-80gb", help="twin: catalog GPU (default h100-80gb)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="twin: run X times faster than real time")
    parser.add_argument("--seed", type=int, default=0, help="twin: seed for generated text")
    common.add_json(parser, "twin: JSON lines on stdout (serving, with the engine's shape; ignoredFlags; stopped)")
    parser.add_argument("--sim-clock-anchor", metavar="WALL:SIM",
                        help="twin: put the simulated clock (kneecap_twin_sim_time_seconds, X-Kneecap-Sim-Time) on "
                             "the clock that read SIM seconds at unix time WALL and runs --time-scale times faster "
                             "(default: unix time at start)")

    def parse_known_args(self, args=None, namespace=None):  # tolerate vLLM flags we do not model
        argv = list(sys.argv[1:] if args is None else args)
        kept, ignored = split_unknown(self, argv)
        ns, rest = argparse.ArgumentParser.parse_known_args(self, kept, namespace)
        ns.ignored_flags = ignored + rest
        return ns, []

    parser.parse_known_args = types.MethodType(parse_known_args, parser)


def resolve_arch(args):
    from kneecap.model.arch import get_arch
    from kneecap.observe.hf_config import load_hf_config

    if args.arch:
        return get_arch(args.arch)
    model = args.model or args.model_pos
    if model and Path(model, "config.json").is_file():
        return load_hf_config(model)
    try:
        return get_arch(model)
    except InputError as exc:
        raise InputError("arch", f"cannot tell the model shape from {model!r}; pass --arch KEY ({exc})") from None


def build_server(args):
    """The :class:`TwinServer` the flags describe (no I/O)."""
    from kneecap.model.hardware import get_gpu
    from kneecap.sim.engine import engine_config
    from kneecap.sim.kv_transfer import kv_role
    from kneecap.sim.server import TwinServer

    model = args.model or args.model_pos
    if not model:
        raise InputError("model", "expected a model name: `kneecap twin MODEL` or --model MODEL")
    arch = resolve_arch(args)
    cfg = engine_config(arch, get_gpu(args.gpu), max_num_seqs=args.max_num_seqs,
                        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
                        block_size=args.block_size, gpu_memory_utilization=args.gpu_memory_utilization,
                        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
                        num_gpu_blocks_override=args.num_gpu_blocks_override,
                        enable_chunked_prefill=args.enable_chunked_prefill,
                        tensor_parallel_size=common.tensor_parallel(args, arch))
    if not args.kv_transfer_gib_s > 0:
        raise InputError("kv_transfer_gib_s", f"expected GiB/s > 0, got {args.kv_transfer_gib_s}")
    return TwinServer(cfg, args.served_model_name or [model], time_scale=args.time_scale, seed=args.seed,
                      root_model=model, sim_clock_anchor=parse_anchor(args.sim_clock_anchor),
                      kv_role=kv_role(args.kv_transfer_config), kv_transfer_gib_s=args.kv_transfer_gib_s)


def parse_anchor(text: str | None) -> tuple[float, float] | None:
    """``WALL:SIM`` (two finite numbers of seconds) as a pair; None for None."""
    if text is None:
        return None
    try:
        wall_s, sim_s = (float(x) for x in text.split(":"))
    except ValueError:
        raise InputError("sim_clock_anchor", f"expected WALL:SIM (two numbers of seconds), got {text!r}") from None
    if not (math.isfinite(wall_s) and math.isfinite(sim_s)):
        raise InputError("sim_clock_anchor", f"expected finite seconds, got {text!r}")
    return wall_s, sim_s


def run(args) -> int:
    from kneecap.sim.server import serve

    if not 0 < args.port < 65536:
        raise InputError("port", f"expected 1..65535, got {args.port}")
    server = build_server(args)
    if getattr(args, "ignored_flags", None):
        if args.json:
            print(json.dumps({"event": "ignoredFlags", "flags": list(args.ignored_flags)}), flush=True)
        else:
            print(f"INFO: kneecap twin ignores vLLM flags it does not model: {' '.join(args.ignored_flags)}",
                  file=sys.stderr, flush=True)

    async def main() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await serve(server, args.host, args.port, json_lines=args.json)
        except asyncio.CancelledError:
            if args.json:
                print(json.dumps({"event": "stopped"}), flush=True)

    try:
        asyncio.run(main())
    except OSError as exc:  # port in use, bad host
        raise InputError("port", f"cannot listen on {args.host}:{args.port}: {exc}") from None
    return 0
