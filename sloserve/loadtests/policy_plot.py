"""Render the SLO policy's decisions over time (docs/img/slo_policy_decisions.png).

Runs ``sloserve.batching.replay.replay`` -- the virtual-time twin of the live batcher -- on the heavy model's
measured profiles (this machine's ``model_repository/heavy/*/profiles``) under Poisson load with a
3x burst, for the ``slo`` policy and the ``timeout`` baseline, and plots what the slo policy did:
load, batch sizes by variant, each request's latency against its deadline, sheds.

    .venv/bin/python -m sloserve.loadtests.policy_plot --repo model_repository --out docs/img/slo_policy_decisions.png
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from sloserve.batching.policy import make_policy
from sloserve.batching.profile import ProfileTable
from sloserve.batching.replay import Request, replay
from sloserve.models.repository import ModelRepository
from sloserve.replica.runtime import device_type


def workload(rate: float, burst: float, seconds: float, slo_s: float, variants, seed: int):
    rng = np.random.default_rng(seed)
    t, out, i = 0.0, [], 0
    while t < seconds:
        r = rate * (burst if seconds / 3 <= t < 2 * seconds / 3 else 1.0)
        t += rng.exponential(1.0 / r)
        out.append(Request(i, t, slo_s, variants=tuple(variants)))
        i += 1
    return out


def _draw(a: argparse.Namespace, reqs, results, variants, acc, cap: float, best: str):
    """Four panels: load and on-time answers per variant, batch sizes, latencies against the deadline,
    and effective accuracy of both policies (``timeout`` serves every request on the best variant)."""
    import matplotlib.pyplot as plt

    r = results["slo"]
    colors = {v: c for v, c in zip(variants, ("#1f4e9c", "#e08a1e", "#c0392b"), strict=False)}
    fig, ax = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    arr = np.array([q.arrival_s for q in reqs])
    bins = np.arange(0, a.seconds + 0.1, 0.1)
    ax[0].plot(bins[:-1], np.histogram(arr, bins)[0] / 0.1, color="#888", label="offered")
    for v in variants:
        fin = [o.finish_s for o in r.outcomes if o.on_time and o.variant == v]
        if fin:
            ax[0].plot(bins[:-1], np.histogram(fin, bins)[0] / 0.1, color=colors[v], label=f"on time, {v}")
    ax[0].axhline(cap, color="k", ls=":", lw=1, label=f"{best} capacity")
    ax[0].set_ylabel("requests/s")
    ax[0].legend(fontsize=8, ncol=3)
    for v in variants:
        bs = [(b.start_s, b.rows) for b in r.batches if b.variant == v]
        if bs:
            ax[1].scatter(*zip(*bs, strict=False), s=6, color=colors[v], label=v)
    ax[1].set_ylabel("batch rows")
    ax[1].legend(fontsize=8, ncol=3)
    lat = [(o.arrival_s, (o.finish_s - o.arrival_s) * 1e3, colors[o.variant]) for o in r.outcomes if not o.shed]
    ax[2].scatter([x[0] for x in lat], [x[1] for x in lat], s=2, c=[x[2] for x in lat])
    shed = [o.arrival_s for o in r.outcomes if o.shed]
    ax[2].scatter(shed, [a.slo_ms * 1.05] * len(shed), marker="x", s=10, color="k", label=f"shed ({len(shed)})")
    ax[2].axhline(a.slo_ms, color="r", ls=":", lw=1, label="deadline")
    ax[2].set_ylabel("latency ms")
    ax[2].legend(fontsize=8)
    for n, x in results.items():
        acc_on = np.array([acc[o.variant] if o.on_time else 0.0 for o in x.outcomes])
        idx = np.digitize(arr, bins) - 1
        per = [acc_on[idx == k].mean() if (idx == k).any() else np.nan for k in range(len(bins) - 1)]
        ax[3].plot(
            bins[:-1],
            per,
            label=f"{n}: effective accuracy {x.effective_accuracy(acc):.3f}, attainment {x.attainment:.3f}",
        )
    ax[3].set_ylabel("effective accuracy\n(per 100 ms)")
    ax[3].set_xlabel("seconds")
    ax[3].legend(fontsize=8)
    return fig, ax


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", default="model_repository")
    ap.add_argument("--model", default="heavy")
    ap.add_argument("--slo-ms", type=float, default=20.0)
    ap.add_argument("--load", type=float, default=0.6, help="base load as a share of the best variant's capacity")
    ap.add_argument("--burst", type=float, default=3.0)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="docs/img/slo_policy_decisions.png")
    a = ap.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")

    repo = ModelRepository(a.repo).load()
    cfg = repo.models[a.model].config
    table = ProfileTable.load(a.repo)
    dev = device_type("cpu")
    variants = [v.name for v in cfg.variants_by_accuracy]
    acc = {v.name: v.accuracy for v in cfg.variants}
    B = cfg.max_batch_size
    rng = np.random.default_rng(a.seed + 1)

    def service(v, n):  # the "real" replica: profile p50 with lognormal noise (sigma 0.15)
        return table.latency_s(a.model, v, dev, n, "p50") * float(rng.lognormal(0.0, 0.15))

    best = variants[0]
    cap = max(b / table.latency_s(a.model, best, dev, b, "p99") for b in (1, 2, 4, 8, 16, 32, B))
    reqs = workload(a.load * cap, a.burst, a.seconds, a.slo_ms / 1e3, variants, a.seed)
    results = {}
    for name in ("slo", "timeout"):
        kw = dict(max_batch_size=B, default_variant=best)
        if name == "slo":
            kw.update(profile=table, model=a.model, device_type=dev, accuracy=acc, variants=variants)
        else:
            kw.update(max_wait_ms=2.0)
        pol = make_policy(name, **kw)
        results[name] = replay(
            pol, reqs, service, 1, model=a.model, max_batch_size=B, variants=variants, admission=(name == "slo")
        )
    summary = {
        n: {
            "attainment": round(x.attainment, 4),
            "shed_share": round(x.shed_share, 4),
            "effective_accuracy": round(x.effective_accuracy(acc), 4),
            "goodput_rps": round(x.goodput_rps(), 1),
        }
        for n, x in results.items()
    }
    print(json.dumps({"requests": len(reqs), "capacity_rps": round(cap, 1), **summary}, indent=1))

    fig, ax = _draw(a, reqs, results, variants, acc, cap, best)
    fig.suptitle(
        f"slo policy on {a.model} ({dev}), SLO {a.slo_ms:g} ms, base {a.load:.0%} of capacity, "
        f"{a.burst:g}x burst\n(offline replay of the live batcher's decisions on measured profiles)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
