#!/usr/bin/env bash
# Test fixtures for the GLM-5.2 vLLM-Ascend patches (called by scripts/test.sh before pytest).
#
#   scripts/fetch_vllm_ascend.sh [PYTHON]
#
# Downloads the vLLM-Ascend 0.23.0 wheel once (--no-deps; ~27 MB, under a second), keeps only the
# files the recognisers and tests read, in their package tree, under
# $CACHE/vllm-ascend-src/0.23.0/ together with the wheel's own METADATA (so that, with that folder
# on PYTHONPATH, importlib.metadata reports vllm-ascend 0.23.0), and deletes the wheel.
# entry_points.txt is deliberately not kept: nothing may load vLLM-Ascend's plugins from the cache.
# vLLM-Ascend is never installed (it needs torch_npu and CANN). Tests FAIL when the cache is missing.
set -euo pipefail
PY="${1:-${PY:-python3}}"
CACHE="${VERL_ASCEND_EXT_CACHE:-$HOME/.cache/verl-ascend-ext}"
VERSION="0.23.0"
DEST="$CACHE/vllm-ascend-src/$VERSION"
# Keep in sync with tests/glm52_ascend_fixtures.py (KEPT_FILES).
KEEP=(
  vllm_ascend/__init__.py
  vllm_ascend/utils.py
  vllm_ascend/ops/__init__.py
  vllm_ascend/ops/layernorm.py
  vllm_ascend/attention/__init__.py
  vllm_ascend/attention/sfa_v1.py
  vllm_ascend/attention/context_parallel/__init__.py
  vllm_ascend/attention/context_parallel/sfa_cp.py
  vllm_ascend/device/__init__.py
  vllm_ascend/device/device_op.py
  vllm_ascend/device_allocator/__init__.py
  vllm_ascend/device_allocator/camem.py
  vllm_ascend/patch/__init__.py
  vllm_ascend/patch/worker/__init__.py
  vllm_ascend/patch/worker/patch_routed_experts_capture.py
  vllm_ascend/ascend_config.py
  vllm_ascend/worker/__init__.py
  vllm_ascend/worker/worker.py
  "vllm_ascend-$VERSION.dist-info/METADATA"
)

have_sources() {
  local f
  for f in "${KEEP[@]}"; do [ -f "$DEST/$f" ] || return 1; done
}

if have_sources; then
  echo "vLLM-Ascend $VERSION sources already under $DEST"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --platform manylinux_2_34_x86_64 \
  "vllm-ascend==$VERSION" -d "$tmp"
wheel=$(ls "$tmp"/vllm_ascend-"$VERSION"-*.whl)
part="$DEST.partial"
rm -rf "$part"
mkdir -p "$part"
unzip -q -o "$wheel" "${KEEP[@]}" -d "$part"
rm -rf "$DEST"
mv "$part" "$DEST"
echo "vLLM-Ascend $VERSION sources under $DEST (wheel deleted)"
