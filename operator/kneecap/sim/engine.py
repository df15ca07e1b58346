"""A vLLM engine twin, steppable in simulated time: scheduler, block KV cache, roofline step time.

What it copies from vLLM (V1 scheduler unless chunked prefill is off):

* continuous batching: every step re-forms the batch from the running requests (FCFS), then
  admits waiting ones while fewer than ``max_num_seqs`` run and the token budget
  (``max_num_batched_tokens``) and free KV blocks allow;
* chunked prefill (default): a step mixes decodes and prefill chunks under the token budget;
  with ``enable_chunked_prefill=False`` it behaves like vLLM's V0 default scheduler (the
  engine of data/real-h100): waiting prompts are prefilled whole in prefill-only
  steps that take priority over decodes, admitted only above a 1% free-block watermark;
* a block KV cache of ``num_gpu_blocks`` blocks of ``block_size`` tokens, sized from
  ``num_gpu_blocks_override``, else ``kv_cache_memory_bytes``, else vLLM's memory split
  (``kneecap.model.memory.memory_split``: total·gpu_memory_utilization − weights − reserve);
* preemption by recompute: when a running request needs a block and none is free, the most
  recently admitted running request loses its blocks and goes back to the front of the queue
  (its prompt and generated tokens are recomputed when it is re-admitted);
* step time from :mod:`kneecap.sim.roofline` for the configured model and GPU.

The engine knows no wall clock: ``step()`` advances ``now_s`` by the step's modelled time and
returns what happened. The HTTP server (:mod:`kneecap.sim.server`) paces it in scaled real time;
the benchmark runs it as fast as it can.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass, field

from kneecap.errors import InputError
from kneecap.model.arch import GIB, ModelArch
from kneecap.model.hardware import GPU
from kneecap.model.memory import vllm_default_limits
from kneecap.sim.roofline import DEFAULT_STEP_COST, StepCostParams, StepPricer, attention_flops

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"
V0_WATERMARK = 0.01  # vLLM V0 BlockSpaceManager watermark: keep 1% of blocks free on admission


@dataclass(eq=False)
class SimRequest:
    """One request's state. Times are simulated seconds."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    arrival_s: float
    output_tokens: int = 0
    num_computed: int = 0  # tokens whose KV is in the cache
    num_blocks: int = 0
    num_preemptions: int = 0
    state: str = WAITING
    scheduled_s: float | None = None  # first time scheduled (end of queueing)
    first_token_s: float | None = None
    last_token_s: float | None = None
    finish_s: float | None = None
    finished_reason: str | None = None
    external_tokens: int = 0  # prompt tokens whose KV came from a remote prefill (disaggregated)

    @property
    def to_compute(self) -> int:
        """Tokens to run before the next token can be sampled."""
        return self.prompt_tokens + self.output_tokens - self.num_computed


@dataclass(frozen=True)
class StepResult:
    """What one engine step did. ``tokens``: (request, is_first, inter-token interval or None) for
    each request that got a token at ``end_s``."""

    start_s: float
    end_s: float
    num_tokens: int
    num_prefill_tokens: int
    num_seqs: int
    tokens: list = field(default_factory=list)
    finished: list = field(default_factory=list)
    preempted: list = field(default_factory=list)
    num_running: int = 0
    num_waiting: int = 0

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class EngineConfig:
    """The vLLM flags that matter, resolved (see :func:`engine_config`)."""

    arch: ModelArch
    gpu: GPU
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    num_gpu_blocks: int
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int  # bytes the KV cache occupies (num_gpu_blocks × block bytes)
    enable_chunked_prefill: bool
    num_gpu_blocks_override: int | None = None
    step_cost: StepCostParams = DEFAULT_STEP_COST
    tensor_parallel_size: int = 1  # GPUs of the engine; byte figures above are one GPU's

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size


