"""What a demo run showed: the summary (read from the run's records), live lines, the trajectory PNG.

Every number comes from the run: caps and memory fractions from the Deployment's versions in
the emulated API, throughput, batch and p95s from the operator's observations in the
LLMDeployment's status, restarts from the node, request latencies from the load.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kneecap.emulation.workloads import template_hash
from kneecap.model.hardware import get_gpu

BEHIND_RATIO = 0.95  # twin seconds per time_scale × wall second below which the twins fell behind

GIB = 1024**3


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def distinct(rows) -> list:
    """Rows with a new observation window (a decision without one repeats the last numbers)."""
    seen, out = set(), []
    for r in rows:
        if r.obs_t_end_s is not None and r.obs_t_end_s not in seen:
            seen.add(r.obs_t_end_s)
            out.append(r)
    return out


def template_changes(history: list[dict]) -> int:
    """How many times the pod template changed across a Deployment's stored versions."""
    hashes = [template_hash(v["spec"]["template"]) for v in history]
    return sum(1 for a, b in zip(hashes, hashes[1:]) if a != b)


def summarize(res) -> dict:
    """The summary of a `DemoResult` (see the module docstring for where each number is read)."""
    from kneecap.demo.harness import _flags

    cfg = res.config
    mem_gib = get_gpu(cfg.gpu).memory_bytes / GIB
    start_cap, start_gmu = _flags(res.deployment_history[0])
    cap, gmu = _flags(res.deployment)
    rows = res.rows
    steady = [r for r in rows if r.phase == "steady"]
    # the last change of the Deployment's flags: after it the loop holds (converged)
    changes = [i for i in range(1, len(rows)) if (rows[i].max_num_seqs, rows[i].gpu_memory_utilization)
               != (rows[i - 1].max_num_seqs, rows[i - 1].gpu_memory_utilization)]
    conv_idx = changes[-1] if changes else 0
    after = [r for r in rows[conv_idx:] if r.phase == "steady"][1:]  # the first window after a restart is partial
    before = [r for r in steady if (r.max_num_seqs, r.gpu_memory_utilization) == (start_cap, start_gmu)]
    thr_before, thr_after = (_mean(r.throughput_tok_s for r in distinct(before)),
                             _mean(r.throughput_tok_s for r in distinct(after)))
    slo_rows = [r.slo_met for r in after if r.slo_met is not None]
    t_conv = rows[conv_idx].t_s if changes else None
    st = (res.llmd or {}).get("status") or {}
    return {
        "model": cfg.model, "gpu": cfg.gpu, "gpu_memory_gib": round(mem_gib, 3),
        "start_max_num_seqs": start_cap, "start_gpu_memory_utilization": start_gmu,
        "converged_max_num_seqs": cap, "converged_gpu_memory_utilization": gmu,
        "recommended_max_num_seqs": (st.get("recommendation") or {}).get("maxNumSeqs"),
        "released_gib": round((start_gmu - gmu) * mem_gib, 3),
        "converged_at_s": t_conv,
        "deployment_changes": template_changes(res.deployment_history),
        "changes_seen": len(changes),
        "intervals": len(rows), "intervals_after_convergence": len(after),
        "throughput_start_tok_s": thr_before, "throughput_converged_tok_s": thr_after,
        "throughput_kept": (thr_after / thr_before) if thr_before and thr_after else None,
        "batch_converged": _mean(r.batch for r in distinct(after)),
        "itl_p95_converged_s": _mean(r.itl_p95_s for r in distinct(after)),
        "slo_tpot_s": cfg.slo_tpot_s, "slo_e2e_s": cfg.slo_e2e_s,
        "slo_intervals_met": sum(slo_rows), "slo_intervals": len(slo_rows),
        "slo_attainment_intervals": (sum(slo_rows) / len(slo_rows)) if slo_rows else None,
        "restarts": res.kubelet_restarts, "twins_started": res.kubelet_started,
        "phase": st.get("phase"), "calibration_error_pct": (st.get("calibration") or {}).get("fitErrorPercent"),
        "load_completed": res.load.get("completed"), "load_failed": res.load.get("failed"),
        "load_stopped_at_end": bool(res.load.get("stopped")),
        "wall_s": round(res.wall_s, 1),
        "time_scale": cfg.time_scale,
        "twin_time_ratio": round(res.twin_time_ratio, 3), "twin_behind_s": round(res.twin_behind_s, 1),
        "twins_fell_behind": res.twin_time_ratio < BEHIND_RATIO,
        **adopted_summary(res),
        "disaggregated": cfg.disaggregated, "pool": cfg.pool,
        "requests_prefill_then_decode": res.routed_prefill_decode,
    }


