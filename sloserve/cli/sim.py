"""``sloserve sim``: replay a trace (or a synthetic load) through the autoscalers in virtual time.

Example (one Azure Functions column, scaled so its peak needs 8 replicas)::

    sloserve sim --trace sloserve/loadtests/traces/azure_functions_2019_selected_per_minute.csv \\
        --column diurnal_strong --kind counts --interval-s 60 --peak-replicas 8 --slo-ms 1000 \\
        --autoscaler swayam,ray-default,kpa,oracle --seed 0 --out out/sim

With ``--device-types`` it simulates variants across device types instead (``sloserve/sim/pairs.py``): one model
of a model repository, a replica set per (variant, device type), the ``slo`` policy choosing a pair per
batch against the best single variant and the best single pair, on a 3-phase burst::

    sloserve sim --repo model_repository --pair-model heavy --device-types cpu:1,emul-slow:1 \
        --emulate emul-slow=2 --rate 3000 --burst-factor 3 --duration-s 3 --slo-ms 20 --out out/pairs
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from sloserve.sim import arrivals as arr


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sim",
        help="trace-driven autoscaling simulator (virtual time)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--trace", help="CSV trace (per-interval counts or timestamps)")
    p.add_argument("--column", help="column(s) to replay, comma-separated: one model each")
    p.add_argument("--kind", choices=["counts", "timestamps"], default="counts")
    p.add_argument("--interval-s", type=float, default=60.0, help="seconds per row, for --kind counts")
    p.add_argument("--time-unit-s", type=float, default=1.0, help="seconds per timestamp unit")
    p.add_argument(
        "--wide",
        action="store_true",
        help="wide counts CSV: one row per model (first column an id), one column per interval",
    )
    p.add_argument("--models", type=int, default=0, help="--wide: take the N rows with the most requests")
    p.add_argument("--synthetic", choices=["poisson", "gamma", "diurnal"], help="instead of --trace")
    p.add_argument("--rate", type=float, default=100.0, help="synthetic mean rate, req/s")
    p.add_argument("--cv", type=float, default=2.0, help="gamma-burst CV of the per-10s rate")
    p.add_argument("--duration-s", type=float, default=3600.0, help="synthetic duration")
    p.add_argument("--scale", type=float, help="multiply the rate by X")
    p.add_argument("--peak-replicas", type=int, help="scale each model so its peak needs N replicas")
    p.add_argument("--start-min", type=float, default=0.0, help="replay from this minute of the trace")
    p.add_argument("--minutes", type=float, default=0.0, help="replay only this many minutes (0 = all)")
    p.add_argument("--slo-ms", type=float, default=None, help="default 1000 (--device-types: the model's slo_ms)")
    p.add_argument(
        "--model-class", default="gpt2-gen", help="profile of sloserve/sim/profiles.py (comma list: round robin)"
    )
    p.add_argument("--device", default="t4", help="simulated GPU type of the profile")
    p.add_argument(
        "--fallback-class",
        default="",
        help="a cheaper variant every replica also holds (e.g. distilgpt2-gen for gpt2-gen): the "
        "batcher serves it while the primary is short, and swayam sizes its warm buffer with it; "
        "a comma list pairs with --model-class by position (an empty entry: no fallback)",
    )
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--autoscaler", default="swayam,ray-default,kpa,oracle", help="NAME[,NAME...]")
    p.add_argument("--mode", choices=["auto", "request", "fluid"], default="auto")
    p.add_argument("--startup-s", type=float, default=10.0, help="replica start-up (model load) time")
    p.add_argument("--tick-s", type=float, default=10.0, help="seconds between autoscaling rounds")
    p.add_argument("--gateways", type=int, default=2, help="gateways sharing each model's traffic")
    p.add_argument("--batching", default="", help="batching policy (request level; default slo, else timeout)")
    p.add_argument("--gpus", type=int, default=1_000_000, help="size of the fixed GPU pool")
    p.add_argument("--swayam", default="{}", help="JSON overrides of SwayamConfig")
    p.add_argument(
        "--split-types",
        default="",
        help="TYPE[,TYPE...] of sloserve/sim/profiles.py: each model runs on all of them (fluid mode), each type sized "
        "for its part of the demand (sloserve/autoscaler/typesplit.py: best requests/s per --type-cost first, up to "
        "--type-max); reports replica-seconds and cost per type",
    )
    p.add_argument("--type-max", default="", help="TYPE=N[,...]: most replicas per type with --split-types")
    p.add_argument("--seed", type=int, default=0)
    t = p.add_argument_group("training harvest", "share typed GPUs with preemptible training jobs")
    t.add_argument("--training-trace", help="CSV of training jobs (submit time, duration, GPU count)")
    t.add_argument("--training-submit-col", default="submit_s", help="column: submit time, seconds")
    t.add_argument("--training-duration-col", default="duration_s", help="column: duration, seconds")
    t.add_argument("--training-gpus-col", default="num_gpus", help="column: GPUs per job")
    t.add_argument("--training-tenant-col", default="", help="column: whose job it is (Philly: vc); default none")
    t.add_argument("--training-start-s", type=float, default=0.0, help="slice of the training trace: start")
    t.add_argument("--training-window-s", type=float, default=0.0, help="slice length (0 = the inference duration)")
    t.add_argument("--training-time-scale", type=float, default=1.0, help="multiply submit offsets (0.5 = 2x denser)")
    t.add_argument(
        "--no-training-backlog",
        action="store_true",
        help="do not start with the jobs the trace shows running at the slice start",
    )
    t.add_argument(
        "--placement",
        default="none,static,cost-blind,cost-aware",
        help="NAME[,NAME...]: cost-aware, static, cost-blind (none = no training, the baseline)",
    )
    t.add_argument(
        "--training-queue",
        default="las",
        help="NAME[,NAME...]: las (2D-LAS, Tiresias), fifo, srtf (knows each length: the oracle), predictive "
        "(performance models); each runs every placement",
    )
    t.add_argument(
        "--job-models",
        default="",
        help="JSON overrides of JobModelConfig (sloserve/sim/harvest_models.py): every queue runs on modeled jobs "
        "(model classes, loss curves, deadlines, elastic widths); on whenever --training-queue has predictive",
    )
    t.add_argument(
        "--tenant-shares",
        default="",
        help="TENANT:SHARE[,...]: most of the harvested GPUs a tenant may hold ('*' = every other tenant)",
    )
    t.add_argument("--gpu-mix", default="t4:600,a100:400", help="typed inventory TYPE:N[,TYPE:N]")
    t.add_argument("--checkpoint-every-s", type=float, default=600.0, help="training work between checkpoints")
    t.add_argument("--checkpoint-write-s", type=float, default=10.0, help="time to write one checkpoint")
    t.add_argument("--grace-s", type=float, default=1.0, help="preemption grace period")
    t.add_argument("--restart-overhead-s", type=float, default=30.0, help="reload time of a resumed job")
    t.add_argument("--iteration-time-s", default="0.2,2.0", help="LO,HI: per-job iteration time, log-uniform")
    t.add_argument(
        "--training-headroom-gpus",
        type=int,
        default=0,
        help="idle GPUs per type kept free of training (scale-ups without preemption)",
    )
    t.add_argument("--unknown-durations", action="store_true", help="hide job durations from the policy")
    t.add_argument("--harvest-plot", default="", help="also write the GPUs-by-use plot here")
    g = p.add_argument_group("variants across device types (sloserve/sim/pairs.py)")
    g.add_argument(
        "--device-types",
        default="",
        help="TYPE[:REPLICAS][,...] per option; cpu = this host's CPU profile. A type without a count is sized "
        "for the burst's peak with the throughput-per-type table, best requests/s per --type-cost first",
    )
    g.add_argument("--type-cost", default="", help="TYPE=COST[,...]: price of a replica per type (default 1)")
    g.add_argument("--repo", default="model_repository", help="model repository whose profiles to use")
    g.add_argument("--pair-model", default="heavy", help="the model (of --repo)")
    g.add_argument("--burst-factor", type=float, default=3.0, help="the middle third's rate, times --rate")
    g.add_argument(
        "--emulate",
        default="",
        help="TYPE=SCALE[,...]: a type profiled as this host's CPU times SCALE (sloserve/loadtests/emulated.py)",
    )
    g.add_argument("--pairs-plot", default="", help="also draw the comparison here (PNG)")
    p.add_argument("--out", default="out/sim")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=main)


def load_arrivals(a: argparse.Namespace) -> list:
    if a.synthetic:
        if a.synthetic == "poisson":
            return [arr.poisson(a.rate, a.duration_s)]
        if a.synthetic == "gamma":
            return [arr.gamma_burst(a.rate, a.duration_s, a.cv, seed=a.seed)]
        return [arr.diurnal(a.rate, a.duration_s)]
    if not a.trace:
        raise SystemExit("sloserve sim: give --trace PATH (with --column) or --synthetic KIND")
    if a.wide:
        import csv

        with open(a.trace, newline="") as f:
            rows = list(csv.reader(f))
        ids = [r[0] for r in rows[1:]]
        counts = np.array([[float(x or 0) for x in r[1:]] for r in rows[1:]])
        order = np.argsort(-counts.sum(axis=1), kind="stable")[: a.models or len(ids)]
        return [arr.Arrivals(a.interval_s, counts[i] / a.interval_s, name=f"fn{ids[i]}") for i in order]
    if not a.column:
        raise SystemExit("sloserve sim: --column NAME is required with --trace")
    cols = a.column.split(",")
    if a.kind == "counts":
        return [arr.from_counts(a.trace, c, a.interval_s) for c in cols]
    return [arr.from_timestamps(a.trace, c, a.time_unit_s) for c in cols]


def main(a: argparse.Namespace) -> int:
    if a.device_types:
        return pairs_main(a)
    if a.slo_ms is None:
        a.slo_ms = 1000.0
    from sloserve.sim.engine import SimConfig
    from sloserve.sim.placement import FixedPool
    from sloserve.sim.profiles import default_profiles, service_for
    from sloserve.sim.run import expected_requests, make_spec, run_experiment, write_outputs

    series = load_arrivals(a)
    if a.start_min or a.minutes:
        t0 = a.start_min * 60.0
        series = [s.sliced(t0, t0 + (a.minutes * 60.0 if a.minutes else s.duration_s)) for s in series]
    table = default_profiles()
    classes = a.model_class.split(",")
    devices = a.device.split(",")  # a comma list assigns devices round robin (typed GPUs)
    fallbacks = a.fallback_class.split(",") if a.fallback_class else []
    if fallbacks and len(fallbacks) != len(classes):
        raise SystemExit(
            f"sloserve sim: --fallback-class lists {len(fallbacks)} classes for {len(classes)} "
            f"--model-class entries; give one per model class, by position (empty: no fallback)"
        )
    specs = []
    for i, s in enumerate(series):
        dev = devices[i % len(devices)]
        k = i % len(classes)
        fb = fallbacks[k] if k < len(fallbacks) and fallbacks[k] else None
        try:
            svc = service_for(table, classes[k], dev, a.slo_ms, a.max_batch, fallback=fb)
        except KeyError as e:
            raise SystemExit(f"sloserve sim: {e.args[0]} (--model-class, --fallback-class, --device)") from None
        specs.append(make_spec(s.name or f"m{i}", s, svc, dev, peak_replicas=a.peak_replicas, scale=a.scale))
    cost = _type_map(a.type_cost, float)
    if a.split_types:
        specs = _split_specs(a, specs, table, classes, cost)
        a.mode = "fluid"
    cfg = SimConfig(
        startup_s=a.startup_s,
        tick_s=a.tick_s,
        gateways=a.gateways,
        batching=a.batching,
        seed=a.seed,
        autoscaler_kwargs={"swayam": {"startup_s": a.startup_s, "interval_s": a.tick_s, **json.loads(a.swayam)}},
    )
    policies = [p for p in a.autoscaler.split(",") if p]
    print(
        f"sloserve sim: {len(specs)} model(s), {expected_requests(specs):,.0f} expected requests, "
        f"{max(s.arrivals.duration_s for s in specs) / 3600:.2f} h, policies {policies}",
        file=sys.stderr,
    )
    if a.training_trace:
        return _harvest_main(a, specs, cfg, policies)
    t = time.perf_counter()
    runs = run_experiment(specs, policies, cfg, a.mode, lambda: FixedPool(a.gpus, a.device), not a.no_progress)
    meta = {
        "argv": sys.argv[1:],
        "title": f"{a.trace or a.synthetic} {a.column or ''}".strip(),
        "wall_s": round(time.perf_counter() - t, 3),
    }
    path = write_outputs(a.out, runs, specs, cfg, meta)
    for name, res in runs.items():
        s = res["summary"]
        print(
            f"{name:12s} mode={res['mode']:7s} attainment={s['slo_attainment']:.4f} "
            f"minutes_sla_met={s['minutes_sla_met_fraction']:.4f} replica_s={s['replica_seconds']:.0f} "
            f"goodput_rps={s['goodput_rps']:.2f} fallback_share={s['fallback_share']:.4f} wall={res['wall_s']:.1f}s"
        )
    if a.split_types:
        from sloserve.sim.typesize import type_report

        for name, res in runs.items():
            for lane, r in type_report(res["summary"], cost).items():
                print(
                    f"{name:12s} {lane:24s} replica_s={r['replica_seconds']:.0f} cost={r['cost']:.3f} "
                    f"requests={r['requests']:.0f} attainment={r['slo_attainment']:.4f}"
                )
    print(f"wrote {path}")
    return 0


def _type_map(text: str, conv):
    out = {}
    for item in filter(None, text.split(",")):
        name, _, v = item.partition("=")
        out[name.strip().lower()] = conv(v)
    return out


def _split_specs(a: argparse.Namespace, specs: list, table, classes: list[str], cost: dict[str, float]) -> list:
    """Each model as one lane per ``--split-types`` type (sloserve/sim/typesize.py), each with its type's
    service model, Gavel's throughput entry, ``--type-cost`` and ``--type-max``."""
    from sloserve.autoscaler.placement.cost import throughputs_from_profile
    from sloserve.autoscaler.typesplit import type_options
    from sloserve.sim.profiles import service_for
    from sloserve.sim.typesize import lanes

    types = [t.strip().lower() for t in a.split_types.split(",") if t.strip()]
    most = _type_map(a.type_max, int)
    out = []
    for i, spec in enumerate(specs):
        cls = classes[i % len(classes)]
        try:
            services = {t: service_for(table, cls, t, a.slo_ms, a.max_batch) for t in types}
        except KeyError as e:
            raise SystemExit(f"sloserve sim: {e.args[0]} (--split-types)") from None
        tput = throughputs_from_profile(table, [(cls, "default")], types, {cls: a.slo_ms / 1e3}, a.max_batch)
        per = {t: tput.get((cls, "default", t), 0.0) for t in types}
        out += lanes(spec, type_options(services, per, cost, {t: most.get(t, spec.max_replicas) for t in types}))
    return out


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}s"


