#!/usr/bin/env bash
# Interleaved A/B of sloserve's in-process pipelining and binary input, closed loop (wrk), heavy/large.
#   loadtests/bench/ab_closed.sh TAG ROUNDS POLICY CONCURRENCY CONFIG...
# CONFIG is d<depth>[b][p]: d2b = inprocess_pipeline_depth 2 with --binary; p = replica_processes
# (replicas in worker processes). BENCH_ARGS adds arguments (e.g. "--rows-per-request 8
# --max-batch-size 16"). Each round runs every
# config once, in reversed order every other round; JSON to results/TAG/<config>-r<round>.json.
# Table: python loadtests/bench/ab_table.py TAG [BASELINE_CONFIG].  SLOSERVE overrides the command
# (default .venv/bin/sloserve; e.g. SLOSERVE="python3 -m gateway.cli").
set -u
TAG=$1; R=$2; POL=$3; C=$4; shift 4; CFGS=("$@")
mkdir -p "results/$TAG"
n=${#CFGS[@]}
for r in $(seq 1 "$R"); do
  for j in $(seq 0 $((n - 1))); do
    if [ $((r % 2)) -eq 1 ]; then k=$j; else k=$((n - 1 - j)); fi
    cfg=${CFGS[$k]}; d=${cfg:1:1}; extra=""; procs=0
    [[ $cfg == *b* ]] && extra="--binary"; [[ $cfg == *p* ]] && procs=1
    SLOSERVE_INPROCESS_PIPELINE_DEPTH=$d SLOSERVE_REPLICA_PROCESSES=$procs ${SLOSERVE:-.venv/bin/sloserve} bench closed \
      --model heavy --variant large ${BENCH_ARGS:-} \
      --concurrency "$C" --duration 10 --rounds 1 --nice -10 --systems sloserve --sloserve-policy "$POL" $extra \
      --out "results/$TAG/$cfg-r$r.json" > "results/$TAG/$cfg-r$r.log" 2>&1
  done
done
