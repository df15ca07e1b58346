"""GPU catalog: peak dense 16-bit FLOP/s, memory bandwidth, memory as vLLM reports it, cost."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from kneecap.errors import InputError

GIB = 1024**3


@dataclass(frozen=True)
class GPU:
    key: str
    name: str
    peak_flops: float  # dense fp16/bf16 FLOP/s (no sparsity)
    mem_bw_bytes_s: float
    memory_gib: float  # total as vLLM reports it (torch.cuda.mem_get_info)
    cost_per_hour: float  # default on-demand USD/h, overridable per resource

    def __post_init__(self):
        for name in ("peak_flops", "mem_bw_bytes_s", "memory_gib"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise InputError(f"gpu.{name}", f"expected a positive number, got {value!r}")
        if not (isinstance(self.cost_per_hour, (int, float)) and self.cost_per_hour >= 0):
            raise InputError("gpu.cost_per_hour", f"expected a non-negative number, got {self.cost_per_hour!r}")

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB

    @property
    def ridge_flop_per_byte(self) -> float:
        """Roofline ridge point: arithmetic intensity where compute and bandwidth balance."""
        return self.peak_flops / self.mem_bw_bytes_s


GPUS: dict[str, GPU] = {g.key: g for g in [
    # The data's machine (data/real-h100): paper figures, memory as vLLM reported it.
    GPU("h100-64gb", "NVIDIA H100 64GB (GH100)", 989e12, 1.62e12, 63.43, 4.0),
    GPU("h100-80gb", "NVIDIA H100 SXM 80GB", 989e12, 3.35e12, 79.19, 5.0),
    GPU("h100-pcie-80gb", "NVIDIA H100 PCIe 80GB", 756e12, 2.0e12, 79.19, 4.0),
    GPU("h200", "NVIDIA H200 141GB", 989e12, 4.8e12, 139.8, 6.0),
    GPU("a100-40gb", "NVIDIA A100 SXM 40GB", 312e12, 1.555e12, 39.39, 3.0),
    GPU("a100-80gb", "NVIDIA A100 SXM 80GB", 312e12, 2.039e12, 79.15, 5.0),
    GPU("l40s", "NVIDIA L40S 48GB", 362e12, 0.864e12, 44.52, 1.8),
    GPU("l4", "NVIDIA L4 24GB", 121e12, 0.3e12, 22.03, 0.8),
]}

# Unambiguous other spellings only: a family name alone ("h100", "a100") has several variants
# whose memory and bandwidth differ, so it is an error that lists them (get_gpu).
ALIASES = {"h100-sxm-80gb": "h100-80gb", "h100-sxm": "h100-80gb",
           "h100-pcie": "h100-pcie-80gb", "h200-141gb": "h200",
           "l40s-48gb": "l40s", "l4-24gb": "l4"}

_OVERRIDABLE = {f.name for f in fields(GPU)} - {"key"}


def get_gpu(key: str, /, **overrides) -> GPU:
    """Catalog lookup; ``overrides`` replace fields (e.g. ``cost_per_hour=2.5``)."""
    k = str(key).strip().lower()
    k = ALIASES.get(k, k)
    if k not in GPUS:
        variants = sorted(g for g in GPUS if g.startswith(k + "-"))
        if variants:
            raise InputError("gpu", f"ambiguous GPU {key!r}: say which variant, one of {', '.join(variants)}")
        raise InputError("gpu", f"unknown GPU {key!r}; expected one of {', '.join(sorted(GPUS))}")
    bad = set(overrides) - _OVERRIDABLE
    if bad:
        raise InputError("gpu", f"cannot override {sorted(bad)}; overridable: {sorted(_OVERRIDABLE)}")
    clean = {k2: v for k2, v in overrides.items() if v is not None}
    return replace(GPUS[k], **clean) if clean else GPUS[k]
