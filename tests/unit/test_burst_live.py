"""The pure parts of sloserve/loadtests/burst_live.py: the calm-then-clumps trace and the per-minute table."""

from sloserve.loadtests.burst_live import calm_then_clumps, per_minute


def test_calm_minutes_at_the_slices_mean_then_the_slice_itself(tmp_path):
    src = tmp_path / "trace.csv"
    # minute 1 of the source: 6 requests in its first second, none in the others (mean 0.1/s -> 1)
    src.write_text("t_s\n" + "".join(f"{t}\n" for t in [5.0, 60.0, 60.1, 60.2, 60.3, 60.4, 60.5, 130.0]))
    dst = tmp_path / "out.csv"
    calm, busiest = calm_then_clumps(src, 1, 1, 2, dst)
    assert (calm, busiest) == (1, 6)
    stamps = [float(x) for x in dst.read_text().split()[1:]]
    assert len(stamps) == 120 + 6 and stamps[:3] == [0.0, 1.0, 2.0]  # one a second for 2 minutes
    assert stamps[120:] == [120.0, 120.1, 120.2, 120.3, 120.4, 120.5]  # then the slice, shifted


def test_per_minute_attainment_and_replicas():
    timeline = [{"t_s": s, "requests": 10, "attainment": 1.0 if s < 60 else 0.9} for s in range(120)]
    samples = [(float(s), 2 if s < 60 else 3) for s in range(120)]
    rows = per_minute(timeline, samples)
    assert [r["sla_met"] for r in rows] == [True, False]
    assert rows[1]["attainment"] == 0.9 and rows[1]["replicas_mean"] == 3 and rows[0]["requests"] == 600
