"""Nearest-rank percentiles, the one way every benchmark here summarises its samples."""

from __future__ import annotations

QUANTILES = {"p50": 0.50, "p90": 0.90, "p99": 0.99, "p999": 0.999}


def nearest_rank(samples: list[float], q: float) -> float:
    """The q-quantile (0 < q < 1) of `samples` by nearest rank. Raises `ValueError` when empty."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(samples: list[float], unit: str, digits: int = 3) -> dict[str, float]:
    """{"p50_<unit>": ..., "p90_<unit>": ..., "p99_<unit>": ..., "p999_<unit>": ...,
    "max_<unit>": ..., "n": ...}, each rounded to `digits` (p999 is the 99.9th percentile: with
    1,000 samples or fewer it is the max). Raises `ValueError` when `samples` is empty."""
    out: dict[str, float] = {
        f"{name}_{unit}": round(nearest_rank(samples, q), digits) for name, q in QUANTILES.items()
    }
    out[f"max_{unit}"] = round(max(samples), digits)
    out["n"] = len(samples)
    return out
