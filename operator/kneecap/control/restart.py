"""What restarting a pool costs, and whether a change pays for it. Pure.

Changing a managed vLLM flag replaces every pod of the pool: each is down from its deletion
until its replacement has loaded the model and turned Ready. The time that takes is measured
per pool from the API (a Ready pod's Ready condition ``lastTransitionTime`` minus its
``creationTimestamp``, the median over the pool's pods); before any pod was measured it is
modelled as weights / load bandwidth + start-up (CUDA graphs, warm-up).

A change pays for itself when the tokens it is predicted to gain over the horizon exceed the
tokens the pool does not serve while its pods restart: the observed throughput per pod × the
restart time × the pods replaced (a RollingUpdate replaces them in ⌈pods / maxUnavailable⌉
steps; the pod-seconds lost are the same). Released GPU memory counts as a gain at ``spec.control.releasedMemoryValue``:
1 values releasing 10% of the pool's memory like a 10% throughput gain, 0 gives it no value
(only throughput pays for a restart).

The horizon is how long the workload is expected to stay as it is (:func:`workload_horizon`),
read from the window history, not the cooldown (which stays the least time between changes): a
``cooldown: 0s`` no longer makes every restart worthless.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from kneecap.control import status

MODEL_LOAD_GIB_S = 2.0  # modelled weight-load bandwidth (object store or PVC to GPU) before a measurement
STARTUP_S = 30.0  # modelled start-up besides the weights (engine init, CUDA-graph capture, warm-up)
GIB = 1024**3
MEASURED, MODELLED = "Measured", "Modelled"
WINDOW_HISTORY, COOLDOWN, DEFAULT = "WindowHistory", "Cooldown", "Default"  # where a horizon comes from
REGIME_TOLERANCE = 0.25  # relative change in rate or mean lengths that ends the current workload's run
MAX_HORIZON_S = 3600.0  # the longest horizon a restart pays over, however long the workload has held


def modelled_restart_s(weight_bytes: float, load_gib_s: float = MODEL_LOAD_GIB_S, startup_s: float = STARTUP_S) -> float:
    """Seconds from a pod's creation to Ready: weights / load bandwidth + start-up."""
    return weight_bytes / GIB / load_gib_s + startup_s


def start_to_ready_s(pods) -> list[float]:
    """Each Ready pod's creation → Ready time, in seconds (pods with a missing or unreadable
    timestamp, or one that is not after the creation, are skipped)."""
    out = []
    for p in pods:
        ready = next((c for c in (p.get("status") or {}).get("conditions") or []
                      if c.get("type") == "Ready" and c.get("status") == "True"), None)
        try:
            t_ready = status.parse_iso((ready or {}).get("lastTransitionTime"))
            t_created = status.parse_iso(p.get("metadata", {}).get("creationTimestamp"))
        except (TypeError, ValueError):
            continue
        if t_ready is not None and t_created is not None and t_ready > t_created:
            out.append(t_ready - t_created)
    return out


def pool_restart_s(measured: list[float]) -> float | None:
    """The pool's restart time from this tick's measurements (None: nothing measured)."""
    return float(statistics.median(measured)) if measured else None


