#!/usr/bin/env bash
# Test fixtures for the GLM-5.2 vLLM-core patches (called by scripts/test.sh before pytest).
#
#   scripts/fetch_vllm.sh [PYTHON]
#
# 1. Installs vLLM 0.23.0 (the release the patches target) into PYTHON's environment with --no-deps,
#    plus only the small packages `import vllm.v1.engine.core` needs on CPU torch. vLLM's own
#    dependency set (CUDA torch, >1 GB) is never installed.
# 2. Downloads each later vLLM release once, keeps only the files the recognisers read under
#    $CACHE/vllm-src/<version>/ and deletes the wheel (~270 MB each, ~2 s each to download).
# Tests read the cache and FAIL when something is missing; they never download.
set -euo pipefail
PY="${1:-${PY:-python3}}"
CACHE="${VERL_ASCEND_EXT_CACHE:-$HOME/.cache/verl-ascend-ext}"
SRC="$CACHE/vllm-src"
PINNED="0.23.0"
# Every vLLM release on the index from 0.24.0 to the newest at the time of writing. Add new releases
# here (and to tests/vllm_fixtures.py): the recogniser test must cover each of them.
LATER="0.24.0 0.25.0 0.25.1 0.26.0 0.27.0 0.27.1 0.28.0 0.29.0 0.30.0 0.31.0 0.32.0 0.33.0"
KEEP=(vllm/v1/engine/core.py vllm/v1/worker/gpu_worker.py vllm/v1/worker/cpu_worker.py)
# What `import vllm.v1.engine.core` (and vllm.plugins, vllm.v1.engine.utils) needs beyond verl's stack.
IMPORT_DEPS=(msgspec pybase64 gguf pyzmq cachetools cbor2 openai-harmony openai uvloop py-cpuinfo llguidance
             xgrammar prometheus-client pillow aiohttp psutil cloudpickle
             einops partial-json-parser)  # the last two: verl 0.9.1's verl.utils.vllm (coexistence tests)

mkdir -p "$SRC"

download() {  # download <version> <dir>: the wheel of vllm==<version> into <dir>
  "$PY" -m pip download -q --no-deps --only-binary=:all: "vllm==$1" -d "$2"
}

keep_sources() {  # keep_sources <version> <wheel>: extract the recognised files into the cache
  local dest="$SRC/$1" part="$SRC/$1.partial"
  rm -rf "$part"
  mkdir -p "$part"
  unzip -q -o "$2" "${KEEP[@]}" -d "$part"
  rm -rf "$dest"
  mv "$part" "$dest"
}

have_sources() {
  local f
  for f in "${KEEP[@]}"; do [ -f "$SRC/$1/$f" ] || return 1; done
}

tmp=""
trap '[ -n "$tmp" ] && rm -rf "$tmp"' EXIT  # a failed download must not leave a 270 MB wheel behind

installed_pin=$("$PY" -c "import importlib.metadata as m; print(m.version('vllm'))" 2>/dev/null || true)
if [ "$installed_pin" != "$PINNED" ] || ! have_sources "$PINNED"; then
  tmp=$(mktemp -d)
  download "$PINNED" "$tmp"
  wheel=$(ls "$tmp"/vllm-*.whl)
  keep_sources "$PINNED" "$wheel"
  if [ "$installed_pin" != "$PINNED" ]; then
    "$PY" -m pip install -q --no-deps "$wheel"
  fi
  rm -rf "$tmp"
fi
"$PY" -m pip install -q "${IMPORT_DEPS[@]}"

for version in $LATER; do
  have_sources "$version" && continue
  tmp=$(mktemp -d)
  download "$version" "$tmp"
  keep_sources "$version" "$(ls "$tmp"/vllm-*.whl)"
  rm -rf "$tmp"
done
echo "vLLM $PINNED installed for $PY; sources of $PINNED $LATER under $SRC"
