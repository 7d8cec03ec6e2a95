"""Timeouts as users give them (a timedelta or seconds) and as the native layer takes them."""

from __future__ import annotations

import datetime
import numbers
from typing import Optional, Union

from ._errors import FerrocommValueError

# What a `timeout=` argument takes: a timedelta, seconds, or None (the communicator's).
TimeoutLike = Union[datetime.timedelta, float, int, None]


def timeout_seconds(timeout: TimeoutLike) -> Optional[float]:
    """Seconds of `timeout` (None stays None), or FerrocommValueError for anything else."""
    if timeout is None:
        return None
    if isinstance(timeout, bool):
        raise FerrocommValueError(f"timeout must be a timedelta or seconds, not a bool ({timeout})")
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    if isinstance(timeout, numbers.Real):
        return float(timeout)
    raise FerrocommValueError(
        f"timeout must be a timedelta or seconds, not {type(timeout).__name__}")


def positive_seconds(where: str, timeout: TimeoutLike) -> Optional[float]:
    """As `timeout_seconds`, and a given timeout must be positive."""
    t = timeout_seconds(timeout)
    if t is not None and not t > 0:
        raise FerrocommValueError(f"{where}: timeout must be positive, got {timeout!r}")
    return t
