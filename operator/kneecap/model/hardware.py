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
    source: str = ""  # the datasheet the figures come from

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
    # peak: dense FP16/BF16 tensor FLOP/s (the datasheets' sparse figure / 2); bandwidth: the
    # datasheet's; memory: GiB as CUDA/ROCm reports the device total (a bit under the label);
    # cost: an indicative on-demand USD/h (spec.accelerator.costPerHour overrides it)
    GPU("h100-64gb", "NVIDIA H100 64GB (GH100)", 989e12, 1.62e12, 63.43, 4.0,
        "the data's machine (data/real-h100): SLIM paper's figures, memory as vLLM reported it"),
    GPU("h100-80gb", "NVIDIA H100 SXM 80GB", 989e12, 3.35e12, 79.19, 5.0,
        "NVIDIA H100 Tensor Core GPU datasheet, SXM: BF16 1,979 TFLOPS sparse, 3.35 TB/s HBM3"),
    GPU("h100-pcie-80gb", "NVIDIA H100 PCIe 80GB", 756e12, 2.0e12, 79.19, 4.0,
        "NVIDIA H100 Tensor Core GPU datasheet, PCIe: BF16 1,513 TFLOPS sparse, 2 TB/s HBM2e"),
    GPU("h200", "NVIDIA H200 141GB", 989e12, 4.8e12, 139.8, 6.0,
        "NVIDIA H200 Tensor Core GPU datasheet, SXM: BF16 1,979 TFLOPS sparse, 141 GB HBM3e, 4.8 TB/s"),
    GPU("b200", "NVIDIA B200 180GB", 2.25e15, 8.0e12, 178.4, 9.0,
        "NVIDIA HGX B200 datasheet: FP16/BF16 36 PFLOPS sparse per 8 GPUs, 180 GB HBM3e and 8 TB/s per GPU"),
    GPU("a100-40gb", "NVIDIA A100 SXM 40GB", 312e12, 1.555e12, 39.39, 3.0,
        "NVIDIA A100 Tensor Core GPU datasheet: BF16 312 TFLOPS dense, 40 GB HBM2 1,555 GB/s"),
    GPU("a100-80gb", "NVIDIA A100 SXM 80GB", 312e12, 2.039e12, 79.15, 5.0,
        "NVIDIA A100 Tensor Core GPU datasheet: BF16 312 TFLOPS dense, 80 GB HBM2e 2,039 GB/s (SXM)"),
    GPU("l40s", "NVIDIA L40S 48GB", 362e12, 0.864e12, 44.52, 1.8,
        "NVIDIA L40S datasheet: FP16 tensor 362.05 TFLOPS dense, 48 GB GDDR6 864 GB/s"),
    GPU("l4", "NVIDIA L4 24GB", 121e12, 0.3e12, 22.03, 0.8,
        "NVIDIA L4 datasheet: FP16 tensor 242 TFLOPS sparse, 24 GB GDDR6 300 GB/s"),
    GPU("a10", "NVIDIA A10 24GB", 125e12, 0.6e12, 22.03, 0.9,
        "NVIDIA A10 datasheet: BF16 tensor 125 TFLOPS dense, 24 GB GDDR6 600 GB/s"),
    GPU("a10g", "NVIDIA A10G 24GB (AWS G5)", 70e12, 0.6e12, 22.03, 1.0,
        "AWS EC2 G5; NVIDIA publishes no A10G datasheet: 24 GB GDDR6 600 GB/s as the A10, FP16 tensor "
        "~70 TFLOPS dense as reported for the A10G (an estimate: calibration corrects eta_c)"),
    GPU("mi300x", "AMD Instinct MI300X 192GB", 1307.4e12, 5.3e12, 191.98, 4.0,
        "AMD Instinct MI300X data sheet: FP16/BF16 1,307.4 TFLOPS dense, 192 GB HBM3 5.3 TB/s"),
]}

# Unambiguous other spellings only: a family name alone ("h100", "a100") has several variants
# whose memory and bandwidth differ, so it is an error that lists them (get_gpu).
ALIASES = {"h100-sxm-80gb": "h100-80gb", "h100-sxm": "h100-80gb", "h100-sxm5": "h100-80gb",
           "h100-pcie": "h100-pcie-80gb", "h200-141gb": "h200", "b200-180gb": "b200",
           "a100-sxm-80gb": "a100-80gb", "a100-sxm-40gb": "a100-40gb", "l40s-48gb": "l40s", "l4-24gb": "l4",
           "a10g-24gb": "a10g", "a10-24gb": "a10", "mi300x-192gb": "mi300x"}

_OVERRIDABLE = {f.name for f in fields(GPU)} - {"key", "source"}


def get_gpu(key: "str | GPU", /, **overrides) -> GPU:
    """Catalog lookup (a GPU passes through); ``overrides`` replace fields (e.g. ``cost_per_hour=2.5``)."""
    if isinstance(key, GPU) and not overrides:
        return key
    k = key.key if isinstance(key, GPU) else str(key).strip().lower()
    k = ALIASES.get(k, k)
    if not isinstance(key, GPU) and k not in GPUS:
        variants = sorted(g for g in GPUS if g.startswith(k + "-"))
        if variants:
            raise InputError("gpu", f"ambiguous GPU {key!r}: say which variant, one of {', '.join(variants)}")
        raise InputError("gpu", f"unknown GPU {key!r}; expected one of {', '.join(sorted(GPUS))}")
    bad = set(overrides) - _OVERRIDABLE
    if bad:
        raise InputError("gpu", f"cannot override {sorted(bad)}; overridable: {sorted(_OVERRIDABLE)}")
    clean = {k2: v for k2, v in overrides.items() if v is not None}
    base = key if isinstance(key, GPU) else GPUS[k]
    return replace(base, **clean) if clean else base
