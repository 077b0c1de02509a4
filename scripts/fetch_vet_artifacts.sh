#!/usr/bin/env bash
# Test fixtures for `verl-ascend vet` (called by scripts/test.sh before pytest).
#
#   scripts/fetch_vet_artifacts.sh [PYTHON]
#
# Keeps release artifacts under $CACHE/vet-artifacts/, downloaded once with pip (--no-deps, nothing installed):
# - verl 0.9.0 and 0.9.1 wheels and the verl 0.9.1 sdist, as downloaded (1-2 MB each);
# - vLLM 0.23.0 and 0.33.0 and vLLM-Ascend 0.23.0 wheels repacked: a zip under the wheel's own file name
#   holding only the files vet reads for that distribution (verl_ascend_ext.tooling.vet.module_files) and the
#   wheel's .dist-info/METADATA and WHEEL, byte for byte; the full wheel (27-300 MB) is deleted.
# Tests read the cache and FAIL when something is missing; they never download.
set -euo pipefail
PY="${1:-${PY:-python3}}"
CACHE="${VERL_ASCEND_EXT_CACHE:-$HOME/.cache/verl-ascend-ext}"
DEST="$CACHE/vet-artifacts"
mkdir -p "$DEST"

have() { compgen -G "$DEST/$1" > /dev/null; }

tmp=""
trap '[ -n "$tmp" ] && rm -rf "$tmp"' EXIT

keep_whole() {  # keep_whole <requirement> <glob> [pip download options...]
  local req="$1" glob="$2"
  shift 2
  have "$glob" && return 0
  tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps "$@" "$req" -d "$tmp"
  # shellcheck disable=SC2086  # $glob is a file-name pattern: it must expand
  mv "$tmp"/$glob "$DEST/"
  rm -rf "$tmp"
}

keep_repacked() {  # keep_repacked <distribution> <version> <glob> [pip download options...]
  local dist="$1" version="$2" glob="$3"
  shift 3
  if have "$glob"; then  # kept before: enough while it holds every file the records now read
    # shellcheck disable=SC2086  # $glob is a file-name pattern: it must expand
    "$PY" - "$dist" "$DEST"/$glob <<'EOF' && return 0
import sys, zipfile
from verl_ascend_ext.tooling.vet import module_files

missing = set(module_files(sys.argv[1])) - set(zipfile.ZipFile(sys.argv[2]).namelist())
sys.exit(1 if missing else 0)
EOF
    # shellcheck disable=SC2086
    rm -f "$DEST"/$glob
  fi
  tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps --only-binary=:all: "$@" "$dist==$version" -d "$tmp"
  # shellcheck disable=SC2086  # $glob is a file-name pattern: it must expand
  "$PY" - "$dist" "$tmp"/$glob "$DEST" <<'EOF'
import os, sys, zipfile
from verl_ascend_ext.tooling.vet import module_files

dist, wheel, dest = sys.argv[1], sys.argv[2], sys.argv[3]
wanted = set(module_files(dist))
name = os.path.basename(wheel)
part = os.path.join(dest, name + ".partial")
with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as out:
    kept = [i for i in src.infolist() if i.filename in wanted
            or (i.filename.split("/")[0].endswith(".dist-info") and i.filename.endswith(("/METADATA", "/WHEEL")))]
    assert any(i.filename.endswith(".py") for i in kept), f"{name}: none of {sorted(wanted)} in the wheel"
    for info in kept:
        out.writestr(info, src.read(info))
os.replace(part, os.path.join(dest, name))
print(f"{name}: kept {len(kept)} files")
EOF
  rm -rf "$tmp"
}

keep_whole "verl==0.9.0" "verl-0.9.0-py3-none-any.whl" --only-binary=:all:
keep_whole "verl==0.9.1" "verl-0.9.1-py3-none-any.whl" --only-binary=:all:
keep_whole "verl==0.9.1" "verl-0.9.1.tar.gz" --no-binary=:all:
keep_repacked vllm 0.23.0 "vllm-0.23.0-*.whl"
keep_repacked vllm 0.33.0 "vllm-0.33.0-*.whl"
keep_repacked vllm-ascend 0.23.0 "vllm_ascend-0.23.0-*.whl" --python-version 3.11 --platform manylinux_2_34_x86_64
echo "vet artifacts under $DEST"