def _written(deploy: dict) -> tuple:
    """What a write to a Deployment's object (not its status) can change."""
    meta = deploy["metadata"]
    return deploy["spec"], meta.get("labels"), meta.get("annotations"), meta.get("ownerReferences")


def adopted_summary(res) -> dict:
    """--adopt: what kneecap changed in the user's Deployment, read from its stored versions: the
    paths of its pod template that differ from the version the user created (all of them, and
    those left once the flags kneecap tunes are taken out: none, when it kept to its flags)."""
    if res.user_deployment is None:
        return {}
    from kneecap.control import target

    container = target.find_container(res.user_deployment, None)["name"]
    first, last = res.user_deployment["spec"]["template"], res.deployment["spec"]["template"]
    return {"adopted_deployment": res.user_deployment["metadata"]["name"],
            "adopted_container": container,
            "adopted_writes": sum(1 for a, b in zip(res.deployment_history, res.deployment_history[1:])
                                  if _written(a) != _written(b)),
            "adopted_template_changed_paths": target.changed_paths(first, last),
            "adopted_unmanaged_changed_paths": target.changed_paths(target.without_tuned_flags(first, container),
                                                                    target.without_tuned_flags(last, container)),
            "adopted_owner_references": res.deployment["metadata"].get("ownerReferences") or []}


def _f(v, fmt: str, none: str = "-") -> str:
    return none if v is None else format(v, fmt)


def row_line(r) -> str:
    """One live line per control interval."""
    slo = {True: "ok", False: "MISS", None: "-"}[r.slo_met]
    return (f"t={r.t_s:7.0f}s  cap={r.max_num_seqs:4d}  mem={r.gpu_memory_utilization:5.3f}  "
            f"thr={_f(r.throughput_tok_s, '8.0f')} tok/s  B={_f(r.batch, '6.1f')}  "
            f"p95 ttft={_f(r.ttft_p95_s, '6.2f')}s itl={_f(r.itl_p95_s and r.itl_p95_s * 1e3, '5.1f')}ms "
            f"e2e={_f(r.e2e_p95_s, '6.2f')}s  slo={slo:4s} restarts={r.restarts}  {r.decision}"
            + (f" -> cap {r.recommended_max_num_seqs}" if r.recommended_max_num_seqs else ""))


def summary_text(s: dict) -> str:
    kept = s["throughput_kept"]
    att = s["slo_attainment_intervals"]
    return "\n".join([
        f"kneecap demo: {s['model']} on {s['gpu']} ({s['gpu_memory_gib']:.0f} GiB), wall {s['wall_s']:.0f}s",
        f"  cap          {s['start_max_num_seqs']} -> {s['converged_max_num_seqs']}"
        f"  (converged at t={_f(s['converged_at_s'], '.0f')}s, {s['deployment_changes']} change(s))",
        f"  memory       {s['start_gpu_memory_utilization']:g} -> {s['converged_gpu_memory_utilization']:g}"
        f" of the GPU: {s['released_gib']:.1f} GiB released",
        f"  throughput   {_f(s['throughput_start_tok_s'], '.0f')} -> {_f(s['throughput_converged_tok_s'], '.0f')}"
        f" tok/s ({_f(kept and kept * 100, '.1f')}% kept)",
        f"  SLO          {_f(att and att * 100, '.0f')}% of {s['slo_intervals']} intervals after convergence met"
        f" (TPOT {_f(s['slo_tpot_s'], 'g')}s, ITL p95 {_f(s['itl_p95_converged_s'] and s['itl_p95_converged_s'] * 1e3, '.1f')} ms)",
        f"  restarts     {s['restarts']} pod restart(s)",
        *adopted_lines(s),
        *([f"  P/D path     {s['requests_prefill_then_decode']} request(s) prefilled on the prefill pool, their KV "
           f"read and decoded on {s['pool']}"] if s["disaggregated"] else []),
        twin_time_line(s),
    ])


