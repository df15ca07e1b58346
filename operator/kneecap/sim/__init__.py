"""A vLLM-compatible engine twin that shows GPU-scale behaviour on a CPU.

* :mod:`kneecap.sim.engine` — scheduler, block KV cache and preemption, steppable in simulated time
* :mod:`kneecap.sim.roofline` — per-step time of the configured model on the configured GPU
* :mod:`kneecap.sim.shared_gpu` — several engines time-slicing one GPU (round robin on ready
  steps) and ``verify_placement``, their seeded replay (``kneecap pack --verify``)
* :mod:`kneecap.sim.metrics` — vLLM 0.32's Prometheus metrics
* :mod:`kneecap.sim.server` — the OpenAI-compatible HTTP server (``kneecap twin``)
* :mod:`kneecap.sim.loadgen` — open-loop load (``kneecap load``, ``run_load``)
* :mod:`kneecap.sim.cluster` — a whole cluster in virtual time: the emulation's store,
  controllers and kubelet (:mod:`kneecap.emulation`), a node whose pods run engines
  (:mod:`~kneecap.sim.engine_node`), a router, the real operator (the API's rules shared with the demo's: :mod:`kneecap.emulation`);
  :mod:`~kneecap.sim.hpa` an HPA on it
* :mod:`kneecap.sim.trace` — request traces; :mod:`kneecap.sim.replay` — policies replayed on a trace
  (``kneecap replay``, :mod:`~kneecap.sim.replay_report`); :mod:`kneecap.sim.demo_virtual` — the demo's
  closed loop in virtual time
"""

from kneecap.sim.engine import Engine, EngineConfig, SimRequest, StepResult, engine_config
from kneecap.sim.roofline import DEFAULT_STEP_COST, StepCostParams, step_time_s

__all__ = ["Engine", "EngineConfig", "SimRequest", "StepResult", "engine_config", "DEFAULT_STEP_COST",
           "StepCostParams", "step_time_s"]