def _tenant_shares(text: str) -> dict[str, float]:
    """``"a:0.5,*:0.25"`` -> {"a": 0.5, "*": 0.25}."""
    out = {}
    for part in (p for p in text.split(",") if p):
        name, _, share = part.rpartition(":")
        try:
            out[name] = float(share)
        except ValueError:
            raise SystemExit(f"sloserve sim: --tenant-shares wants TENANT:SHARE[,...], got {part!r}") from None
        if not name:
            raise SystemExit(f"sloserve sim: --tenant-shares wants TENANT:SHARE[,...], got {part!r}")
    return out


def _harvest_main(a: argparse.Namespace, specs: list, cfg, policies: list[str]) -> int:
    """``--training-trace``: every (autoscaler, placement) pair on typed GPUs shared with training."""
    from sloserve.autoscaler.placement.types import PlacementConfig
    from sloserve.sim.harvest import HarvestConfig
    from sloserve.sim.harvest_run import plot_harvest, run_harvest, summary_rows
    from sloserve.sim.run import write_outputs
    from sloserve.sim.training_trace import demand_gpu_hours, load_training_jobs

    horizon = max(s.arrivals.duration_s for s in specs)
    mix = {k: int(v) for k, v in (x.split(":") for x in a.gpu_mix.split(",") if x)}
    missing = {s.device_type for s in specs} - set(mix)
    if missing:
        raise SystemExit(f"sloserve sim: --gpu-mix has no GPUs of type(s) {sorted(missing)}")
    try:
        jobs = load_training_jobs(
            a.training_trace,
            start_s=a.training_start_s,
            window_s=a.training_window_s or horizon / a.training_time_scale,
            submit_col=a.training_submit_col,
            duration_col=a.training_duration_col,
            gpus_col=a.training_gpus_col,
            tenant_col=a.training_tenant_col or None,
            backlog=not a.no_training_backlog,
            time_scale=a.training_time_scale,
            max_gpus=max(mix.values()),
        )
    except ValueError as e:
        raise SystemExit(f"sloserve sim: --training-trace: {e}") from None
    lo, hi = (float(x) for x in a.iteration_time_s.split(","))
    hcfg = HarvestConfig(
        gpus=mix,
        iteration_time_s=(lo, hi),
        checkpoint_every_s=a.checkpoint_every_s,
        checkpoint_write_s=a.checkpoint_write_s,
        known_durations=not a.unknown_durations,
        seed=a.seed,
    )
    try:
        pcfg = PlacementConfig(
            pack_small_replicas=False,
            substitute_types=False,
            preempt_grace_s=a.grace_s,
            restart_overhead_s=a.restart_overhead_s,
            seed=a.seed,
            training_headroom_gpus=a.training_headroom_gpus,
            tenant_shares=_tenant_shares(a.tenant_shares),
        )
    except ValueError as e:
        raise SystemExit(f"sloserve sim: {e}") from None
    placements = [p for p in a.placement.split(",") if p]
    queues = [q for q in a.training_queue.split(",") if q]
    print(
        f"sloserve sim: harvest, {len(jobs)} training jobs ({demand_gpu_hours(jobs, horizon):,.0f} GPU-h of demand "
        f"within the run), GPUs {mix}, placements {placements}, training queues {queues}",
        file=sys.stderr,
    )
    t = time.perf_counter()
    mode = a.mode if a.mode != "auto" else "fluid"
    try:
        models = None
        if a.job_models or "predictive" in queues:
            from sloserve.sim.harvest_models import JobModelConfig

            models = JobModelConfig.model_validate_json(a.job_models or "{}")
        runs = run_harvest(
            specs, policies, placements, cfg, jobs, hcfg, pcfg, mode, not a.no_progress, queues=queues, models=models
        )
    except ValueError as e:
        raise SystemExit(f"sloserve sim: {e}") from None
    title = f"{a.trace or a.synthetic} + {a.training_trace}"
    meta = {
        "argv": sys.argv[1:],
        "title": title,
        "wall_s": round(time.perf_counter() - t, 3),
        "harvest": {**hcfg.model_dump(), **pcfg.model_dump()},
    }
    path = write_outputs(a.out, runs, specs, cfg, meta)
    plot_harvest(path.parent / "harvest.png", runs, title)
    if a.harvest_plot:
        plot_harvest(a.harvest_plot, runs, title)
    for r in summary_rows(runs):
        d = "" if r["delta_points"] is None else f" ({r['delta_points']:+.3f} pt)"
        print(
            f"{r['policy']:22s} slo={100 * r['slo_attainment']:.3f}%{d} train_h={r['training_gpu_hours']:.0f} "
            f"idle_h={r['idle_gpu_hours']:.0f} harvest={100 * r['harvest_fraction']:.1f}% "
            f"preempt={r['preemptions']} lost_h={r['lost_work_gpu_hours']:.2f} "
            f"lost/preempt mean={r['lost_per_preemption_intervals_mean']:.3f} "
            f"max={r['lost_per_preemption_intervals_max']:.3f} ckpt-intervals "
            f"finished={r['jobs_finished']} jct_mean={_s(r['jct_mean_s'])} jct_p95={_s(r['jct_p95_s'])} "
            f"jct_all_mean={_s(r['jct_all_mean_s'])} priority_preempt={r['priority_preemptions']} "
            f"wall={r['wall_s']:.1f}s"
        )
        if "fairness_max" in r:
            print(
                f"{'':22s} jct_all_p99={_s(r['jct_all_p99_s'])} makespan={_s(r['makespan_s'])} "
                f"last_finish={_s(r['last_finish_s'])} open={r['jobs_open_at_end']} "
                f"deadlines met {r['deadline_met_admitted']}/{r['deadline_admitted']} admitted, "
                f"{r['deadline_met_all']}/{r['deadline_jobs']} all; fairness_max={r['fairness_max']} "
                f"pred_err_median={r['prediction_error_median']} predictable={r['predictable_share']}"
            )
    print(f"wrote {path}")
    return 0


