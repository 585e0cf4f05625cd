#!/usr/bin/env bash
# Installs what the tests need (scripts/setup.sh; Debian's chromium + chromedriver for the browser test of the
# web page) and runs the whole suite, slow end-to-end tests included.
set -euo pipefail
# a relative TRANSFORMER_DATA names a folder from where the command was run, not from the checkout
if [ -d "${TRANSFORMER_DATA:-}" ]; then export TRANSFORMER_DATA="$(cd "$TRANSFORMER_DATA" && pwd)"; fi
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -z "${TRANSFORMER_DATA:-}" ] && [ -d ../shared/data ]; then
  export TRANSFORMER_DATA="$(cd ../shared/data && pwd)"
fi
# Most end-to-end tests run on real Multi30k and PTB data; without them they could only skip, and a run
# that skips them proves little, so it does not start (tests/skips.py fails any run with such skips).
if [ ! -f "${TRANSFORMER_DATA:-}/multi30k/train.en.gz" ] || [ ! -d "${TRANSFORMER_DATA:-}/ptb-sample" ]; then
  echo "error: the tests need the Multi30k and PTB sample data: set TRANSFORMER_DATA to a folder holding" \
       "multi30k/ and ptb-sample/ (CI: ../shared/data beside the checkout)" >&2
  exit 1
fi
if ! { command -v chromium && command -v chromedriver; } > /dev/null; then
  sudo=""; [ "$(id -u)" -ne 0 ] && command -v sudo > /dev/null && sudo="sudo -n"
  install="$sudo apt-get install -y -q --no-install-recommends chromium chromium-driver"
  echo "installing chromium and chromedriver for the browser test (Debian packages)"
  if ! { $install > /tmp/transformer-apt.log 2>&1 || { $sudo apt-get update -q > /dev/null 2>&1 && $install > /tmp/transformer-apt.log 2>&1; }; }; then
    echo "WARNING: could not install chromium (see /tmp/transformer-apt.log): the browser test is SKIPPED" >&2
    export TRANSFORMER_SKIP_BROWSER=1
  fi
fi
# One pytest worker per core (pytest-xdist), each test file kept on one worker so that its module fixtures are
# made once; most tests run one single-threaded process at a time, so one worker would leave the other cores
# idle. Give -n 0 to run in this process alone (e.g. for pdb).
exec .venv/bin/python -m pytest -q -n "$(nproc)" --dist loadfile "$@"
