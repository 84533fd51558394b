"""Modeled training jobs (sloserve/sim/harvest_models.py): drawn truths, what the scheduler sees, the report."""

from __future__ import annotations

import numpy as np
import pytest

from sloserve.autoscaler.placement.perfmodel import fit_loss
from sloserve.autoscaler.placement.types import PlacementConfig
from sloserve.sim.harvest import HarvestConfig
from sloserve.sim.harvest_models import JobModelConfig, ModeledHarvest, draw_truths
from sloserve.sim.training_trace import JobSpec

TYPES = {"m0": "t4", "m1": "a100"}
GPUS = {"t4": 10, "a100": 6}
HCFG = HarvestConfig(gpus=GPUS, iteration_time_s=(0.2, 1.0), checkpoint_every_s=300.0, checkpoint_write_s=5.0)


def _jobs(n: int = 40, seed: int = 0) -> list[JobSpec]:
    rng = np.random.default_rng(seed)
    return [
        JobSpec(
            f"j{i}",
            float(rng.uniform(0, 3000)),
            float(rng.choice([120, 600, 1800, 5400])),
            int(rng.choice([1, 1, 2, 4])),
            tenant=f"t{i % 3}",
        )
        for i in range(n)
    ]


def test_truths_follow_the_documented_distributions():
    mcfg = JobModelConfig(noisy_fraction=0.2, diverging_fraction=0.2, deadline_fraction=0.5)
    tr = draw_truths(_jobs(200), HCFG, mcfg, 6)
    kinds = [t.kind for t in tr]
    assert 0.1 < kinds.count("noisy") / 200 < 0.3 and 0.1 < kinds.count("diverging") / 200 < 0.3
    deadlines = [t for t in tr if t.deadline_s is not None]
    assert 0.35 < len(deadlines) / 200 < 0.65
    assert all(t.target_loss is None for t in deadlines)  # deadline jobs declare their budget instead
    for t in tr:
        if t.kind == "normal" and t.target_loss is not None and len(t.report_k) > 8:
            fit = fit_loss(tuple(zip(t.report_k.tolist(), t.report_loss.tolist(), strict=True)))
            assert fit is not None and fit.iteration_at(t.target_loss) == pytest.approx(t.total_iterations, rel=0.2)
    assert draw_truths(_jobs(20), HCFG, mcfg, 6)[3].base_s == draw_truths(_jobs(20), HCFG, mcfg, 6)[3].base_s


def _drive(queue: str, rounds: int = 120, tick_s: float = 60.0) -> ModeledHarvest:
    pcfg = PlacementConfig(pack_small_replicas=False, substitute_types=False, training_queue=queue)
    h = ModeledHarvest("cost-aware", _jobs(), TYPES, HCFG, pcfg, JobModelConfig(deadline_fraction=0.3))
    rng = np.random.default_rng(5)
    holding = {m: 0 for m in TYPES}
    for k in range(rounds):
        wants = {"m0": int(rng.integers(0, 5)), "m1": int(rng.integers(0, 4))}
        holding = h.allocate(wants, holding, now_s=k * tick_s)
        assert h.check() == []
        for j in h.jobs.values():
            view = h._job_view(j, k * tick_s)
            if queue == "predictive":  # the predictive queue never sees a true length
                assert view.total_iterations is None
                if view.perf is not None and view.perf.max_iterations is not None:
                    assert view.perf.deadline_s is not None
    h.finish(rounds * tick_s)
    return h


@pytest.mark.parametrize("queue", ["predictive", "las", "srtf"])
def test_modeled_world_runs_and_reports(queue):
    h = _drive(queue)
    rep = h.report()
    assert rep["jobs_finished"] > 10
    for key in ("jct_all_p99_s", "fairness_max", "deadline_jobs", "deadline_met_admitted", "last_finish_s"):
        assert key in rep
    assert rep["fairness_max"] is None or rep["fairness_max"] > 0
    if queue == "predictive":
        assert rep["predictable_share"] is not None and rep["predictable_share"] > 0
        assert rep["prediction_error_median"] is not None and rep["prediction_error_median"] < 0.5


def test_elastic_and_typed_runs_change_the_speed():
    h = ModeledHarvest("cost-aware", _jobs(3), TYPES, HCFG, PlacementConfig(training_queue="predictive"))
    j = h.arrivals[0]
    tr = j.truth
    assert tr is not None
    assert tr.iteration_s("a100", 1) < tr.iteration_s("t4", 1)
    assert tr.iteration_s("t4", 2) < tr.iteration_s("t4", 1)
