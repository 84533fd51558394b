"""Rate predictors on the selected Azure columns (docs/simulator.md table): python -m sim.predict_eval."""
import numpy as np

from autoscaler.predict import PREDICTORS
from sim.arrivals import from_counts

T='../shared/traces/azure_functions_2019_selected_per_minute.csv'
cols=['aggregate_1350fn','diurnal_strong','diurnal_onoff','steady_mild_diurnal','business_hours_bursty']
print('| predictor | ' + ' | '.join(cols) + ' |')
for name, f in PREDICTORS.items():
    row=[]
    for c in cols:
        r = from_counts(T, c, 60).rates
        hist=[]; under=0; over=[]; n=0
        for i in range(len(r)-1):
            hist.append((i*60.0, r[i])); hist=hist[-6:]  # a 6-minute window
            p=f(hist, 60.0)*1.1
            a=r[i+1]
            if a>0:
                n+=1; under += p < a; over.append(p/a)
        row.append(f"{under/n*100:.1f}% / {np.median(over):.2f}")
    print(f'| {name} | ' + ' | '.join(row) + ' |')