def rolling_update(deploy: dict) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) in pods as the Deployment controller resolves them: percentages
    of ``spec.replicas`` (surge rounded up, unavailable down), Kubernetes' defaults 25%/25%, and
    both 0 read as 1 unavailable. A Recreate strategy stops every pod first."""
    spec = deploy.get("spec") or {}
    replicas = int(spec.get("replicas", 1))
    strategy = spec.get("strategy") or {}
    if strategy.get("type") == "Recreate":
        return 0, max(replicas, 1)
    ru = strategy.get("rollingUpdate") or {}

    def pods(v, default: str, up: bool) -> int:
        v = default if v is None else v
        if isinstance(v, str) and v.endswith("%"):
            x = replicas * float(v[:-1]) / 100.0
            return int(math.ceil(x) if up else math.floor(x))
        return int(v)

    surge, unavailable = pods(ru.get("maxSurge"), "25%", True), pods(ru.get("maxUnavailable"), "25%", False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


def leaves_no_ready_pod(deploy: dict) -> bool:
    """True when a rollout of this Deployment stops every pod before a replacement is Ready
    (a Deployment scaled to 0 has no pod to stop)."""
    replicas = int((deploy.get("spec") or {}).get("replicas", 1))
    surge, unavailable = rolling_update(deploy)
    return replicas > 0 and surge == 0 and unavailable >= replicas


@dataclass(frozen=True)
class Horizon:
    """How long a change is expected to keep paying: seconds, their source, and the run behind them."""

    seconds: float
    source: str  # WINDOW_HISTORY | COOLDOWN | DEFAULT
    windows: int = 0  # windows of the current workload counted (0: none, the default)
    steady_s: float = 0.0  # window seconds the current workload has held (before the bounds)

    @property
    def note(self) -> str:
        """Where the seconds come from, for a message."""
        held = f"the workload held for {self.windows} window(s), {self.steady_s:.0f}s"
        if self.source == COOLDOWN:
            return f"the cooldown: a change is kept at least that long; {held}" if self.windows else \
                "the cooldown: a change is kept at least that long; no readable window yet"
        if self.source != WINDOW_HISTORY:
            return "default: no readable window of the workload yet, one window assumed"
        capped = f", capped at {self.seconds:.0f}s" if self.steady_s > self.seconds else ""
        return f"the workload held for {self.windows} window(s), {self.steady_s:.0f}s{capped}"


def _rate_noise_rps(window, current) -> float:
    """Three standard deviations of the difference of two windows' rates were both Poisson counts
    at their pooled rate (requests / seconds over both): short or light windows differ by more than
    ``REGIME_TOLERANCE`` with no change in the workload. 0 where a window's numbers are unusable."""
    try:
        w = [float(o.window_s) for o in (window, current)]
        n = [float(o.request_rate_rps) * s for o, s in zip((window, current), w)]
    except (TypeError, ValueError):
        return 0.0
    if not all(math.isfinite(x) and x > 0.0 for x in (*w, *n)):
        return 0.0
    return 3.0 * math.sqrt(sum(n) / sum(w) * (1.0 / w[0] + 1.0 / w[1]))


def same_workload(window, current, tolerance: float = REGIME_TOLERANCE) -> bool:
    """Whether ``window``'s request rate and mean input and output lengths are each within
    ``tolerance`` (relative) of ``current``'s, the rate's widened to its counting noise
    (:func:`_rate_noise_rps`); a non-finite value on either side is a change."""
    for name in ("request_rate_rps", "input_len_mean", "output_len_mean"):
        a, b = float(getattr(window, name)), float(getattr(current, name))
        if not (math.isfinite(a) and math.isfinite(b)):
            return False
        allowed = tolerance * max(abs(b), 1e-9)
        if name == "request_rate_rps":
            allowed = max(allowed, _rate_noise_rps(window, current))
        if abs(a - b) > allowed:
            return False
    return True


def workload_horizon(observations: Sequence, interval_s: float, window_s: float, cooldown_s: float = 0.0,
                     tolerance: float = REGIME_TOLERANCE, max_s: float = MAX_HORIZON_S) -> Horizon:
    """The horizon a restart must pay over, a pure function of the pool's observation ring
    (oldest first) and the spec's interval, window and cooldown.

    The current workload's run: the window seconds, counted back from the newest window, of the
    windows whose workload (:func:`same_workload`) matches the newest's, up to the first that does
    not. A workload seen to hold for T is expected to hold about T more (a Lindy estimate: with no
    model of what comes next, the age of a regime is the best guess at its remaining life), so the
    horizon is T, at least one control interval and at most ``max_s`` (1 h: beyond it the operator
    has long since re-decided). Gaps between windows (idle or unusable windows) neither count nor
    end the run. With no window (or none with a usable length), the default is one window: what a
    single window would give. The cooldown is a floor: a change is kept at least that long (the
    operator does not revisit it sooner), so ``cooldown: 0s`` leaves the history alone to decide.
    """
    low = max(float(interval_s), 0.0)
    found = Horizon(min(max(float(window_s), low), max_s), DEFAULT)
    if observations:
        current = observations[-1]
        steady_s, windows = 0.0, 0
        for o in reversed(observations):
            w = float(o.window_s)
            if not (math.isfinite(w) and w > 0.0) or not same_workload(o, current, tolerance):
                break
            steady_s, windows = steady_s + w, windows + 1
        if windows:
            found = Horizon(min(max(steady_s, low), max_s), WINDOW_HISTORY, windows, steady_s)
    floor_s = min(float(cooldown_s), max_s) if math.isfinite(cooldown_s) else 0.0
    if floor_s > found.seconds:
        return Horizon(floor_s, COOLDOWN, found.windows, found.steady_s)
    return found


