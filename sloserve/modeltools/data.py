"""The data every demo model learns from: scikit-learn's digits, split the same way for all of them."""

from __future__ import annotations

import numpy as np


def digits_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's digits (FP32, 0..16) as ``x_tr, x_te, y_tr, y_te``: a stratified 25% held out, by ``seed``."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x_tr, x_te, y_tr, y_te = train_test_split(
        data.data.astype(np.float32), data.target, test_size=0.25, random_state=seed, stratify=data.target
    )
    return x_tr, x_te, y_tr, y_te
