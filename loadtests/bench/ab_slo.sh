#!/usr/bin/env bash
# Interleaved open-loop A/B of inprocess_pipeline_depth 1 vs 2: heavy/large, 20 ms SLO, the slo and
# timeout policies pinned to large, 2 rounds (order reversed in round 2). RATES, TAG and SLOSERVE
# (the command; default .venv/bin/sloserve) from the environment.
# Table: python loadtests/bench/ab_slo_table.py results/TAG
set -u
TAG=${TAG:-sloab}
mkdir -p "results/$TAG"
for r in 1 2; do
  if [ "$r" -eq 1 ]; then order="1 2"; else order="2 1"; fi
  for d in $order; do
    SLOSERVE_INPROCESS_PIPELINE_DEPTH=$d ${SLOSERVE:-.venv/bin/sloserve} bench slo --model heavy --variant large --slo-ms 20 \
      --systems sloserve-slo@large,sloserve-timeout@large --rates "${RATES:-1000,1500,2000,2500,3000,3500}" --duration 4 \
      --rounds 1 --stop-after 2 --floor 0 --nice -10 --out "results/$TAG/d$d-r$r.json" > "results/$TAG/d$d-r$r.log" 2>&1
  done
done
