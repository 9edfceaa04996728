"""Measured costs smoothed as they come: what the scheduler and speculation learn from each step."""

from __future__ import annotations


def moving_average(prev: float | None, value: float, decay: float = 0.8) -> float:
    """An exponential moving average that starts at its first value."""
    return value if prev is None else decay * prev + (1 - decay) * value
