"""GPU catalog: peak dense 16-bit FLOP/s, memory bandwidth, memory as vLLM reports it, cost, and
the interconnect tensor-parallel collectives run over (per-GPU bandwidth and per-step latency)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from types import MappingProxyType

from kneecap.errors import InputError

GIB = 1024**3

# Interconnects: (name, per-GPU bandwidth in one direction, bytes/s; per-step latency, s).
# Bandwidth is the datasheet's per-GPU figure halved (datasheets quote both directions), which is
# the bus bandwidth a ring all-reduce can reach (nccl-tests doc/PERFORMANCE.md: all-reduce busBw = algBw·2(n−1)/n).
# Latency per ring step is NCCL's own tuning constant for the LL protocol on a Ring (src/graph/
# tuning.cc hwLat: NVLink 0.47 µs, PCI 1.0 µs); the per-call base is ALLREDUCE_BASE_LATENCY_S.
NVLINK3 = ("NVLink 3 (12 links)", 300e9, 0.47e-6)  # A100 SXM: 600 GB/s bidirectional
NVLINK4 = ("NVLink 4 (18 links)", 450e9, 0.47e-6)  # H100/H200 SXM: 900 GB/s bidirectional
NVLINK4_BRIDGE = ("NVLink 4 bridge (pair)", 300e9, 0.47e-6)  # H100 NVL: 600 GB/s bidirectional
NVLINK5 = ("NVLink 5 (18 links)", 900e9, 0.47e-6)  # B200: 1.8 TB/s bidirectional
PCIE4 = ("PCIe 4.0 x16", 32e9, 1.0e-6)  # 64 GB/s bidirectional
PCIE5 = ("PCIe 5.0 x16", 64e9, 1.0e-6)  # 128 GB/s bidirectional
INFINITY_FABRIC = ("AMD Infinity Fabric (7 links)", 448e9, 0.47e-6)  # MI300X: 896 GB/s aggregate
ALLREDUCE_BASE_LATENCY_S = 3.6e-6  # NCCL tuning.cc baseLat, Ring/LL: per collective call


@dataclass(frozen=True)
class GPU:
    key: str
    name: str
    peak_flops: float  # dense fp16/bf16 FLOP/s (no sparsity)
    mem_bw_bytes_s: float
    memory_gib: float  # total as vLLM reports it (torch.cuda.mem_get_info)
    cost_per_hour: float  # default on-demand USD/h, overridable per resource
    source: str = ""  # the datasheet the figures come from
    interconnect: str = PCIE4[0]  # what GPUs of one replica talk over (TP all-reduces)
    link_bw_bytes_s: float = PCIE4[1]  # per GPU, one direction (the ring's bus bandwidth)
    link_latency_s: float = PCIE4[2]  # per ring step

    def __post_init__(self):
        for name in ("peak_flops", "mem_bw_bytes_s", "memory_gib", "link_bw_bytes_s", "link_latency_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and value > 0):
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


def _gpu(key, name, peak, bw, mem, cost, source, link) -> GPU:
    return GPU(key, name, peak, bw, mem, cost, source, *link)


GPUS: Mapping[str, GPU] = MappingProxyType({g.key: g for g in [
    # peak: dense FP16/BF16 tensor FLOP/s (the datasheets' sparse figure / 2); bandwidth: the
    # datasheet's; memory: GiB as CUDA/ROCm reports the device total (a bit under the label);
    # cost: an indicative on-demand USD/h (spec.accelerator.costPerHour overrides it);
    # link: the interconnect of the usual multi-GPU server of that part (constants above)
    _gpu("h100-64gb", "NVIDIA H100 64GB (GH100)", 989e12, 1.62e12, 63.43, 4.0,
         "the data's machine (data/real-h100): SLIM paper's figures, memory as vLLM reported it; "
         "interconnect not recorded: NVLink 4 of an SXM board assumed", NVLINK4),
    _gpu("h100-80gb", "NVIDIA H100 SXM 80GB", 989e12, 3.35e12, 79.19, 5.0,
         "NVIDIA H100 Tensor Core GPU datasheet, SXM: BF16 1,979 TFLOPS sparse, 3.35 TB/s HBM3, "
         "NVLink 900 GB/s", NVLINK4),
    _gpu("h100-pcie-80gb", "NVIDIA H100 PCIe 80GB", 756e12, 2.0e12, 79.19, 4.0,
         "NVIDIA H100 Tensor Core GPU datasheet, PCIe: BF16 1,513 TFLOPS sparse, 2 TB/s HBM2e, "
         "PCIe Gen5 128 GB/s (no NVLink bridge)", PCIE5),
    _gpu("h100-nvl", "NVIDIA H100 NVL 94GB", 835.5e12, 3.9e12, 93.1, 4.5,
         "NVIDIA H100 Tensor Core GPU datasheet, NVL: BF16 1,671 TFLOPS sparse, 94 GB HBM3 3.9 TB/s, "
         "NVLink bridge 600 GB/s between the pair", NVLINK4_BRIDGE),
    _gpu("h200", "NVIDIA H200 141GB", 989e12, 4.8e12, 139.8, 6.0,
         "NVIDIA H200 Tensor Core GPU datasheet, SXM: BF16 1,979 TFLOPS sparse, 141 GB HBM3e, 4.8 TB/s, "
         "NVLink 900 GB/s", NVLINK4),
    _gpu("b200", "NVIDIA B200 180GB", 2.25e15, 8.0e12, 178.4, 9.0,
         "NVIDIA HGX B200 datasheet: FP16/BF16 36 PFLOPS sparse per 8 GPUs, 180 GB HBM3e and 8 TB/s per GPU, "
         "NVLink 5 1.8 TB/s per GPU", NVLINK5),
    _gpu("a100-40gb", "NVIDIA A100 SXM 40GB", 312e12, 1.555e12, 39.39, 3.0,
         "NVIDIA A100 Tensor Core GPU datasheet: BF16 312 TFLOPS dense, 40 GB HBM2 1,555 GB/s, "
         "NVLink 600 GB/s (SXM)", NVLINK3),
    _gpu("a100-80gb", "NVIDIA A100 SXM 80GB", 312e12, 2.039e12, 79.15, 5.0,
         "NVIDIA A100 Tensor Core GPU datasheet: BF16 312 TFLOPS dense, 80 GB HBM2e 2,039 GB/s (SXM), "
         "NVLink 600 GB/s", NVLINK3),
    _gpu("l40s", "NVIDIA L40S 48GB", 362e12, 0.864e12, 44.52, 1.8,
         "NVIDIA L40S datasheet: FP16 tensor 362.05 TFLOPS dense, 48 GB GDDR6 864 GB/s, PCIe Gen4 x16 "
         "64 GB/s (no NVLink)", PCIE4),
    _gpu("l4", "NVIDIA L4 24GB", 121e12, 0.3e12, 22.03, 0.8,
         "NVIDIA L4 datasheet: FP16 tensor 242 TFLOPS sparse, 24 GB GDDR6 300 GB/s, PCIe Gen4 x16 64 GB/s",
         PCIE4),
    _gpu("a10", "NVIDIA A10 24GB", 125e12, 0.6e12, 22.03, 0.9,
         "NVIDIA A10 datasheet: BF16 tensor 125 TFLOPS dense, 24 GB GDDR6 600 GB/s, PCIe Gen4 64 GB/s", PCIE4),
    _gpu("a10g", "NVIDIA A10G 24GB (AWS G5)", 70e12, 0.6e12, 22.03, 1.0,
         "AWS EC2 G5; NVIDIA publishes no A10G datasheet: 24 GB GDDR6 600 GB/s as the A10, FP16 tensor "
         "~70 TFLOPS dense as reported for the A10G (an estimate: calibration corrects eta_c); PCIe Gen4", PCIE4),
    _gpu("rtx-4090", "NVIDIA GeForce RTX 4090 24GB", 165.2e12, 1.008e12, 23.52, 0.4,
         "NVIDIA Ada GPU architecture whitepaper, RTX 4090: BF16 tensor (FP32 accumulate) 165.2 TFLOPS "
         "dense, 24 GB GDDR6X 1,008 GB/s, PCIe Gen4 x16, no NVLink; memory as torch reported it "
         "(25,250,627,584 B, data/gpu-latency/raw/llmservingsim/RTX4090/Llama-3.1-8B/meta.json)", PCIE4),
    _gpu("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell 96GB", 503.8e12, 1.792e12, 95.1, 1.8,
         "NVIDIA RTX Blackwell GPU architecture whitepaper, RTX PRO 6000: FP16/BF16 tensor (FP32 "
         "accumulate) 503.8 TFLOPS dense (4 PFLOPS FP4 sparse / 8), 96 GB GDDR7 ECC 1,792 GB/s, PCIe Gen5 "
         "x16, no NVLink; memory: 97,887 MiB less the ~0.5 GiB CUDA keeps (as on the 4090)", PCIE5),
    _gpu("mi300x", "AMD Instinct MI300X 192GB", 1307.4e12, 5.3e12, 191.98, 4.0,
         "AMD Instinct MI300X data sheet: FP16/BF16 1,307.4 TFLOPS dense, 192 GB HBM3 5.3 TB/s, "
         "Infinity Fabric 896 GB/s peak aggregate", INFINITY_FABRIC),
]})

# Unambiguous other spellings only: a family name alone ("h100", "a100") has several variants
# whose memory and bandwidth differ, so it is an error that lists them (get_gpu).
ALIASES = MappingProxyType({"h100-sxm-80gb": "h100-80gb", "h100-sxm": "h100-80gb", "h100-sxm5": "h100-80gb",
                            "h100-sxm5-80gb": "h100-80gb", "h100-pcie": "h100-pcie-80gb", "h100-nvl-94gb": "h100-nvl",
                            "h200-141gb": "h200", "h200-sxm": "h200", "b200-180gb": "b200",
                            "a100-sxm-80gb": "a100-80gb", "a100-sxm4-80gb": "a100-80gb", "a100-sxm-40gb": "a100-40gb",
                            "a100-sxm4-40gb": "a100-40gb", "l40s-48gb": "l40s", "l4-24gb": "l4",
                            "a10g-24gb": "a10g", "a10-24gb": "a10", "mi300x-192gb": "mi300x",
                            "rtx4090": "rtx-4090", "geforce-rtx-4090": "rtx-4090", "rtx-4090-24gb": "rtx-4090",
                            "rtxpro6000": "rtx-pro-6000", "rtx-pro-6000-blackwell": "rtx-pro-6000", "rtx-pro-6000-96gb": "rtx-pro-6000"})

_OVERRIDABLE = frozenset({f.name for f in fields(GPU)} - {"key", "source"})


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
