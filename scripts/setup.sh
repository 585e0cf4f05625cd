#!/usr/bin/env bash
# Creates .venv and installs the project with its test extras. Never pulls a CUDA build of torch:
# an importable torch >= 2.6 (e.g. a GPU build installed system-wide) is kept; otherwise the CPU
# wheel torch 2.13.0+cpu is installed before the project, so pip's resolver is satisfied by it:
# from pip's own sources when they hold it (a wheel folder, a mirror), else from PyTorch's CPU index
# (on Linux, PyPI's torch==2.13.0 is the multi-GB CUDA build); last, where neither has a +cpu wheel
# (macOS, Windows: their PyPI wheels are the CPU builds), torch==2.13.0 itself.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv --system-site-packages .venv
fi
if ! .venv/bin/python - <<'PY' 2>/dev/null
import sys
import torch
major, minor = (int(x) for x in torch.__version__.split(".")[:2])
sys.exit(0 if (major, minor) >= (2, 6) else 1)
PY
then
  cpu() { .venv/bin/pip install --quiet "torch==2.13.0+cpu" "$@" 2>/dev/null; }
  cpu || cpu --extra-index-url https://download.pytorch.org/whl/cpu || .venv/bin/pip install --quiet "torch==2.13.0"
fi
.venv/bin/pip install --quiet -e ".[dev]"