@dataclass(frozen=True)
class RestartCost:
    """What one restart of a pool costs, in seconds and in tokens."""

    restart_s: float  # one pod, creation → Ready
    source: str  # MEASURED | MODELLED
    pool_tok_s: float  # tokens/s the pool serves now (prompt + generated)
    pods: int  # pods now, each replaced once
    horizon_s: float  # how long the workload is expected to stay as it is (workload_horizon)
    downtime: bool = False  # the rollout leaves the pool with no Ready pod
    memory_value: float = 1.0  # tokens a released memory fraction is worth, per token of the pool's throughput
    saturated: bool = True  # the cap or the KV cache limits the pool: more capacity serves more tokens
    horizon_source: str = DEFAULT  # WINDOW_HISTORY | COOLDOWN | DEFAULT (Horizon.source)
    horizon_note: str = ""  # where the horizon comes from, for messages (Horizon.note)

    @property
    def horizon_text(self) -> str:
        """``900s horizon (…)``: the horizon and where it comes from, for messages."""
        return f"{self.horizon_s:.0f}s horizon ({self.horizon_note or self.horizon_source})"

    @property
    def cost_tokens(self) -> float:
        """Tokens not served while the pods restart: per-pod throughput × restart s × pods."""
        return self.pool_tok_s / max(self.pods, 1) * self.restart_s * self.pods

    def gain_tokens(self, throughput_gain: float, memory_gain: float = 0.0, replicas_saved: float = 0.0) -> float:
        """Tokens the relative throughput gain (a loss nets against it) and the released memory
        fraction (at ``memory_value``) add over the horizon; never below 0. The predicted gain is
        in capacity (SLIM at the cap): where neither the cap nor the KV cache limits the pool, a
        gain at the cap adds no tokens (a loss still counts). ``replicas_saved``: replicas the SLO
        needs at the live flags beyond those at the new ones (GAUSS), each worth a pod's tokens
        over the horizon: the same capacity as the throughput gain, in the GPUs it returns, so the
        larger of the two counts; replicas the new flags need in addition net against it."""
        tg = throughput_gain if self.saturated else min(throughput_gain, 0.0)
        tokens = max(tg + self.memory_value * max(memory_gain, 0.0), 0.0) * self.pool_tok_s * self.horizon_s
        pod_tokens = replicas_saved * self.pool_tok_s / max(self.pods, 1) * self.horizon_s
        return max(tokens, pod_tokens) if replicas_saved >= 0 else max(tokens + pod_tokens, 0.0)

    def to_status(self, throughput_gain: float, memory_gain: float = 0.0, replicas_saved: float = 0.0) -> dict:
        return {"restartSeconds": round(self.restart_s, 1), "restartSource": self.source,
                "gainTokens": round(self.gain_tokens(throughput_gain, memory_gain, replicas_saved)),
                "replicasSaved": replicas_saved,
                "costTokens": round(self.cost_tokens),
                "horizonSeconds": round(self.horizon_s, 1), "horizonSource": self.horizon_source,
                "podsRestarted": self.pods, "downtime": self.downtime,
                "saturated": self.saturated}


KV_FULL = 0.9  # KV-cache usage at which the cache, not the arrivals, limits the batch


def saturated(obs, cap: int) -> bool:
    """Whether the engine settings limit the window's pool (so more capacity at a cap serves more
    tokens): the running batch reached the cap, the KV cache filled, or requests were preempted.
    Requests waiting for a prefill a compute-bound pool has not reached do not count."""
    return obs.max_batch >= cap or obs.kv_usage_max >= KV_FULL or (obs.preemptions or 0.0) > 0.0
