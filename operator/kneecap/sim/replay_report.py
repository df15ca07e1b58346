"""What a replay shows: the comparison table (text and Markdown) and the PNG over time."""

from __future__ import annotations

from pathlib import Path

COLUMNS = [  # (header, key or function of a policy's scores, format)
    ("policy", lambda s: s["policy"], "{}"),
    ("goodput req/s", "goodput_rps", "{:.2f}"),
    ("SLO att. (req)", "slo_attainment_requests", "{:.2%}"),
    ("SLO att. (win)", "slo_attainment_windows", "{:.1%}"),
    ("TTFT p50/p95/p99 s", lambda s: "/".join(_f(s["ttft_s"][q], "{:.3g}") for q in ("p50", "p95", "p99")), "{}"),
    ("TPOT p50/p95/p99 ms", lambda s: "/".join(_f(None if s["tpot_s"][q] is None else 1e3 * s["tpot_s"][q], "{:.3g}")
                                               for q in ("p50", "p95", "p99")), "{}"),
    ("GPU-h", "gpu_hours", "{:.3f}"),
    ("good req/GPU-h", "good_per_gpu_hour", "{:.0f}"),
    ("mean mem", "mean_memory_fraction", "{:.3f}"),
    ("GiB released", "mean_memory_released_gib", "{:.1f}"),
    ("restarts", "restarts", "{}"),
    ("cut by restarts", "interrupted_by_restarts", "{}"),
    ("lost", "lost", "{}"),
    ("decisions", lambda s: len(s["decisions"]), "{}"),
]


def _f(v, fmt: str) -> str:
    return "—" if v is None else fmt.format(v)


def rows(report: dict) -> list[list[str]]:
    out = []
    for s in report["policies"].values():
        out.append([_f(key(s) if callable(key) else s.get(key), fmt) for _, key, fmt in COLUMNS])
    return out


def table_text(report: dict) -> str:
    head = [h for h, _, _ in COLUMNS]
    body = rows(report)
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    line = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([line(head), *(line(r) for r in body)])


def table_markdown(report: dict) -> str:
    head = [h for h, _, _ in COLUMNS]
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                      *("| " + " | ".join(r) + " |" for r in rows(report))])


def plot(report: dict, series: dict[str, dict], path: Path, title: str = "") -> None:
    """Load, replicas, cap, memory and the latency quantiles over time, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(6, 1, figsize=(10, 13), sharex=True)
    first = next(iter(series.values()))

    def windows(s: dict, key: str, scale: float = 1.0):  # the last window drawn to its end too
        x = list(s["window_start_s"])
        y = [float("nan") if v is None else scale * v for v in s[key]]
        if x:
            x.append(x[-1] + (x[1] - x[0] if len(x) > 1 else report["config"]["window_s"]))
            y.append(y[-1])
        return x, y

    axes[0].step(*windows(first, "rate_rps"), where="post", color="0.3")
    axes[0].set_ylabel("arrivals req/s")
    q = report["config"]["quantile"]
    for name, s in series.items():
        axes[1].step(s["t_s"], s["pods"], where="post", label=name)
        axes[2].step(s["t_s"], [float("nan") if v is None else v for v in s["max_num_seqs"]], where="post", label=name)
        axes[3].step(s["t_s"], [float("nan") if v is None else v for v in s["memory_fraction"]], where="post",
                     label=name)
        axes[4].step(*windows(s, "ttft_q_s"), where="post", label=name)
        axes[5].step(*windows(s, "tpot_q_s", 1e3), where="post", label=name)
    cfg = report["config"]
    axes[4].axhline(cfg["slo_ttft_s"], color="k", ls=":", lw=1)
    axes[5].axhline(1e3 * cfg["slo_tpot_s"], color="k", ls=":", lw=1)
    axes[4].set_yscale("log")
    for ax, label in zip(axes[1:], ("pods (GPUs)", "max_num_seqs", "GPU memory fraction", f"TTFT p{q * 100:g} s",
                                    f"TPOT p{q * 100:g} ms")):
        ax.set_ylabel(label)
    axes[1].legend(loc="upper left", fontsize=8)
    axes[-1].set_xlabel("simulated seconds")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