def adopted_lines(s: dict) -> list[str]:
    if "adopted_deployment" not in s:
        return []
    unmanaged = s["adopted_unmanaged_changed_paths"]
    owners = "no ownerReference" if not s["adopted_owner_references"] else "ownerReferences PRESENT"
    return [f"  adopted      Deployment {s['adopted_deployment']} (the user's): {s['adopted_writes']} patch(es), "
            f"{owners}",
            f"  pod template changed only at {', '.join(s['adopted_template_changed_paths']) or 'nothing'}"
            f" (the managed flags of container {s['adopted_container']})" if not unmanaged else
            f"  pod template CHANGED OUTSIDE THE MANAGED FLAGS at {', '.join(unmanaged)}",
            "  every other field of its pod template (labels, toleration, volume, env, mounts, other args) "
            + ("is unchanged" if not unmanaged else "is NOT unchanged")]


def twin_time_line(s: dict) -> str:
    """Whether the twins kept up with the asked time scale (their clock is the demo's clock)."""
    ratio, scale = s["twin_time_ratio"], s["time_scale"]
    if s["twins_fell_behind"]:
        return (f"  twins fell behind: lag ratio {ratio:.2f} (ran at {ratio * scale:.2g}x of the asked {scale:g}x, "
                f"{s['twin_behind_s']:.0f} simulated s lost); every time and rate here is on the twins' clock")
    return f"  twin clock   kept up (ratio {ratio:.2f} of {scale:g}x)"


def plot(res, path: Path) -> Path:
    """Trajectory: cap (applied, recommended), memory fraction, throughput and ITL p95 over time."""
    from kneecap.plotting import pyplot

    plt = pyplot("demo")

    rows = res.rows
    t = np.array([r.t_s for r in rows], dtype=float)
    nan = lambda v: np.nan if v is None else v  # noqa: E731
    fig, ax = plt.subplots(4, 1, figsize=(9, 9), sharex=True)
    ax[0].step(t, [r.max_num_seqs for r in rows], where="post", label="applied --max-num-seqs")
    ax[0].plot(t, [nan(r.recommended_max_num_seqs) for r in rows], "o", ms=3, label="recommended (BCA)")
    ax[0].set_ylabel("cap")
    ax[1].step(t, [r.gpu_memory_utilization for r in rows], where="post", color="C2")
    ax[1].set_ylabel("--gpu-memory-\nutilization")
    ax[2].plot(t, [nan(r.throughput_tok_s) for r in rows], ".-", color="C1")
    ax[2].set_ylabel("tok/s")
    ax[3].plot(t, [1e3 * nan(r.itl_p95_s) for r in rows], ".-", color="C3", label="ITL p95")
    if res.config.slo_tpot_s:
        ax[3].axhline(1e3 * res.config.slo_tpot_s, ls="--", color="k", lw=0.8, label="TPOT SLO")
    ax[3].set_ylabel("ms")
    ax[3].set_xlabel("simulated seconds")
    for a in ax:
        a.axvline(res.config.warmup_s, color="grey", lw=0.6, ls=":")
        a.grid(alpha=0.3)
    ax[0].legend(loc="upper right", fontsize=8)
    ax[3].legend(loc="upper right", fontsize=8)
    s = res.summary
    fig.suptitle(f"kneecap demo: {res.config.model} on {res.config.gpu}: cap {s.get('start_max_num_seqs')} -> "
                 f"{s.get('converged_max_num_seqs')}, {s.get('released_gib', 0):.1f} GiB released")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
