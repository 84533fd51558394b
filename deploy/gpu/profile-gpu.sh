#!/usr/bin/env bash
# Profile on a GPU host: sloserve's demo models (every variant, ONNX Runtime's CUDA provider and,
# for comparison, the host CPU) and the simulator's model classes (ResNet-50, EfficientNet-B0,
# BERT-base; needs torch, torchvision and transformers: pip install 'sloserve[gpu,measure]'). Usage:
#   deploy/gpu/profile-gpu.sh OUT_DIR ALIAS      e.g. deploy/gpu/profile-gpu.sh /tmp/prof h100
# Writes OUT_DIR/repo-profiles.tgz (the model repository's profiles/ files, to copy into
# sloserve/modeltools/measured/), OUT_DIR/ALIAS.json (for sloserve/sim/measured/), OUT_DIR/check.txt and, where PyTorch
# built the cnn model, OUT_DIR/cnn-ratio.txt (deploy/gpu/variant_ratio.py).
set -euo pipefail
OUT=${1:?usage: profile-gpu.sh OUT_DIR ALIAS}
ALIAS=${2:?usage: profile-gpu.sh OUT_DIR ALIAS}
REPO=${REPO:-/tmp/sloserve-gpu-repo}
PY=${PY:-python3}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
"$PY" -c "import onnxruntime as o, sys; print('onnxruntime', o.__version__, o.get_available_providers(), sys.version)"
"$PY" -m sloserve.cli models build --repo "$REPO" --profile-iters 0
# Correct first: the CUDA provider must compute what the CPU provider computes.
"$PY" - "$REPO" <<'PYEOF' | tee "$OUT/check.txt"
import sys, numpy as np, onnx
from sloserve.models.repository import ModelRepository
from sloserve.replica.runtime import Replica, RuntimeOptions
r = ModelRepository(sys.argv[1]).load()
rng = np.random.default_rng(1)
for name, m in sorted(r.models.items()):
    for v in m.config.variants:
        outs = [o.name for o in m.config.outputs]
        cpu = Replica(m.onnx_path(v.name), RuntimeOptions(device="cpu"), outs)
        gpu = Replica(m.onnx_path(v.name), RuntimeOptions(device="cuda"), outs)
        assert "CUDAExecutionProvider" in gpu.session.get_providers(), gpu.session.get_providers()
        t = m.config.inputs[0]
        x = {t.name: (rng.random((64, *t.shape)) * 16).astype(np.float32)}
        a, b = cpu.run(x), gpu.run(x)
        # a graph in FP16 (cnn's large-fp16) rounds differently on each side: compared at 1e-2, not 1e-3
        half = any(i.data_type == onnx.TensorProto.FLOAT16 for i in onnx.load(str(m.onnx_path(v.name))).graph.initializer)
        tol = 1e-2 if half else 1e-3
        for o in outs:
            if a[o].dtype.kind in "iu":  # labels: a row on a decision boundary may flip under TF32
                print(f"{name}/{v.name} {o}: cuda agrees with cpu on {np.mean(a[o] == b[o]):.1%} of rows")
                continue
            ref, got = a[o].astype(np.float64), b[o].astype(np.float64)
            rel = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))
            print(f"{name}/{v.name} {o}: rel err cuda vs cpu {rel:.2e}", "OK" if rel < tol else f"MISMATCH (> {tol:g})")
PYEOF
# The cnn model's variants differ in depth, so in kernels launched: its p50 per variant and the ratio
# of the most to the least accurate at batch 1 and 8 (shipped prebuilt: sloserve/modeltools/prebuilt/cnn).
if [ -d "$REPO/cnn" ]; then "$PY" deploy/gpu/variant_ratio.py "$REPO" --model cnn | tee "$OUT/cnn-ratio.txt"; fi
"$PY" -m sloserve.cli profile --repo "$REPO" --device cuda --iters 300 --warmup 30
"$PY" -m sloserve.cli profile --repo "$REPO" --device cpu --iters 100 --warmup 10
(cd "$REPO" && tar czf "$OUT/repo-profiles.tgz" */*/profiles)
"$PY" -m sloserve.sim.measure_profiles --device cuda --alias "$ALIAS" --out "$OUT" --workdir /tmp/sloserve-zoo
