#!/usr/bin/env bash
# Install toolgate with its test dependencies into .venv, lint and type-check it, and run
# the whole test suite against the local PostgreSQL and Redis (each run makes and drops its
# own database and Redis key prefix).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[dev]'
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy app
exec .venv/bin/python -m pytest "$@"
