"""Pure helpers of `sloserve bench slo` (sloserve/loadtests/bench/slo*.py, arrivals.py, scrape.py): step length and server-side counts."""

from __future__ import annotations

import argparse

import pytest

from sloserve.loadtests.bench.arrivals import schedule, step_duration
from sloserve.loadtests.bench.scrape import server_on_time, slo_counts


def _args(**kw):
    base = {"duration": 3.0, "min_requests": 200, "arrival": "poisson", "cv": 2.0, "burst_factor": 3.0}
    base.update(kw)
    return argparse.Namespace(**base)


def test_low_rates_are_stretched_to_carry_enough_requests():
    a = _args()
    assert step_duration(a, 10) == 20.0  # 27 requests could not judge 99%; 200 can
    assert step_duration(a, 100) == 3.0  # 300 requests in the given 3 s already
    assert step_duration(_args(min_requests=0), 10) == 3.0
    n = len(schedule(a, 10, seed=1))
    assert 150 < n < 250
    assert max(schedule(a, 10, seed=1)) <= 20.0


def test_server_on_time_from_two_scrapes():
    def scrape(met, late):
        return (
            f"# TYPE sloserve_slo_requests_total counter\n"
            f'sloserve_slo_requests_total{{model="heavy",met="true"}} {met}\n'
            f'sloserve_slo_requests_total{{model="heavy",met="false"}} {late}\n'
            f'sloserve_slo_requests_total{{model="digits",met="true"}} 5.0\n'
            f'sloserve_slo_requests_created{{model="heavy",met="true"}} 1.7e9\n'
        )

    before, after = slo_counts(scrape(10.0, 1.0)), slo_counts(scrape(108.0, 3.0))
    assert before == {"true": 15.0, "false": 1.0}
    assert server_on_time(before, after) == {"server_answered": 100, "server_on_time": 0.98}
    assert server_on_time(after, after) == {"server_answered": 0, "server_on_time": None}
    assert slo_counts(None) == {"true": 0.0, "false": 0.0}


def test_bad_arguments_stop_before_anything_starts():

    from sloserve.loadtests.bench.slo import add_arguments, main_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    with pytest.raises(SystemExit, match=r"unknown system\(s\) \['nope'\]"):
        main_args(p.parse_args(["--systems", "sloserve@any,nope"]))
    with pytest.raises(SystemExit, match="--min-requests must be >= 0"):
        main_args(p.parse_args(["--min-requests", "-5"]))
    with pytest.raises(SystemExit, match="--rows-per-request 64 must be 1 to --max-batch-size"):
        main_args(p.parse_args(["--rows-per-request", "64"]))
    with pytest.raises(SystemExit, match="--rows-per-request 0 must be 1"):
        main_args(p.parse_args(["--rows-per-request", "0"]))


def test_step_metrics_count_late_answers_per_variant():
    from sloserve.loadtests.bench.slo_report import metrics

    a = _args(slo_ms=20.0, _variants=["small", "medium", "large"])
    recs = [
        (0.0, 0.0, 0.010, 200, 2),
        (0.0, 0.0, 0.030, 200, 2),
        (0.0, 0.0, 0.025, 200, 1),
        (0.0, 0.0, 0.005, 200, 1),
        (0.0, 0.0, 0.001, 503, -1),
    ]
    trailer = {"server_cpu_s": 0.1, "gen_cpu_s": 0.1, "other_cpu_s": 0.0}
    m = metrics(recs, trailer, a, {0: 0.83, 1: 0.93, 2: 0.98}, None, rate=200)
    assert m["variants"] == {"large": 2, "medium": 2}
    assert m["late_by_variant"] == {"large": 1, "medium": 1}
    assert m["attainment"] == 0.4 and m["shed"] == 1
    assert m["effective_accuracy"] == round((0.98 + 0.93) / 5, 5)


def test_light_load_rates_use_the_light_steps_own_duration():
    from sloserve.loadtests.bench.slo_report import metrics

    a = _args(slo_ms=20.0, _variants=["large"])
    recs = [(i / 100, i / 100, i / 100 + 0.004, 200, 0) for i in range(3000)]  # 100/s for 30 s
    trailer = {"server_cpu_s": 6.0, "gen_cpu_s": 3.0, "other_cpu_s": 0.0}
    m = metrics(recs, trailer, a, {0: 0.98}, None, rate=100, duration_s=30.0)
    assert m["offered_rps"] == 100.0 and m["server_cores"] == 0.2 and m["gen_cores"] == 0.1