def pairs_main(a: argparse.Namespace) -> int:
    """``--device-types``: the pair choice against one-choice systems, in virtual time."""
    import tempfile
    from pathlib import Path

    from sloserve.autoscaler.typesplit import ordered_plan
    from sloserve.batching.profile import ProfileTable
    from sloserve.models.repository import ModelRepository
    from sloserve.replica.runtime import device_type
    from sloserve.sim.pairs import best_of, burst_arrivals, compare, size_by_throughput

    repo = Path(a.repo)
    if a.emulate:
        from sloserve.loadtests.emulated import emulated_type_repo

        tmp = Path(tempfile.mkdtemp(prefix="sloserve-pairs-"))
        for item in a.emulate.split(","):
            name, _, scale = item.partition("=")
            emulated_type_repo(repo, tmp / name, a.pair_model, name.lower(), float(scale or 1.0))
        tables = [ProfileTable.load(repo)] + [
            ProfileTable.load(tmp / i.partition("=")[0]) for i in a.emulate.split(",")
        ]
        table = ProfileTable({k: c for t in tables for k, c in t.curves.items()}, tables[0].accuracy)
    else:
        table = ProfileTable.load(repo)
    cfg = ModelRepository(repo).load().models[a.pair_model].config
    accuracy = {v.name: v.accuracy for v in cfg.variants}
    replicas: dict[str, int] = {}
    sized: list[str] = []
    for item in a.device_types.split(","):
        name, _, n = item.partition(":")
        dev = device_type("cpu") if name.lower() == "cpu" else name.lower()
        replicas[dev] = int(n) if n else 1
        if not n:
            sized.append(dev)
    slo_s = (a.slo_ms or cfg.slo_ms) / 1e3
    max_batch = min(a.max_batch, cfg.max_batch_size)
    cost = {device_type("cpu") if t == "cpu" else t: c for t, c in _type_map(a.type_cost, float).items()}
    if sized:  # sized for the peak with the throughput-per-type table (requests/s per unit cost)
        plan = ordered_plan(table, a.pair_model, accuracy, list(replicas), max_batch, slo_s, cost)
        want = size_by_throughput(table, a.pair_model, plan, a.rate * a.burst_factor, slo_s, max_batch, cost)
        replicas.update({d: want[d] for d in sized if d in want})
    arrivals = burst_arrivals(a.rate, a.burst_factor, a.duration_s, a.seed)
    t = time.perf_counter()
    res = compare(table, a.pair_model, accuracy, replicas, arrivals, slo_s, max_batch, a.seed, cost=cost)
    print(
        f"sloserve sim (pairs): {a.pair_model}, {len(arrivals)} requests, rate {a.rate:g}/s x{a.burst_factor:g} "
        f"burst, SLO {slo_s * 1e3:g} ms, replicas {replicas} ({time.perf_counter() - t:.1f} s)",
        file=sys.stderr,
    )
    for name, r in res.items():
        share = " ".join(f"{k}={n}" for k, n in r.rows.items() if n)
        print(f"{name:40s} attainment={r.attainment:.4f} effective_accuracy={r.effective_accuracy:.4f}  {share}")
    best_v, best_p = best_of(res, "variant:"), best_of(res, "pair:")
    if best_v is not None and best_p is not None:
        p = res["pairs"]
        print(
            f"pairs {p.effective_accuracy:.4f} vs best single variant {best_v.system} {best_v.effective_accuracy:.4f} "
            f"vs best single pair {best_p.system} {best_p.effective_accuracy:.4f} (effective accuracy)"
        )
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "argv": sys.argv[1:],
        "model": a.pair_model,
        "slo_ms": slo_s * 1e3,
        "replicas": replicas,
        "accuracy": accuracy,
        "systems": {
            n: {
                "attainment": r.attainment,
                "effective_accuracy": r.effective_accuracy,
                "rows": dict(r.rows),
                "timeline": r.timeline,
            }
            for n, r in res.items()
        },
    }
    (out / "pairs.json").write_text(json.dumps(doc, indent=1))
    print(f"wrote {out / 'pairs.json'}")
    if a.pairs_plot:
        from sloserve.loadtests.pairs_plot import draw

        draw(doc, a.pairs_plot, a.rate, a.burst_factor)
        print(f"wrote {a.pairs_plot}")
    return 0
