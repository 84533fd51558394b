"""Plot a Locust SLO run (``--results-json``): load, latency against the SLO, attainment, batch size.

    sloserve loadtest --shape trace ... --results-json run.json
    python sloserve/loadtests/plot.py run.json docs/img/loadtest.png --title "..."

Renders headless (matplotlib Agg) four stacked panels over the seconds of the run: offered
(trace target) and achieved requests/s, client-side p50/p99 latency with the SLO line, SLO
attainment per second with the pass threshold, and the mean batch size the server reported in
the responses' ``batch_size`` parameter.
"""

from __future__ import annotations

import argparse
import json
import sys


def plot(results: dict, out: str, title: str = "", note: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = [s for s in results["timeline"] if s["requests"]]
    if len(tl) > 2:
        tl = tl[:-1]  # the last second holds only the stragglers of the stop
    t = [s["t_s"] for s in tl]
    fig, ax = plt.subplots(4, 1, figsize=(9, 9.5), sharex=True, gridspec_kw={"hspace": 0.12})
    bg, grid = "#fbfbfd", "#dde1e8"
    for a in ax:
        a.set_facecolor(bg)
        a.grid(True, color=grid, linewidth=0.7)
        for side in ("top", "right"):
            a.spines[side].set_visible(False)

    target = [s["target_rps"] for s in tl]
    if any(v is not None for v in target):
        ax[0].plot(t, target, color="#9aa5b8", linestyle="--", linewidth=1.5, label="offered (trace target)")
    ax[0].plot(t, [s["requests"] for s in tl], color="#1f5fbf", linewidth=2, label="answered")
    ax[0].set_ylabel("requests/s")
    ax[0].legend(loc="upper left", frameon=False, fontsize=9)

    slo = results["slo_ms"]
    ax[1].plot(t, [s["p50_ms"] for s in tl], color="#2e9e6a", linewidth=2, label="p50")
    ax[1].plot(t, [s["p99_ms"] for s in tl], color="#d9822b", linewidth=2, label="p99")
    ax[1].axhline(slo, color="#c0392b", linestyle=":", linewidth=1.5, label=f"SLO {slo:g} ms")
    ax[1].set_ylabel("latency (ms)\nclient side")
    ax[1].set_ylim(0, max(slo * 1.6, max((s["p99_ms"] or 0) for s in tl) * 1.1))
    ax[1].legend(loc="upper left", frameon=False, fontsize=9, ncol=3)

    att = [100 * s["attainment"] for s in tl]
    ax[2].fill_between(t, att, 0, color="#1f5fbf", alpha=0.15, step="mid")
    ax[2].plot(t, att, color="#1f5fbf", linewidth=2, drawstyle="steps-mid", label="within slo_ms")
    ax[2].axhline(
        100 * results["min_attainment"],
        color="#c0392b",
        linestyle=":",
        linewidth=1.5,
        label=f"gate {100 * results['min_attainment']:g}%",
    )
    ax[2].set_ylim(max(0, min(att + [100 * results["min_attainment"]]) - 5), 100.5)
    ax[2].set_ylabel("SLO attainment\n(% per second)")
    ax[2].legend(loc="lower left", frameon=False, fontsize=9, ncol=2)

    ax[3].bar(t, [s["mean_batch"] or 0 for s in tl], color="#7b5fbf", width=0.8)
    ax[3].set_ylabel("mean batch size\n(server reported)")
    ax[3].set_xlabel("seconds into the run")

    verdict = "PASS" if results["passed"] else "FAIL"
    head = title or "sloserve under load"
    fig.suptitle(
        f"{head}\n{results['requests']:,} requests, SLO attainment {100 * results['attainment']:.2f}%, "
        f"errors {100 * results['error_rate']:.2f}%: {verdict}",
        fontsize=11,
        y=0.965,
    )
    if note:
        import textwrap

        fig.text(0.06, 0.035, "\n".join(textwrap.wrap(note, 120)), fontsize=7.5, color="#666", va="top")
    fig.savefig(out, dpi=110, bbox_inches="tight", facecolor="white")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", help="JSON written by the locustfile's --results-json")
    p.add_argument("out", help="PNG to write")
    p.add_argument("--title", default="")
    p.add_argument("--note", default="", help="footnote (sources, machine)")
    a = p.parse_args(argv)
    with open(a.results) as f:
        plot(json.load(f), a.out, a.title, a.note)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