def test_sloserve_batching_settings_are_merged_and_checked(monkeypatch):
    import pytest

    from sloserve.loadtests.bench import slo
    from sloserve.loadtests.bench.slo import add_arguments, main_args
    from sloserve.loadtests.bench.slo_systems import policy_batching

    def must_not_run(_args):
        raise AssertionError("refused arguments reached the run")

    monkeypatch.setattr(slo, "run", must_not_run)

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--sloserve-batching", '{"safety_ms": 2, "max_batch_size": 16}'])
    assert policy_batching("slo", args) == {"policy": "slo", "max_batch_size": 16, "safety_ms": 2}
    assert policy_batching("timeout", p.parse_args([]))["max_wait_ms"] == 2.0
    with pytest.raises(SystemExit, match="--sloserve-batching: not JSON"):
        main_args(p.parse_args(["--sloserve-batching", "{safety_ms: 2}"]))
    with pytest.raises(SystemExit, match="JSON object"):
        main_args(p.parse_args(["--sloserve-batching", "[1]"]))
    with pytest.raises(SystemExit, match="name the policy in --systems"):
        main_args(p.parse_args(["--sloserve-batching", '{"policy": "timeout"}']))
    # a setting one of the listed policies does not take is refused before anything starts
    with pytest.raises(SystemExit, match="sloserve-timeout: .*safety_ms"):
        main_args(
            p.parse_args(["--systems", "sloserve-slo@any,sloserve-timeout", "--sloserve-batching", '{"safety_ms": 2}'])
        )
    with pytest.raises(SystemExit, match="sloserve-slo: .*safty_ms"):
        main_args(p.parse_args(["--systems", "sloserve-slo", "--sloserve-batching", '{"safty_ms": 2}']))


def test_batch_stats_per_variant_from_two_scrapes():
    """``bench slo`` records, per step, each variant's batches, mean rows and share of <= 2-row batches."""
    from prometheus_client import generate_latest

    from sloserve.gateway.metrics import Metrics
    from sloserve.loadtests.bench.scrape import batch_stats

    m = Metrics()
    hook, _ = m.batcher_hook("heavy")
    hook("batch", ("large", 4, 0.001, "full"))
    before = generate_latest(m.registry).decode()
    for rows in (1, 1, 2, 16, 32):
        hook("batch", ("large", rows, 0.001, "deadline"))
    hook("batch", ("medium", 8, 0.001, "full"))
    after = generate_latest(m.registry).decode()
    assert batch_stats(before, after) == {
        "large": {"batches": 5, "mean_rows": 10.4, "share_le_2_rows": 0.6},
        "medium": {"batches": 1, "mean_rows": 8.0, "share_le_2_rows": 0.0},
    }
    assert batch_stats(after, after) == {}


def test_timeline_bins_requests_by_scheduled_send_time():
    from sloserve.loadtests.bench.slo_report import timeline

    recs = [
        (0.1, 0.1, 0.105, 200, 0),
        (0.2, 0.2, 0.3, 200, 1),
        (0.7, 0.7, 0.71, 503, -1),
        (1.4, 1.4, -1.0, 0, -1),
        (1.45, 1.45, 1.46, 200, 1),
    ]
    t = timeline(recs, slo=0.02, dur=1.5, names=["large", "medium"])
    assert t == {
        "bin_s": 0.5,
        "sent": [2, 1, 2],
        "on_time": [1, 0, 1],
        "late": [1, 0, 0],
        "shed": [0, 1, 0],
        "variants": {"large": [1, 0, 0], "medium": [1, 0, 1]},
    }


def test_the_bench_module_examples_hold():
    """The doctests of the open-loop bench (generator headers, sheds by reason from two scrapes, ...)."""
    import doctest

    from sloserve.loadtests import promtext, results
    from sloserve.loadtests.bench import scrape, slo, slo_report, slo_systems

    runs = [doctest.testmod(m) for m in (slo, scrape, slo_report, slo_systems, promtext, results)]
    assert sum(r.failed for r in runs) == 0 and sum(r.attempted for r in runs) >= 3


