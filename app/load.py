"""How many decision requests this process is serving right now (``DecisionRoute`` counts
them): audit exports and verifications rest between their steps only while there are any,
so they run at full speed on an idle worker and take a small share of a busy one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

_deciding = 0


@contextmanager
def deciding() -> Iterator[None]:
    """Counts one decision request while it is served."""
    global _deciding
    _deciding += 1
    try:
        yield
    finally:
        _deciding -= 1


def busy() -> bool:
    """Whether a decision request is being served in this process."""
    return _deciding > 0
