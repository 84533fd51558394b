"""A model repository whose replicas stand in for a GPU-bound model on a small CPU box.

One variant of a built model, copied with ``max_batch_size`` set and a latency profile of a fixed
batch time; the gateway's ``fault_delay_ms`` setting makes each replica take that time a batch.
Adding a replica then adds capacity, as on a GPU, where on 2 cores a second real CPU replica adds
nothing. Used by the live autoscaling test.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from sloserve.replica.runtime import device_type


def slow_variant_repo(src: Path, dst: Path, model: str, variant: str, delay_ms: float, max_batch: int) -> Path:
    """``dst`` holding ``model`` with only ``variant``, batches of at most ``max_batch`` rows and a
    profile that says each batch takes about ``delay_ms`` (run the server with
    ``models.<model>.fault_delay_ms`` set to the same)."""
    shutil.copytree(src / model / variant, dst / model / variant, ignore=shutil.ignore_patterns("profiles"))
    cfg = json.loads((src / model / "config.json").read_text())
    cfg["variants"] = [v for v in cfg["variants"] if v["name"] == variant]
    cfg["max_batch_size"] = max_batch
    (dst / model / "config.json").write_text(json.dumps(cfg))
    sizes = [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= max_batch]
    prof = dst / model / variant / "profiles" / f"{device_type('cpu')}.json"
    prof.parent.mkdir(parents=True)
    prof.write_text(
        json.dumps(
            {
                "model": model,
                "variant": variant,
                "device_type": device_type("cpu"),
                "batch_sizes": sizes,
                "p50_ms": [delay_ms + 1 + i for i, _ in enumerate(sizes)],
                "p99_ms": [delay_ms + 4 + i for i, _ in enumerate(sizes)],
            }
        )
    )
    return dst


def emulated_type_repo(
    src: Path, dst: Path, model: str, device: str, scale: float, variants: list[str] | None = None
) -> Path:
    """``dst`` holding ``model`` as built (every variant, its files and profiles) plus a profile per
    variant for the emulated device type ``device``: this host's measured CPU profile with every
    latency multiplied by ``scale`` (>= 1), marked ``"emulated"`` with what it was derived from.

    Serve it with ``models.<model>.device_types: [cpu, <device>]``: the in-process backend then runs
    ``device``'s replicas as real CPU sessions that wait out the rest of this profile, so the type is a
    slower device that adds capacity, which is what this box can emulate honestly (a type faster than
    the CPU cannot be: its replica computes on the CPU first). ``variants``: keep only these."""
    if scale < 1:
        raise ValueError("an emulated type runs the real CPU session first: it cannot be faster (scale >= 1)")
    shutil.copytree(src / model, dst / model, symlinks=True)
    if variants is not None:  # only these (a smaller copy starts faster)
        cfg = json.loads((dst / model / "config.json").read_text())
        for v in cfg["variants"]:
            if v["name"] not in variants:
                shutil.rmtree(dst / model / v["name"])
        cfg["variants"] = [v for v in cfg["variants"] if v["name"] in variants]
        if cfg.get("default_variant") not in (None, *variants):
            cfg["default_variant"] = None
        (dst / model / "config.json").write_text(json.dumps(cfg, indent=2))
    add_emulated_profiles(dst, model, device, scale)
    return dst


def add_emulated_profiles(repo: Path, model: str, device: str, scale: float) -> None:
    """Beside each variant's profile for this host's CPU in ``repo``, one for ``device``: every
    latency times ``scale``, marked ``"emulated"`` (see :func:`emulated_type_repo`)."""
    if scale < 1:
        raise ValueError("an emulated type runs the real CPU session first: it cannot be faster (scale >= 1)")
    dst = repo
    host = device_type("cpu")
    for prof in sorted((dst / model).glob(f"*/profiles/{host}.json")):
        doc = json.loads(prof.read_text())
        doc.update(
            device_type=device,
            p50_ms=[x * scale for x in doc["p50_ms"]],
            p99_ms=[x * scale for x in doc["p99_ms"]],
            throughput_rps=[b / (x * scale / 1e3) for b, x in zip(doc["batch_sizes"], doc["p50_ms"], strict=True)],
            emulated={"derived_from": host, "latency_scale": scale},
        )
        (prof.parent / f"{device}.json").write_text(json.dumps(doc, indent=1) + "\n")
