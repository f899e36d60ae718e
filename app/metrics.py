"""Prometheus metrics and ``GET /metrics`` (docs/api.md), in the text format version 0.0.4.

Every label set is bounded: tools are catalog names (``unknown`` for a name the catalog does
not hold), routes are templates (``unmatched`` when no route matched), codes are problem codes.

Counts are per process. With several uvicorn workers each answers for itself, so a scrape
sees one worker at a time; set ``PROMETHEUS_MULTIPROC_DIR`` (an empty directory, read by
``prometheus_client`` itself before the workers start) to aggregate all workers instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from prometheus_client import (
    Counter,
    Histogram,
)

UNKNOWN_TOOL = "unknown"
UNMATCHED_ROUTE = "unmatched"
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

DECISIONS = Counter(
    "toolgate_decisions",
    "Authorization decisions, by tool, outcome (allow/deny) and denial code.",
    ("tool", "outcome", "code"),
)
EXECUTIONS = Counter(
    "toolgate_executions",
    "Execution outcomes, by tool and status (succeeded/failed/unknown/replayed).",
    ("tool", "status"),
)
CATALOG_RELOADS = Counter(
    "toolgate_catalog_reloads",
    "Catalog reloads (SIGHUP), by outcome: reloaded, or refused (the catalog in force kept).",
    ("outcome",),
)
REQUEST_SECONDS = Histogram(
    "toolgate_request_duration_seconds",
    "HTTP request latency, by route template, method and status.",
    ("route", "method", "status"),
    buckets=_BUCKETS,
)
REFUSALS = Counter(
    "toolgate_refusals",
    "Requests answered with a problem, by route template and problem code: malformed input "
    "and every other refusal, including those no decision records.",
    ("route", "code"),
)
PROVIDER_SECONDS = Histogram(
    "toolgate_provider_duration_seconds",
    "Provider request latency, by provider and endpoint (execute/dry_run/reconcile/owner).",
    ("provider", "endpoint"),
    buckets=_BUCKETS,
)


@lru_cache(maxsize=4096)
def decisions(tool: str, outcome: str, code: str) -> Counter:
    """The labelled child, cached: ``labels()`` takes a lock and validates on every call."""
    return DECISIONS.labels(tool, outcome, code)


@lru_cache(maxsize=4096)
def executions(tool: str, status: str) -> Counter:
    return EXECUTIONS.labels(tool, status)


@lru_cache(maxsize=4096)
def request_seconds(route: str, method: str, status: int) -> Histogram:
    return REQUEST_SECONDS.labels(route, method, str(status))


@lru_cache(maxsize=4096)
def refusals(route: str, code: str) -> Counter:
    return REFUSALS.labels(route, code)


def route_template(scope: Mapping[str, Any]) -> str:
    """The matched route's template: FastAPI's route, or the path of a plain Starlette route
    without path parameters (which is its own template); ``UNMATCHED_ROUTE`` when nothing
    matched, so the label stays bounded whatever paths are asked for."""
    route = scope.get("route")
    if route is not None:
        return getattr(route, "path", None) or UNMATCHED_ROUTE
    if "endpoint" in scope and not scope.get("path_params"):
        return str(scope["path"])
    return UNMATCHED_ROUTE


@lru_cache(maxsize=1024)
def provider_seconds(provider: str, endpoint: str) -> Histogram:
    return PROVIDER_SECONDS.labels(provider, endpoint)
