"""Fluid vs request-level validation on a trace slice: python -m sim.validate COLUMN START_MIN END_MIN BATCHING[,..] PEAK_REPLICAS."""
import sys

from sim.arrivals import from_counts
from sim.engine import SimConfig
from sim.profiles import default_profiles, service_for
from sim.run import make_spec, run_experiment

svc = service_for(default_profiles(), 'gpt2-gen', 't4', slo_ms=1000)
arr = from_counts('../shared/traces/azure_functions_2019_selected_per_minute.csv', sys.argv[1], 60).sliced(float(sys.argv[2])*60, float(sys.argv[3])*60)
spec = make_spec('m', arr, svc, 't4', peak_replicas=int(sys.argv[5]))
for batching in sys.argv[4].split(','):
  for mode in ('request','fluid'):
    cfg = SimConfig(seed=1, batching=batching, autoscaler_kwargs={'swayam': {'startup_s': 10, 'interval_s': 10}})
    runs = run_experiment([spec], ['swayam','ray-default','kpa','oracle'], cfg, mode, show_progress=False)
    for k, r in runs.items():
        s = r['summary']; print(batching, mode, k, round(r['wall_s'],1), {a: round(s[a], 4) for a in ['requests','slo_attainment','minutes_sla_met_fraction','replica_seconds']}, flush=True)
