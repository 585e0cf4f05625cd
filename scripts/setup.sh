#!/usr/bin/env bash
# Creates .venv and installs the project with its test extras. Never pulls a CUDA build of torch:
# an importable torch >= 2.6 (e.g. a GPU build installed system-wide) is kept; otherwise the CPU
# wheel torch 2.13.0+cpu is installed before the project, so pip's resolver is satisfied by it:
# from pip's own sources when they hold it (a wheel folder, a mirror), else from PyTorch's CPU index
# (on Linux, PyPI's torch==2.13.0 is the multi-GB CUDA build); last, where neither has a +cpu wheel
# (macOS, Windows: their PyPI wheels are the CPU builds), torch==2.13.0 itself. The project is then
# installed with that torch pinned, so no requirement can have pip replace it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
fits() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' > /dev/null 2>&1; }
if ! fits .venv/bin/python; then  # none yet, or one whose Python is gone (an upgrade) or too old
  if ! fits "$PYTHON"; then
    echo "error: the project needs Python >= 3.11; $PYTHON is $("$PYTHON" --version 2>/dev/null || echo "not found"):" \
         "run with PYTHON=python3.11 (or newer)" >&2
    exit 1
  fi
  [ -e .venv ] && echo "re-creating .venv: its Python is missing or older than 3.11"
  "$PYTHON" -m venv --clear --system-site-packages .venv
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
pinned=$(mktemp)
trap 'rm -f "$pinned"' EXIT
.venv/bin/python -c "import torch; print('torch==' + torch.__version__)" > "$pinned"
# Triton for the fused loss's tests where torch brought none (a CPU build); a GPU build's own is kept
extras=dev
.venv/bin/python -c "import triton" > /dev/null 2>&1 || extras=dev,triton
.venv/bin/pip install --quiet --constraint "$pinned" -e ".[$extras]"