def test_a_result_is_written_where_asked_and_nowhere_else(tmp_path, capsys):
    import json

    from sloserve.loadtests.results import spread, write_result

    write_result({"a": 1}, None)
    out = tmp_path / "deeper" / "r.json"
    write_result({"a": 1}, str(out))
    assert json.loads(out.read_text()) == {"a": 1} and out.read_text().endswith("\n")
    assert capsys.readouterr().err == f"wrote {out}\n"
    assert spread([4.0, 1.0, 2.0, 3.0]) == {"p50": 2.5, "p99": 4.0, "max": 4.0}


def test_a_system_runs_from_another_tree(tmp_path):
    """``--tree before=PATH`` and ``sloserve-default:before``: that checkout's code, this interpreter."""
    import sys

    from sloserve.loadtests.bench.systems import Launch, from_tree, parse_trees, split_tree

    (tmp_path / "sloserve" / "cli").mkdir(parents=True)
    trees = parse_trees([f"before={tmp_path}"])
    assert split_tree("sloserve-default:before", trees) == ("sloserve-default", tmp_path.resolve())
    assert split_tree("triton-1x1", trees) == ("triton-1x1", None)
    with pytest.raises(SystemExit, match="no --tree after"):
        split_tree("sloserve:after", trees)
    with pytest.raises(SystemExit, match="only sloserve"):
        split_tree("triton:before", trees)
    with pytest.raises(SystemExit, match="LABEL=PATH"):
        parse_trees([f"x={tmp_path / 'nope'}"])
    launch = from_tree(
        Launch("sloserve-default", ["/venv/bin/sloserve", "serve", "--repo", "r"], "u", None), trees["before"]
    )
    assert launch.argv[:3] == [sys.executable, "-m", "sloserve.cli"] and launch.argv[3:] == ["serve", "--repo", "r"]
    assert launch.cwd == tmp_path.resolve() and launch.env["PYTHONPATH"] == str(tmp_path.resolve())


def test_a_types_system_serves_every_device_type_and_may_pin_a_pair(tmp_path, model_repo):
    import json

    from sloserve.loadtests.bench.slo import add_arguments
    from sloserve.loadtests.bench.slo_systems import launch_for

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--device-types", "cpu,emul-slow"])
    args._trees = {}
    launch, hdrs, pin = launch_for("sloserve-slo-types@large+emul-slow", args, model_repo, tmp_path)
    assert (hdrs["x-variant"], hdrs["x-device-type"], pin) == ("large", "emul-slow", "large")
    cfg = json.loads((tmp_path / "sloserve-slo-types_large+emul-slow.json").read_text())
    assert cfg["models"]["heavy"]["device_types"] == ["cpu", "emul-slow"]
    _, hdrs, pin = launch_for("sloserve-slo-types@any", args, model_repo, tmp_path)
    assert "x-variant" not in hdrs and "x-device-type" not in hdrs and pin == "any"


def test_ray_serve_peer_modes_name_their_flags_and_niceness(tmp_path, model_repo):
    """``-ha``: HAProxy in front, Ray's default worker niceness; ``-ha0``: the same with Ray's workers at
    niceness 0, as sloserve's embedded Ray starts its replicas; anything else is refused up front."""
    from sloserve.loadtests.bench.slo import add_arguments
    from sloserve.loadtests.bench.slo_systems import PEER_CONFIG, launch_for

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args([])
    args._trees = {}
    ha, _, _ = launch_for("rayserve-5x2-ha", args, model_repo, tmp_path)
    ha0, _, _ = launch_for("rayserve-5x2-ha0", args, model_repo, tmp_path)
    for launch in (ha, ha0):
        assert "--haproxy" in launch.argv and launch.argv[launch.argv.index("--replicas") + 1] == "2"
    assert "RAY_worker_niceness" not in ha.env and ha0.env["RAY_worker_niceness"] == "0"
    assert PEER_CONFIG.fullmatch("rayserve-1x1-ha0") and not PEER_CONFIG.fullmatch("rayserve-1x1-ha1")