def _positive_int(value, field_name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(field_name, f"expected a positive integer, got {value!r}")
    return value


def engine_config(arch: ModelArch, gpu: GPU, *, max_num_seqs: int | None = None,
                  max_num_batched_tokens: int | None = None, max_model_len: int | None = None,
                  block_size: int = 16, gpu_memory_utilization: float = 0.9,
                  kv_cache_memory_bytes: int | None = None, num_gpu_blocks_override: int | None = None,
                  enable_chunked_prefill: bool = True,
                  step_cost: StepCostParams = DEFAULT_STEP_COST, tensor_parallel_size: int = 1) -> EngineConfig:
    """Resolve vLLM's flags the way vLLM does (defaults, KV sizing), checking each one. With
    ``tensor_parallel_size`` the KV cache and ``kv_cache_memory_bytes`` are per GPU (as in vLLM)."""
    from kneecap.model.parallel import check_tensor_parallel_size, kv_bytes_per_token_per_gpu

    tp = check_tensor_parallel_size(arch, tensor_parallel_size)
    block_size = _positive_int(block_size, "block_size")
    max_model_len = _positive_int(max_model_len if max_model_len is not None else (arch.max_position or 2048),
                                  "max_model_len")
    seqs_default, tokens_default = vllm_default_limits(gpu, enable_chunked_prefill, max_model_len)
    max_num_seqs = _positive_int(max_num_seqs if max_num_seqs is not None else seqs_default, "max_num_seqs")
    max_num_batched_tokens = _positive_int(
        max_num_batched_tokens if max_num_batched_tokens is not None else tokens_default, "max_num_batched_tokens")
    if not enable_chunked_prefill and max_num_batched_tokens < max_model_len:
        raise InputError("max_num_batched_tokens",
                         f"{max_num_batched_tokens} is smaller than max_model_len {max_model_len}; without "
                         "chunked prefill a whole prompt must fit in one step (vLLM refuses this too)")
    if not (isinstance(gpu_memory_utilization, (int, float)) and 0.0 < gpu_memory_utilization <= 1.0):
        raise InputError("gpu_memory_utilization", f"expected a fraction in (0, 1], got {gpu_memory_utilization!r}")
    block_bytes = kv_bytes_per_token_per_gpu(arch, tp) * block_size
    if num_gpu_blocks_override is not None:
        num_blocks = _positive_int(num_gpu_blocks_override, "num_gpu_blocks_override")
    elif kv_cache_memory_bytes is not None:
        _positive_int(kv_cache_memory_bytes, "kv_cache_memory_bytes")
        num_blocks = kv_cache_memory_bytes // block_bytes
    else:
        from kneecap.model.memory import memory_split  # lead's module: vLLM's sizing (DESIGN §5.3)

        num_blocks = memory_split(arch, gpu, float(gpu_memory_utilization), max_num_seqs,
                                  max_num_batched_tokens, block_size, tensor_parallel_size=tp).num_gpu_blocks
    if num_blocks <= 0:
        raise InputError("gpu_memory_utilization",
                         f"no memory left for the KV cache: {arch.key} on {gpu.key} at "
                         f"{gpu_memory_utilization} (weights {arch.weight_bytes / GIB:.1f} GiB of "
                         f"{gpu.memory_gib:.1f} GiB); raise it or pass kv_cache_memory_bytes")
    return EngineConfig(arch, gpu, max_num_seqs, max_num_batched_tokens, max_model_len, block_size,
                        int(num_blocks), float(gpu_memory_utilization), int(num_blocks * block_bytes),
                        bool(enable_chunked_prefill), num_gpu_blocks_override, step_cost, tp)


def _blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class Engine:
    """The scheduler and KV cache of one vLLM engine (module docstring)."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.now_s = 0.0
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.free_blocks = config.num_gpu_blocks
        self._future: list[tuple[float, int, SimRequest]] = []  # arrivals after now_s
        self._ids = itertools.count()
        self._watermark = int(V0_WATERMARK * config.num_gpu_blocks)
        self._attn_per_token = attention_flops(config.arch, 1, 0)  # 4·L·D per attended token
        self._step_time_s = StepPricer(config.arch, config.gpu, config.step_cost, config.tensor_parallel_size)
        # totals for benchmarks and gauges
        self.num_steps = 0
        self.num_preemptions = 0
        self.busy_s = 0.0
        self.running_integral_s = 0.0  # ∫ num_running dt over busy time

    # ---------------------------------------------------------------- requests
    def add_request(self, prompt_tokens: int, max_tokens: int, arrival_s: float | None = None,
                    request_id: str | None = None, prefilled_tokens: int = 0) -> SimRequest:
        """Queue a request arriving at ``arrival_s`` (default: now). Checks it can ever run.

        ``prefilled_tokens``: prompt tokens whose KV arrived from elsewhere (a prefill instance,
        disaggregated serving); they take cache blocks at admission but no compute. A preempted
        request recomputes them, as vLLM does."""
        prompt_tokens = _positive_int(prompt_tokens, "prompt")
        if not (isinstance(prefilled_tokens, int) and 0 <= prefilled_tokens < prompt_tokens):
            raise InputError("prefilled_tokens", f"expected 0 … {prompt_tokens - 1}, got {prefilled_tokens!r}")
        max_tokens = _positive_int(max_tokens, "max_tokens")
        cfg = self.config
        if prompt_tokens + max_tokens > cfg.max_model_len:
            raise InputError("max_tokens", f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds "
                                           f"max_model_len {cfg.max_model_len}")
        usable = cfg.num_gpu_blocks - (0 if cfg.enable_chunked_prefill else self._watermark)
        if _blocks_for(prompt_tokens + max_tokens, cfg.block_size) > usable:
            raise InputError("max_tokens", f"request needs {prompt_tokens + max_tokens} KV tokens but the cache "
                                           f"holds {usable * cfg.block_size}")
        arrival = self.now_s if arrival_s is None else float(arrival_s)
        req = SimRequest(request_id or f"cmpl-{next(self._ids)}", prompt_tokens, max_tokens, arrival,
                         num_computed=prefilled_tokens, external_tokens=prefilled_tokens)
        if arrival > self.now_s:
            heapq.heappush(self._future, (arrival, next(self._ids), req))
        else:
            self.waiting.append(req)
        return req

    def abort(self, req: SimRequest) -> None:
        """Drop a request (client went away): free its blocks."""
        if req.state == FINISHED:
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        else:
            self._future = [e for e in self._future if e[2] is not req]
            heapq.heapify(self._future)
        self.free_blocks += req.num_blocks
        req.num_blocks = 0
        req.state, req.finished_reason, req.finish_s = FINISHED, "abort", self.now_s

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self._future)

    def ready_s(self) -> float:
        """When the next step can start: ``now_s`` with requests running or queued, else the next
        arrival, else inf. (:mod:`kneecap.sim.shared_gpu` schedules engines on one GPU by it.)"""
        if self.running or self.waiting:
            return self.now_s
        return self._future[0][0] if self._future else math.inf

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks in use (``vllm:kv_cache_usage_perc``)."""
        return 1.0 - self.free_blocks / self.config.num_gpu_blocks

    # ---------------------------------------------------------------- scheduling
    def _admit_arrivals(self) -> None:
        while self._future and self._future[0][0] <= self.now_s:
            self.waiting.append(heapq.heappop(self._future)[2])

    def _preempt_last(self) -> SimRequest:
        victim = self.running.pop()
        self.free_blocks += victim.num_blocks
        victim.num_blocks = 0
        victim.num_computed = 0
        victim.external_tokens = 0  # recomputed here from now on
        victim.num_preemptions += 1
        victim.state = WAITING
        self.waiting.appendleft(victim)
        self.num_preemptions += 1
        return victim

    def _grow(self, req: SimRequest, n: int, preempted: list) -> bool:
        """Give ``req`` blocks for ``n`` more tokens, preempting from the back. False if ``req``
        itself was preempted."""
        need = _blocks_for(req.num_computed + n, self.config.block_size) - req.num_blocks
        while need > self.free_blocks:
            victim = self._preempt_last()
            preempted.append(victim)
            if victim is req:
                return False
        self.free_blocks -= need
        req.num_blocks += need
        return True

    def _schedule_running(self, budget: int, preempted: list) -> tuple[list, int]:
        scheduled = []
        running, bs = self.running, self.config.block_size
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = req.prompt_tokens + req.output_tokens - req.num_computed  # to_compute, inlined (hot loop)
            if n > budget:
                n = budget
            need = -(-(req.num_computed + n) // bs) - req.num_blocks
            if need <= self.free_blocks:  # the common case of _grow: no preemption
                self.free_blocks -= need
                req.num_blocks += need
            elif not self._grow(req, n, preempted):
                break
            scheduled.append((req, n))
            budget -= n
            i += 1
        return scheduled, budget

    def _admit_waiting(self, budget: int, whole_prompts: bool, watermark: int) -> tuple[list, int]:
        cfg = self.config
        scheduled = []
        while self.waiting and len(self.running) < cfg.max_num_seqs and budget > 0:
            req = self.waiting[0]
            n = min(req.to_compute, budget)
            if whole_prompts and n < req.to_compute:
                break
            need = _blocks_for(req.num_computed + n, cfg.block_size)  # with KV that arrived prefilled
            if self.free_blocks - need < watermark:
                break
            self.waiting.popleft()
            req.state = RUNNING
            self.running.append(req)
            self.free_blocks -= need
            req.num_blocks = need
            scheduled.append((req, n))
            budget -= n
        return scheduled, budget

    def _schedule(self) -> tuple[list, list]:
        cfg = self.config
        preempted: list[SimRequest] = []
        if cfg.enable_chunked_prefill:  # V1: running first, then admit if nobody was preempted
            scheduled, budget = self._schedule_running(cfg.max_num_batched_tokens, preempted)
            if not preempted:
                more, _ = self._admit_waiting(budget, whole_prompts=False, watermark=0)
                scheduled += more
            return scheduled, preempted
        # V0 default scheduler: whole-prompt prefill steps first, else decode everyone
        scheduled, _ = self._admit_waiting(cfg.max_num_batched_tokens, whole_prompts=True,
                                           watermark=self._watermark)
        if scheduled:
            return scheduled, preempted
        scheduled, _ = self._schedule_running(cfg.max_num_batched_tokens, preempted)
        return scheduled, preempted

    # ---------------------------------------------------------------- one step
    def step(self) -> StepResult | None:
        """Run one engine iteration; ``None`` when there is nothing to do."""
        self._admit_arrivals()
        if not (self.running or self.waiting):
            if not self._future:
                return None
            self.now_s = self._future[0][0]
            self._admit_arrivals()
        scheduled, preempted = self._schedule()
        start = self.now_s
        if not scheduled:  # cannot happen with validated requests; guard against a stall
            raise RuntimeError("twin scheduler made no progress")
        cfg = self.config
        num_tokens = prefill_tokens = 0
        kv_read = 0
        decode_only = True
        for req, n in scheduled:
            num_tokens += n
            kv_read += req.num_computed
            if n > 1 or req.output_tokens == 0:
                decode_only = False
                prefill_tokens += n
        if decode_only:
            attn = self._attn_per_token * (kv_read + len(scheduled))  # attention_flops with n = 1
        else:
            attn = attention_flops(cfg.arch, [n for _, n in scheduled], [r.num_computed for r, _ in scheduled])
        dt = self._step_time_s(len(scheduled), num_tokens, kv_read, attn, not decode_only)
        end = start + dt
        tokens, finished = [], []
        for req, n in scheduled:
            if req.scheduled_s is None:
                req.scheduled_s = start
            req.num_computed += n
            if req.num_computed == req.prompt_tokens + req.output_tokens:
                req.output_tokens += 1
                first = req.first_token_s is None
                if first:
                    req.first_token_s = end
                tokens.append((req, first, None if first else end - req.last_token_s))
                req.last_token_s = end
                if req.output_tokens >= req.max_tokens:
                    req.state, req.finished_reason, req.finish_s = FINISHED, "length", end
                    self.free_blocks += req.num_blocks
                    req.num_blocks = 0
                    finished.append(req)
        running_during = len(self.running)
        if finished:
            self.running = [r for r in self.running if r.state != FINISHED]
        self.now_s = end
        self.num_steps += 1
        self.busy_s += dt
        self.running_integral_s += running_during * dt
        return StepResult(start, end, num_tokens, prefill_tokens, len(scheduled), tokens, finished, preempted,
                          len(self.running), len(self.waiting) + len(self._future))

    def run_until_idle(self, max_steps: int | None = None) -> int:
        """Step until no request is left (or ``max_steps``); returns steps run."""
        steps = 0
        while self.has_work() and (max_steps is None or steps < max_steps):
            self.step()
            steps += 1
        return steps
