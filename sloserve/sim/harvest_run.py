"""Run the harvest experiment: every (autoscaler, placement, training queue) on the same arrivals and jobs.

Results are keyed ``"<autoscaler>/<placement>"``, or ``"<autoscaler>/<placement>/<queue>"`` when
more than one training queue is asked for (``none``, which runs no training, has no queue). When ``static`` is asked for, the ``none`` run
(no training; inference alone on the typed pool, the baseline) goes first and sizes the static
partition: each type's inference share is the peak number of GPUs inference held in that run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sloserve.autoscaler.placement.queue import QUEUES
from sloserve.autoscaler.placement.types import PlacementConfig
from sloserve.sim.control import ModelSpec
from sloserve.sim.engine import SimConfig
from sloserve.sim.harvest import PLACEMENTS, HarvestConfig, HarvestPlacement, static_config
from sloserve.sim.harvest_models import MODEL_KEYS, JobModelConfig, ModeledHarvest
from sloserve.sim.run import run_experiment
from sloserve.sim.training_trace import JobSpec

HARVEST_KEYS = (
    "training_gpu_hours",
    "idle_gpu_hours",
    "unused_gpu_hours",
    "inference_gpu_hours",
    "harvest_fraction",
    "training_work_gpu_hours",
    "preemptions",
    "preemptions_killed",
    "preempted_gpus",
    "lost_work_gpu_hours",
    "lost_per_preemption_intervals_mean",
    "lost_per_preemption_intervals_max",
    "jobs_submitted",
    "jobs_finished",
    "jct_jobs_finished",
    "jct_mean_s",
    "jct_median_s",
    "jct_p95_s",
    "jct_jobs_submitted",
    "jct_all_mean_s",
    "jct_all_p95_s",
    "priority_preemptions",
)


def order_placements(names: list[str]) -> list[str]:
    """Known names, ``none`` first (it is the baseline and sizes ``static``)."""
    bad = [n for n in names if n not in PLACEMENTS]
    if bad:
        raise ValueError(f"unknown placement(s) {bad}; known: {list(PLACEMENTS)}")
    names = list(dict.fromkeys(names))
    if "static" in names and "none" not in names:
        names.insert(0, "none")
    return sorted(names, key=lambda n: n != "none")


def run_harvest(
    specs: list[ModelSpec],
    autoscalers: list[str],
    placements: list[str],
    cfg: SimConfig,
    jobs: list[JobSpec],
    hcfg: HarvestConfig,
    pcfg: PlacementConfig | None = None,
    mode: str = "fluid",
    show_progress: bool = True,
    static_margin: float = 0.0,
    queues: list[str] | None = None,
    models: JobModelConfig | None = None,
) -> dict[str, Any]:
    """``queues``: training queues to run each placement with (default: ``pcfg``'s own). ``models``:
    run every queue on modeled jobs (sloserve/sim/harvest_models.py; the predictive queue needs them)."""
    pcfg = pcfg or PlacementConfig(pack_small_replicas=False, substitute_types=False)
    queues = list(dict.fromkeys(queues or [pcfg.training_queue]))
    bad = [q for q in queues if q not in QUEUES]
    if bad:
        raise ValueError(f"unknown training queue(s) {bad}; known: {list(QUEUES)}")
    types = {s.name: s.device_type for s in specs}
    out: dict[str, Any] = {}
    for a in autoscalers:
        peak: dict[str, int] | None = None
        for p in order_placements(placements):
            for q in queues if p != "none" else queues[:1]:
                pc = pcfg.model_copy(update={"training_queue": q})
                if p == "static":
                    pc = static_config(pc, peak, static_margin) if peak else pc

                def hook(p: str = p, pc: PlacementConfig = pc) -> HarvestPlacement:
                    if models is not None:
                        return ModeledHarvest(p, jobs, types, hcfg, pc, models)
                    return HarvestPlacement(p, jobs, types, hcfg, pc)

                runs = run_experiment(specs, [a], cfg, mode, hook, show_progress)
                res = runs[a]
                if p == "none":
                    peak = res["placement"]["peak_inference_gpus_by_type"]
                if p == "static":
                    res["placement"]["static_inference_gpus"] = dict(pc.static_inference_gpus)
                out[f"{a}/{p}/{q}" if len(queues) > 1 and p != "none" else f"{a}/{p}"] = res
    return out


def summary_rows(runs: dict[str, Any]) -> list[dict]:
    """One row per run: the goal metrics (for the CLI print-out and docs/benchmarks.md)."""
    rows = []
    base = {k.split("/")[0]: r["summary"]["slo_attainment"] for k, r in runs.items() if k.endswith("/none")}
    for key, res in runs.items():
        rep, s = res["placement"], res["summary"]
        b = base.get(key.split("/")[0])
        rows.append(
            {
                "policy": key,
                "training_queue": rep.get("training_queue"),
                "slo_attainment": s["slo_attainment"],
                "delta_points": None if b is None else 100 * (s["slo_attainment"] - b),
                **{k: rep.get(k) for k in HARVEST_KEYS + MODEL_KEYS if k in rep},
                "wall_s": res["wall_s"],
            }
        )
    return rows


def plot_harvest(path: str | Path, runs: dict[str, Any], title: str = "") -> None:
    """GPUs by use (inference / training / idle) over the run, one panel per placement; preemptions below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in runs if runs[k]["placement"].get("series") and not k.endswith("/none")] or list(runs)
    fig, axes = plt.subplots(
        len(keys) + 1,
        1,
        figsize=(11, 2.6 * len(keys) + 2.2),
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": [3] * len(keys) + [2]},
    )
    for ax, key in zip(axes[:-1, 0], keys, strict=True):
        rep = runs[key]["placement"]
        ser = rep["series"]
        t = np.array(ser["t_s"]) / 3600.0
        ax.stackplot(
            t,
            ser["inference"],
            ser["training"],
            ser["idle"],
            labels=["inference", "training", "idle"],
            colors=["#1f77b4", "#2ca02c", "#d9d9d9"],
            step="post",
        )
        ax.set_ylabel("GPUs")
        ax.set_ylim(0, sum(rep["gpus"].values()))
        ax.set_title(
            f"{key}: training used {100 * rep['harvest_fraction']:.1f}% of idle GPU-h, "
            f"{rep['preemptions']} preemptions, lost {rep['lost_work_gpu_hours']:.0f} GPU-h, "
            f"SLO attainment {100 * runs[key]['summary']['slo_attainment']:.2f}%",
            fontsize=9,
        )
        if ax is axes[0, 0]:
            ax.legend(loc="lower left", fontsize=8, ncol=3)
    pax = axes[-1, 0]
    for key in keys:
        ser = runs[key]["placement"]["series"]
        dt_h = (ser["t_s"][1] - ser["t_s"][0]) / 3600.0 if len(ser["t_s"]) > 1 else 1.0
        pax.step(np.array(ser["t_s"]) / 3600.0, np.array(ser["preemptions"]) / dt_h, where="post", lw=0.8, label=key)
    pax.set_ylabel("preemptions / h")
    pax.legend(loc="upper right", fontsize=8)
    pax.set_xlabel("time (h)")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
