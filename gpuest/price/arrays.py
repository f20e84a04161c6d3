"""Array helpers the pricing modules share."""
from __future__ import annotations

from typing import Mapping

import numpy as np


def map_values(keys: np.ndarray, values: Mapping[str, float], default: float) -> np.ndarray:
    """values[key] for every element of an object array of strings, default where absent."""
    if len(keys) == 0:
        return np.zeros(0)
    uniq, inverse = np.unique(keys.astype(str), return_inverse=True)
    return np.array([values.get(k, default) for k in uniq], dtype=float)[inverse]
