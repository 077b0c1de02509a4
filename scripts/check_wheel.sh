#!/usr/bin/env bash
# The package as users get it: build the wheel, install it (not editable, --no-deps) into a fresh venv
# that sees the test venv's dependencies, and check it from there.
#
#   scripts/check_wheel.sh [PYTHON]     (PYTHON: the test venv's interpreter, default .venv/bin/python)
#
# The fresh venv gets no copy of verl/torch: a .pth file appends the test venv's site-packages to its
# sys.path. Only the wheel's files are in the fresh venv itself, and they come first on sys.path; the
# test venv's editable install is not active there (its finder .pth is not processed in an appended
# directory), and the checks assert that the wheel's distribution is the one found. Checked: the files
# (py.typed, every shipped recipe's run.sh, manifest.toml, README.md, the shell files they source), each
# run.sh listing its overrides from the wheel, every entry point of every group declared in
# pyproject.toml (present in the wheel's metadata and loadable), the console script, verl's own plugin
# discovery booting the plugin, `verl-ascend doctor` exiting 0, and `verl-ascend selftest --device cpu` holding on
# two records with the wheel's own NPU test double (vLLM-Ascend 0.23.0 sources from scripts/fetch_vllm_ascend.sh,
# which scripts/test.sh runs first; missing -> the check fails).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${1:-$ROOT/.venv/bin/python}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/verl-ascend-wheel.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# Built from a copy of the checkout's files (tracked or not ignored), as from a fresh clone: a stale
# *.egg-info left by the editable install would otherwise add files the package data does not declare.
mkdir "$WORK/src"
git -C "$ROOT" ls-files -z --cached --others --exclude-standard \
  | (cd "$ROOT" && tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -xf - -C "$WORK/src"
"$PY" -m pip wheel -q --no-deps -w "$WORK/dist" "$WORK/src"
WHEEL="$(ls "$WORK"/dist/verl_ascend_ext-*.whl)"

BASE="$("$PY" -c 'import sys; print(sys._base_executable)')"
"$BASE" -m venv --without-pip "$WORK/venv"
FRESH="$WORK/venv/bin/python"
FRESH_SITE="$("$FRESH" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$FRESH_SITE/test-venv-deps.pth"
"$PY" -m pip --python "$FRESH" install -q --no-deps --no-index "$WHEEL"

cd "$WORK"  # not the checkout: the source tree must not be importable
VLLM_ASCEND_SRC="${VERL_ASCEND_EXT_CACHE:-$HOME/.cache/verl-ascend-ext}/vllm-ascend-src/0.23.0"
"$FRESH" - "$ROOT" "$WORK/venv" "$VLLM_ASCEND_SRC" <<'PY'
import importlib.metadata as md
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

root, venv = Path(sys.argv[1]), Path(sys.argv[2]).resolve()
problems = []

def inside_venv(path) -> bool:
    return Path(path).resolve().is_relative_to(venv)

import verl_ascend_ext
if not inside_venv(verl_ascend_ext.__file__):
    problems.append(f"verl_ascend_ext imported from {verl_ascend_ext.__file__}, not from the wheel in {venv}")
dist = md.distribution("verl-ascend-ext")
if not inside_venv(dist.locate_file("")) or not any(inside_venv(p.locate()) for p in dist.files or []):
    problems.append(f"the verl-ascend-ext distribution found is not the wheel's ({dist._path})")

package = Path(verl_ascend_ext.__file__).parent
recipes = root / "verl_ascend_ext/tooling/recipes"
shipped = ["py.typed"] + [f"tooling/recipes/{d.name}/{f}" for d in sorted(recipes.iterdir())
                          if d.is_dir() and not d.name.startswith("__") for f in ("run.sh", "manifest.toml", "README.md")]
shipped += [f"tooling/recipes/{f.name}" for f in sorted(recipes.glob("_*.sh"))]  # sourced by the run scripts
problems += [f"{name} is not in the wheel" for name in shipped if not (package / name).is_file()]
for script in sorted(package.glob("tooling/recipes/*/run.sh")):  # finds the files it sources in the wheel
    emitted = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                             env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/"),
                                  "PYTHON": sys.executable, "VERL_ASCEND_RECIPE_EMIT": "overrides"})
    if emitted.returncode != 0 or emitted.stdout.count("\0") < 2:
        problems.append(f"{script.relative_to(package)} from the wheel did not list its overrides "
                        f"(exit {emitted.returncode}): {emitted.stderr[-1000:]}")

project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
declared = {("console_scripts", n): v for n, v in project.get("scripts", {}).items()}
declared.update({(g, n): v for g, eps in project.get("entry-points", {}).items() for n, v in eps.items()})
found = {(ep.group, ep.name): ep for ep in dist.entry_points}
for key, value in sorted(declared.items()):
    ep = found.get(key)
    if ep is None or ep.value != value:
        problems.append(f"entry point {key[0]}:{key[1]} = {value} is not in the wheel's metadata")
        continue
    try:
        ep.load()
    except BaseException as err:  # SystemExit too: verl_plugin stops the process on a failed boot
        problems.append(f"entry point {key[0]}:{key[1]} = {value} does not load: {type(err).__name__}: {err}")
problems += [f"entry point {g}:{n} is in the wheel but not declared" for g, n in sorted(set(found) - set(declared))]

booted = subprocess.run([sys.executable, "-c", "import json, verl, verl_ascend_ext, verl_ascend_ext.runtime.boot as b; "
                         "print(json.dumps([b.loaded_by(), verl_ascend_ext.__file__]))"], capture_output=True, text=True)
if booted.returncode != 0:
    problems.append(f"import verl in the fresh venv failed: {booted.stderr[-2000:]}")
else:
    loaded_by, where = json.loads(booted.stdout.splitlines()[-1])
    if "verl" not in loaded_by or not inside_venv(where):
        problems.append(f"verl's plugin discovery did not boot the wheel's plugin (loaded by {loaded_by}, from {where})")

doctor = subprocess.run([str(venv / "bin" / "verl-ascend"), "doctor", "--json"], capture_output=True, text=True)
if doctor.returncode != 0:
    problems.append(f"verl-ascend doctor (the wheel's console script) exited {doctor.returncode}: "
                    f"{doctor.stdout[-2000:]}{doctor.stderr[-2000:]}")
else:
    report = json.loads(doctor.stdout)
    if not report.get("patches"):
        problems.append("verl-ascend doctor from the wheel lists no patches")

selftest = subprocess.run([str(venv / "bin" / "verl-ascend"), "selftest", "--device", "cpu", "--json", "--no-store",
                           "--only", "glm52-ascend-indexer-scale-a5,glm52-ascend-sfa-keep-kv-b-proj",
                           "--vllm-ascend-source", sys.argv[3]], capture_output=True, text=True)
if selftest.returncode != 0:
    problems.append(f"verl-ascend selftest --device cpu from the wheel exited {selftest.returncode}: "
                    f"{selftest.stdout[-2000:]}{selftest.stderr[-2000:]}")
else:
    import verl_ascend_ext.tooling.selftest.npu_test_double as double
    if not inside_venv(double.__file__):
        problems.append(f"the selftest's NPU test double is not the wheel's ({double.__file__})")

if problems:
    print("wheel check FAILED:\n  " + "\n  ".join(problems), file=sys.stderr)
    sys.exit(1)
print(f"wheel check OK: {len(shipped)} shipped files, {len(declared)} entry points loaded, verl booted the "
      f"plugin, doctor exit 0, selftest on the double exit 0 ({dist.metadata['Name']} {dist.version}, license {dist.metadata.get('License-Expression')})")
PY
