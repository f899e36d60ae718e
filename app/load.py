"""How many decision requests this process is serving right now (``DecisionRoute`` and the
MCP front door count them): audit exports and verifications rest between their steps only
while there are any, so they run at full speed on an idle worker and take a small share of a
busy one."""

from __future__ import annotations


class _Deciding:
    """``with deciding:`` counts one decision request while it is served (a plain context
    manager: it runs on every decision)."""

    def __init__(self) -> None:
        self.count = 0

    def __enter__(self) -> None:
        self.count += 1

    def __exit__(self, *exc: object) -> None:
        self.count -= 1


deciding = _Deciding()


def busy() -> bool:
    """Whether a decision request is being served in this process."""
    return deciding.count > 0
