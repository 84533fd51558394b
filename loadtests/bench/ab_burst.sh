#!/usr/bin/env bash
# Interleaved A/B of two slo-policy settings under the 3x burst: heavy, 20 ms SLO, binary input, `slo@any`
# (SYSTEMS to change), one round per invocation, N pairs, the order of the arms alternating per pair.
# A_JSON / B_JSON: merged into the batching config (bench slo --sloserve-batching); gateway settings go through
# the environment (A_ENV / B_ENV, e.g. "SLOSERVE_INSTANCES=2"; space-separated, no spaces inside a value). RATE (600), N (8), TAG, OUT (results/ab-burst).
# Table: python loadtests/bench/ab_burst_table.py $OUT $TAG
set -u
RATE=${RATE:-600}; N=${N:-8}; TAG=${TAG:-ab}; OUT=${OUT:-results/ab-burst}
mkdir -p "$OUT"
for r in $(seq 1 "$N"); do
  if [ $((r % 2)) -eq 1 ]; then order="A B"; else order="B A"; fi
  for arm in $order; do
    if [ "$arm" = B ]; then J=${B_JSON:-"{}"}; E=${B_ENV:-}; else J=${A_JSON:-"{}"}; E=${A_ENV:-}; fi
    rm -f "$OUT/$TAG-$arm-$r.json"  # a failed run must not leave an older result for the table
    env $E ${SLOSERVE:-.venv/bin/sloserve} bench slo --model heavy --slo-ms 20 --binary --arrival burst \
      --burst-factor 3 --rates "$RATE" --duration 9 --rounds 1 --floor 0 --stop-after 9 --skip-below 0 --nice -10 \
      --sloserve-batching "$J" --systems "${SYSTEMS:-sloserve-slo@any}" \
      --out "$OUT/$TAG-$arm-$r.json" > "$OUT/$TAG-$arm-$r.log" 2>&1 || echo "$TAG $arm $r failed: $OUT/$TAG-$arm-$r.log"
  done
done
