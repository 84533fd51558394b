#!/usr/bin/env bash
# sloserve's own saturation and 3x-burst measurements on a quiet many-core machine: the lent GPU machine of
# the workplace's device tool (16 cores, no package registries; ONNX Runtime on its CPU, as on the 2-core box).
# Everything sloserve needs and the machine lacks travels as wheels in .whl/,
# wrk as .wrk/. Each part writes its JSON and log to OUT as soon as it ends, so a part cut short loses only itself.
#
#   bash sloserve/loadtests/bench/device_goals.sh OUT PARTS        PARTS: comma list of setup, sat, sat1, burst
#   BURST_ENV (default SLOSERVE_REPLICA_PROCESSES=1; empty: threads) BURST_RATES=300,450 BURST_ROUNDS=3 BURST_SYSTEMS=... SAT_ROUNDS=3 bash sloserve/loadtests/bench/device_goals.sh $OUT setup,sat,burst
set -uo pipefail
OUT=${1:?usage: device_goals.sh OUT PARTS}
PARTS=${2:-setup,sat,burst}
PY=${PY:-python3}
if [ -d .whl ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    $(ls .whl2/*.whl 2>/dev/null) || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export PATH=$PWD/.wrk:$PATH LD_LIBRARY_PATH=$PWD/.wrk${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1
SL="$PY -m sloserve.cli"
has() { [[ ",$PARTS," == *",$1,"* ]]; }
{ date -u; nproc; lscpu | grep -E 'Model name|^CPU\(s\)|Thread|MHz' ; free -g | head -2
  $PY -c "import onnxruntime as o, numpy, sys; print('onnxruntime', o.__version__, 'numpy', numpy.__version__, sys.version)"
  uptime; } 2>&1 | tee "$OUT/machine.txt"
if has setup || [ ! -f model_repository/.built ]; then
  t=$(date +%s)
  $SL models build --repo model_repository --profile-iters "${PROFILE_ITERS:-100}" > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  touch model_repository/.built
  echo "models build: $(( $(date +%s) - t )) s"; tail -3 "$OUT/build.log"
  ls model_repository/heavy/large/profiles/
fi
# saturation: worker processes, binary 8-row requests, max batch 16, the bound measured alone around each round
if has sat; then
  SLOSERVE_REPLICA_PROCESSES=1 $SL bench closed --model heavy --variant large --binary --rows-per-request 8 \
    --max-batch-size "${SAT_MAXB:-16}" --concurrency "${SAT_CONC:-16}" --duration 10 --rounds "${SAT_ROUNDS:-3}" --nice -10 --bound-each-round \
    --systems sloserve --sloserve-policy timeout --out "$OUT/sat-rows8-procs-b${SAT_MAXB:-16}.json" > "$OUT/sat-rows8-procs-b${SAT_MAXB:-16}.log" 2>&1
  tail -25 "$OUT/sat-rows8-procs-b${SAT_MAXB:-16}.log"
fi
# the same with single-row requests (where the gateway's one event loop is the limit)
if has sat1; then
  SLOSERVE_REPLICA_PROCESSES=1 $SL bench closed --model heavy --variant large --binary --rows-per-request 1 \
    --max-batch-size "${SAT_MAXB:-16}" --concurrency "${SAT1_CONC:-64}" --duration 10 --rounds "${SAT_ROUNDS:-2}" --nice -10 --bound-each-round \
    --systems sloserve --sloserve-policy timeout --out "$OUT/sat-rows1-procs-b${SAT_MAXB:-16}.json" > "$OUT/sat-rows1-procs-b${SAT_MAXB:-16}.log" 2>&1
  tail -12 "$OUT/sat-rows1-procs-b${SAT_MAXB:-16}.log"
fi
# the 3x burst: 8-row requests, so that large's compute (not the event loop) is what the peak exceeds
if has burst; then
  env ${BURST_ENV-SLOSERVE_REPLICA_PROCESSES=1} $SL bench slo --model heavy --slo-ms 20 --binary --rows-per-request "${BURST_ROWS:-8}" \
    --arrival burst --burst-factor 3 --rates "${BURST_RATES:-300,450}" --duration 9 --rounds "${BURST_ROUNDS:-3}" \
    --floor 0 --stop-after 9 --skip-below 0 --nice -10 \
    --systems "${BURST_SYSTEMS:-sloserve-slo@any,sloserve-slo@large,sloserve-slo@medium}" \
    --out "$OUT/burst${BURST_ROWS:-8}.json" > "$OUT/burst${BURST_ROWS:-8}.log" 2>&1
  grep -E '\] +[0-9]+/s' "$OUT/burst${BURST_ROWS:-8}.log" | cut -c1-230
  $PY sloserve/loadtests/bench/burst_log_table.py "$OUT/burst${BURST_ROWS:-8}.log"
fi
date -u
