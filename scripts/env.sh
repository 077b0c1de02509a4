# shellcheck shell=bash
# Shared by setup.sh and test.sh: create (or reuse) the project's virtual environment.
# Sourced, not run. Sets VENV and PY. CPU torch 2.13.0 comes from the local wheel pip knows about.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VERL_ASCEND_EXT_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
VERL_BASE_VERSION="0.9.0"

ensure_venv() {
  if [ ! -x "$PY" ]; then
    python3 -m venv "$VENV"
    "$PY" -m pip install -q --upgrade pip
  fi
  if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
    "$PY" -m pip install -q "torch==2.13.0"
  fi
  # verl pins the rest of the stack (ray, transformers, hydra, tensordict); CPU torch stays.
  "$PY" -m pip install -q "verl==$VERL_BASE_VERSION" -e "${ROOT}[test]"
}

use_verl() {  # swap the pure-Python verl release in place: its dependencies are the same for 0.9.x
  "$PY" -m pip install -q --no-deps "verl==$1"
}
