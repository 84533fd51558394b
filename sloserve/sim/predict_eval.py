"""Rate predictors on the selected Azure columns (the table in docs/simulator.md).

    python -m sloserve.sim.predict_eval

For each predictor and column: the share of minutes whose rate the prediction (from a 6-minute
window, with a 10 % margin) fell under, then the median of predicted / actual.
"""

from __future__ import annotations

import numpy as np

from sloserve.autoscaler.predict import PREDICTORS
from sloserve.sim.arrivals import AZURE_FUNCTIONS_2019, from_counts

TRACE = str(AZURE_FUNCTIONS_2019)
COLUMNS = ["aggregate_1350fn", "diurnal_strong", "diurnal_onoff", "steady_mild_diurnal", "business_hours_bursty"]
WINDOW = 6
MARGIN = 1.1


def score(predict, rates) -> tuple[float, float]:
    """(share of minutes under-predicted, median predicted / actual) over minutes with traffic."""
    hist: list[tuple[float, float]] = []
    under = n = 0
    over: list[float] = []
    for i in range(len(rates) - 1):
        hist = [*hist, (i * 60.0, rates[i])][-WINDOW:]
        pred = predict(hist, 60.0) * MARGIN
        actual = rates[i + 1]
        if actual > 0:
            n += 1
            under += pred < actual
            over.append(pred / actual)
    return under / n, float(np.median(over))


def main() -> int:
    print("| predictor | " + " | ".join(COLUMNS) + " |")
    rates = {c: from_counts(TRACE, c, 60).rates for c in COLUMNS}
    for name, f in PREDICTORS.items():
        cells = []
        for c in COLUMNS:
            under, med = score(f, rates[c])
            cells.append(f"{under * 100:.1f}% / {med:.2f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
