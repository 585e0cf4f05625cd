#!/usr/bin/env bash
# Installs what the tests need (scripts/setup.sh) and runs the whole suite, slow end-to-end tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -z "${TRANSFORMER_DATA:-}" ] && [ -d ../shared/data ]; then
  export TRANSFORMER_DATA="$(cd ../shared/data && pwd)"
fi
exec .venv/bin/python -m pytest -q "$@"
