#!/usr/bin/env bash
# Install toolgate into .venv and start it with the demo catalog and demo providers on
# 127.0.0.1:8080 (providers on :9100), using the local PostgreSQL and Redis.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -e .

export TOOLGATE_CATALOG="${TOOLGATE_CATALOG:-catalog/}"
export TOOLGATE_DATABASE_URL="${TOOLGATE_DATABASE_URL:-postgresql://postgres@127.0.0.1:5432/toolgate_demo}"
export TOOLGATE_REDIS_URL="${TOOLGATE_REDIS_URL:-redis://127.0.0.1:6379/0}"
export TOOLGATE_JWT_SECRET="${TOOLGATE_JWT_SECRET:-demo-only-secret-change-me-0123456789abcdef}"
export DEMO_PROVIDERS_URL="${DEMO_PROVIDERS_URL:-http://127.0.0.1:9100}"

.venv/bin/python -m examples.create_database "$TOOLGATE_DATABASE_URL"
.venv/bin/toolgate migrate
.venv/bin/python -m examples.demo_providers --host 127.0.0.1 --port "${DEMO_PROVIDERS_URL##*:}" &
providers=$!
trap 'kill $providers 2>/dev/null' EXIT
.venv/bin/toolgate serve --host 127.0.0.1 --port "${TOOLGATE_PORT:-8080}"
