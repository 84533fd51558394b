"""``sloserve bench perf``'s pure parts: the Triton and native repositories generated from one ONNX file
(each loaded by sloserve's own loader), perf_analyzer's CSV report read into numbers, the medians over
rounds, the ratios between systems and the tables. No server starts here."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from sloserve.gateway.transports.codec import decode_rest
from sloserve.loadtests.bench import perf
from sloserve.loadtests.bench.perf_report import (
    markdown,
    native_config,
    parse_csv,
    ratio_pairs,
    ratios,
    readiness_body,
    summarise,
    triton_config,
)
from sloserve.models.repository import ModelRepository

# perf_analyzer 2.45's ``-f`` report with ``--verbose-csv`` from a server that reports statistics
CSV_SERVER = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency,"
    "Avg latency,request/response,response wait\n"
    "4,2512.75,21,310,45,12,150,6,14,1480,1700,1810,2250,1590,35,1520\n"
)
# the same without server statistics, and a second block after a blank line (left out)
CSV_CLIENT = (
    "Concurrency,Inferences/Second,Client Send,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency\n"
    "1,800.5,30,10,1200,1300,1350,1500\n"
    "\n"
    "Concurrency,Avg GPU Utilization\n"
    "1,gpu0:0;\n"
)


def graph(path: Path, width: int = 4) -> Path:
    """``input`` FP32 [batch, width] -> Relu -> ``probs``, ArgMax -> ``label`` INT64 [batch]."""
    g = helper.make_graph(
        [
            helper.make_node("Relu", ["input"], ["probs"]),
            helper.make_node("ArgMax", ["probs"], ["label"], axis=1, keepdims=0),
        ],
        "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", width])],
        [
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", width]),
            helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"]),
        ],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def sloserve_model(root: Path) -> Path:
    """A sloserve model folder with two variants, ``small`` profiled; the ONNX file of ``small``."""
    d = root / "m"
    onnx_path = graph(d / "small" / "model.onnx")
    graph(d / "big" / "model.onnx")
    cfg = {
        "name": "m",
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [4]}],
        "outputs": [
            {"name": "probs", "datatype": "FP32", "shape": [4]},
            {"name": "label", "datatype": "INT64", "shape": []},
        ],
        "max_batch_size": 16,
        "slo_ms": 12.5,
        "variants": [
            {"name": "small", "accuracy": 0.8, "cost_flops": 8.0},
            {"name": "big", "accuracy": 0.9, "cost_flops": 16.0},
        ],
    }
    (d / "config.json").write_text(json.dumps(cfg))
    prof = {"model": "m", "variant": "small", "device_type": "cpu-x", "batch_sizes": [1, 2], "p50_ms": [0.1, 0.15]}
    (d / "small" / "profiles").mkdir()
    (d / "small" / "profiles" / "cpu-x.json").write_text(json.dumps(prof | {"p99_ms": [0.2, 0.3]}))
    return onnx_path


# ---- repositories -------------------------------------------------------------------------------------


def test_triton_config_is_read_by_sloserve_with_tensors_from_the_graph(tmp_path):
    graph(tmp_path / "m" / "1" / "model.onnx")
    (tmp_path / "m" / "config.pbtxt").write_text(triton_config("m", 8, 20.0))
    loaded = ModelRepository(tmp_path).load().models["m"]
    cfg = loaded.config
    assert cfg.max_batch_size == 8 and cfg.slo_ms == 20.0
    assert [(t.name, t.datatype, list(t.shape)) for t in cfg.inputs] == [("input", "FP32", [4])]
    assert [t.name for t in cfg.outputs] == ["probs", "label"]
    assert [v.name for v in cfg.variants] == ["1"]
    assert loaded.triton is not None and cfg.dynamic_batching is not None


def test_triton_config_text():
    text = triton_config("digits", 64)
    assert 'platform: "onnxruntime_onnx"' in text and "max_batch_size: 64" in text
    assert "dynamic_batching { }" in text and "input" not in text and "parameters" not in text
    assert 'string_value: "20"' in triton_config("digits", 64, 20.0)


def test_native_config_keeps_one_variant():
    src = {"name": "x", "max_batch_size": 8, "variants": [{"name": "a", "accuracy": 0.5}, {"name": "b"}]}
    cfg = native_config(src | {"dynamic_batching": {}}, "m", "a")
    assert cfg["name"] == "m" and cfg["variants"] == [{"name": "a", "accuracy": 0.5}]
    assert cfg["default_variant"] == "a" and "dynamic_batching" not in cfg
    assert native_config(src, "m", "zzz")["variants"] == [{"name": "zzz"}]


def test_prepare_repos_from_a_sloserve_model(tmp_path):
    onnx_path = sloserve_model(tmp_path / "src")
    repos = perf.prepare_repos(onnx_path, "digits", tmp_path / "out")
    assert repos.variant == "small" and repos.profiles == ("cpu-x.json",)
    native = ModelRepository(repos.native).load().models["digits"].config
    triton = ModelRepository(repos.triton).load().models["digits"].config
    assert [v.name for v in native.variants] == ["small"] and [v.name for v in triton.variants] == ["1"]
    assert native.max_batch_size == triton.max_batch_size == 16
    assert native.slo_ms == triton.slo_ms == 12.5
    assert native.inputs == triton.inputs
    for path, variant in ((repos.native / "digits" / "small", "small"), (repos.triton / "digits" / "1", "1")):
        assert (path / "model.onnx").read_bytes() == onnx_path.read_bytes()
        doc = json.loads((path / "profiles" / "cpu-x.json").read_text())
        assert (doc["model"], doc["variant"], doc["p50_ms"]) == ("digits", variant, [0.1, 0.15])


def test_prepare_repos_from_a_lone_onnx_file(tmp_path):
    repos = perf.prepare_repos(graph(tmp_path / "lone.onnx"), "m", tmp_path / "out", max_batch_size=4)
    assert repos.variant == "1" and repos.profiles == ()
    native = ModelRepository(repos.native).load().models["m"].config
    assert native.max_batch_size == 4 and [t.name for t in native.inputs] == ["input"]
    assert "max_batch_size: 4" in (repos.triton / "m" / "config.pbtxt").read_text()


def test_readiness_body_is_a_valid_request():
    body = readiness_body([{"name": "input", "datatype": "FP32", "shape": [4]}])
    _, x = decode_rest(body, None, "m", None).inputs["input"]
    assert x.shape == (1, 4) and not x.any()


# ---- perf_analyzer's CSV ---------------------------------------------------------------------------------


def test_parse_csv_with_server_statistics():
    (row,) = parse_csv(CSV_SERVER)
    assert row["concurrency"] == 4 and row["infer_per_s"] == 2512.75
    assert (row["p50_ms"], row["p90_ms"], row["p95_ms"], row["p99_ms"], row["avg_ms"]) == (1.48, 1.7, 1.81, 2.25, 1.59)
    assert row["server_queue_us"] == 45 and row["server_compute_us"] == 12 + 150 + 6
    assert row["network_server_us"] == 310 and row["response_wait_us"] == 1520


def test_parse_csv_without_server_statistics_stops_at_the_first_block():
    (row,) = parse_csv(CSV_CLIENT)
    assert row["infer_per_s"] == 800.5 and row["p99_ms"] == 1.5
    assert "server_queue_us" not in row and "server_compute_us" not in row
    assert parse_csv("") == []


# ---- medians, ratios, tables --------------------------------------------------------------------------


def rec(system: str, rnd: int, proto: str, c: int, rps: float, p99: float, **kw) -> dict:
    return {
        "system": system,
        "round": rnd,
        "protocol": proto,
        "concurrency": c,
        "infer_per_s": rps,
        "p50_ms": p99 / 2,
        "p99_ms": p99,
        **kw,
    }


RECORDS = [
    rec("sloserve-triton", 1, "http", 1, 1000, 2.0, gen_cores=0.2),
    rec("sloserve-triton", 2, "http", 1, 1200, 4.0, gen_cores=0.4),
    rec("sloserve-native", 1, "http", 1, 1000, 2.0),
    rec("sloserve-native", 2, "http", 1, 1000, 2.0),
    rec("triton", 1, "http", 1, 500, 4.0),
    {"system": "triton", "round": 2, "protocol": "http", "concurrency": 1, "error": "boom"},
    rec("triton-2x2", 1, "http", 1, 800, 3.0),
    rec("sloserve-triton", 1, "grpc", 2, 900, 1.0),
]
SYSTEMS = ["sloserve-triton", "sloserve-native", "triton", "triton-2x2"]


def test_summarise_takes_medians_over_the_rounds_that_worked():
    s = summarise(RECORDS)
    cell = s["http"]["1"]
    assert cell["sloserve-triton"]["infer_per_s"] == 1100 and cell["sloserve-triton"]["p99_ms"] == 3.0
    assert cell["sloserve-triton"]["gen_cores"] == pytest.approx(0.3)
    assert cell["triton"] == {"infer_per_s": 500, "p50_ms": 2.0, "p99_ms": 4.0, "rounds_ok": 1, "rounds_failed": 1}
    assert s["grpc"]["2"]["sloserve-triton"]["rounds_ok"] == 1


def test_ratios_against_triton_at_its_best_and_between_layouts():
    assert ratio_pairs(SYSTEMS) == [
        ("sloserve-triton", "triton"),
        ("sloserve-native", "triton"),
        ("sloserve-triton", "sloserve-native"),
    ]
    assert ratio_pairs(["sloserve-native"]) == []
    r = ratios(summarise(RECORDS), SYSTEMS)
    cell = r["http"]["1"]
    assert cell["triton_best"] == "triton-2x2"  # 800 infer/s against triton's 500
    assert cell["sloserve-triton/triton"] == {"infer_per_s": 1.375, "p50_ms": 1.0, "p99_ms": 1.0}
    assert cell["sloserve-native/triton"]["infer_per_s"] == 1.25
    assert cell["sloserve-triton/sloserve-native"] == {"infer_per_s": 1.1, "p50_ms": 1.5, "p99_ms": 1.5}
    assert r["grpc"]["2"] == {}  # no Triton, no native layout there


def test_markdown_tables():
    s = summarise(RECORDS)
    text = markdown(s, ratios(s, SYSTEMS), SYSTEMS)
    assert "| http | 1 | sloserve-triton | 1,100 | 1.50 / - / - / 3.00 |" in text
    assert "| http | 1 | triton | 500 |" in text and "| 1/2 |" in text
    assert "| http | 1 | triton-2x2 | 1.375, 1.000, 1.000 | 1.250, 0.667, 0.667 | 1.100, 1.500, 1.500 |" in text
    assert "| grpc | 2 | - | -, -, - | -, -, - | -, -, - |" in text


# ---- the command line -----------------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    perf.add_arguments(p)
    return perf.resolve(p.parse_args(list(argv)))


def test_quick_defaults_and_perf_analyzer_arguments(tmp_path):
    args = parse("--quick", "--concurrency", "1,2", "--perf-args=--async")
    assert (args.rounds, args.measurement_interval, args.max_trials, args._concurrency) == (1, 1000, 6, [1, 2])
    argv = perf.perf_argv("digits", "127.0.0.1:9", "grpc", 2, tmp_path / "r.csv", args)
    assert argv[:8] == ["-m", "digits", "-u", "127.0.0.1:9", "-i", "grpc", "--concurrency-range", "2:2"]
    assert "--verbose-csv" in argv and argv[argv.index("--measurement-interval") + 1] == "1000"
    assert argv[-1] == "--async"
    full = parse()
    assert (full.rounds, full._protocols, full._concurrency) == (2, ["http", "grpc"], [1, 2, 4, 8, 16])
    assert "--measurement-interval" not in perf.perf_argv("d", "u", "http", 1, tmp_path / "r.csv", full)


@pytest.mark.parametrize(
    "argv", [("--systems", "triton,mlserver"), ("--protocols", "udp"), ("--concurrency", "0"), ("--concurrency", "a")]
)
def test_bad_options_are_refused(argv):
    with pytest.raises(SystemExit):
        parse(*argv)


def test_triton_configurations_by_name():
    perf.check_systems(["triton", "triton-0x1", "triton-2.5x2", "sloserve-native"])
    with pytest.raises(SystemExit):
        perf.check_systems(["triton-2"])
