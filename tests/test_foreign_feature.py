"""A fix in the user's own package, no fork: a separately installed distribution declares a record and its gate.

Real: a package built in a temporary directory and installed with pip (real .dist-info, real entry point in the
``verl_ascend_ext.features`` group) into the site-packages of a scratch environment whose interpreter also sees
this venv (verl 0.9.0, this package); doctor and status; verl's own plugin discovery (``import verl``) in a
multiprocessing spawn child; the package's own tests (its behaviour test and the contract, with
``verl_ascend_ext.testing``) run by pytest in that environment. A bad foreign record is an error naming the
distribution that declared it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
from subprocesses import last_json, run_command, run_python

DIST = "myfix-verl"
PATCH = "myfix-union-two-dict-check"
GATE = "MYFIX_UNION_CHECK"

DECLARATION = '''
"""myfix: verl's union_two_dict checks conflicts with `assert`, which `python -O` removes; raise ValueError."""
from verl_ascend_ext.patching import Fingerprint, Gate, PatchRecord
from verl_ascend_ext.runtime.hookspecs import hookimpl

GATE = Gate("MYFIX_UNION_CHECK", default=False, doc="union_two_dict raises ValueError on a conflict, also under -O")
RECORD = PatchRecord(
    id="myfix-union-two-dict-check", feature="myfix", why="conflicting meta-info keys pass silently under python -O",
    target="verl.utils.py_functional:union_two_dict", gate=GATE, distribution="verl", versions=">=0.9.0,<0.10",
    original=Fingerprint(contains=(r"^\\s+assert dict2\\[key\\] == dict1\\[key\\]", r"^\\s+dict1\\[key\\] = val$"),
                         description="conflicts checked with assert, then merged"),
    fixed=Fingerprint.never_matching("no verl release raises here"),
    wrapper="myfix.patch_code:union_checked", upstream="none", remove_when="verl raises on conflicts", traced=False)


@hookimpl
def verl_ascend_ext_gates():
    return [GATE]


@hookimpl
def verl_ascend_ext_patch_records():
    return [RECORD]
'''

PATCH_CODE = '''
def union_checked(original, dict1, dict2):
    for key, val in dict2.items():
        if key in dict1 and dict1[key] != val:
            raise ValueError(f"{key} in meta_dict1 and meta_dict2 are not the same object")
    return original(dict1, dict2)
'''

# The package's own tests, as its author writes them with the kit (the behaviour test: the first 18 lines).
PACKAGE_TESTS = '''
from verl_ascend_ext.testing import last_json, run_python

from myfix.declaration import GATE

CALL = """
import json, verl
from verl.utils.py_functional import union_two_dict
try:
    union_two_dict({"a": 1}, {"a": 2})
except Exception as err:
    print(json.dumps(type(err).__name__))
"""


def test_conflict_raises_value_error_with_the_gate_on():
    assert last_json(run_python(CALL, {GATE.env: "1"}).stdout) == "ValueError"


def test_gate_off_keeps_verls_assert():
    assert last_json(run_python(CALL, {GATE.env: "0"}).stdout) == "AssertionError"


def test_contract(tmp_path):
    from verl_ascend_ext.patching.cachedir import cache_dir
    from verl_ascend_ext.testing import check_contract, from_artifact
    from myfix.declaration import RECORD
    wheels = sorted((cache_dir() / "vet-artifacts").glob("verl-*.whl"))
    releases = [from_artifact(w, tmp_path / w.name, importable=True) for w in wheels]
    report = check_contract([RECORD], releases, tmp_path / "work")
    print(report.summary())
    assert report.ok and report.score[0] == report.score[1] == 2, report.summary()
'''

BAD = '''
import os
from verl_ascend_ext.patching import Fingerprint, Gate, PatchRecord
from verl_ascend_ext.runtime.hookspecs import hookimpl

GATE = Gate("MYFIX_BAD_GATE", default=False, doc="bad")
CASE = os.environ.get("MYFIX_BAD_CASE", "id")
FP = Fingerprint(contains=("x",), description="x")
RECORD = PatchRecord(id="distill-fsdp2-topk" if CASE == "id" else "myfix-bad",
                     feature="bad", why="w", target="verl.trainer.distillation.losses:compute_topk_loss"
                     if CASE == "target" else "verl.utils.py_functional:append_to_dict",
                     gate=Gate("NOBODY_DECLARES_THIS", False, "-") if CASE == "gate" else GATE,
                     distribution="verl", versions=">=0.9", original=FP, fixed=FP, wrapper="m:f", upstream="u",
                     remove_when="r", traced=False)


@hookimpl
def verl_ascend_ext_gates():
    return [GATE]


@hookimpl
def verl_ascend_ext_patch_records():
    return [RECORD]
'''


def build(root: Path, name: str, module: str, files: dict[str, str]) -> Path:
    src = root / f"{name}-src"
    (src / module).mkdir(parents=True)
    for rel, text in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    (src / "pyproject.toml").write_text(textwrap.dedent(f"""
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "{name}"
        version = "0.1.0"
        [project.entry-points."verl_ascend_ext.features"]
        {module} = "{module}.declaration"
        [tool.setuptools]
        packages = ["{module}"]
    """), encoding="utf-8")
    return src


def scratch_env(root: Path) -> Path:
    """A venv whose site-packages is its own (what pip installs into) and that also sees this venv's packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = Path(subprocess.run([str(root / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path("
                                "'purelib'))"], capture_output=True, text=True, check=True).stdout.strip())
    (site / "zz_main_venv.pth").write_text(f"import site; site.addsitedir({sysconfig.get_path('purelib')!r})\n")
    return site


def install(src: Path, site: Path) -> None:
    run_command([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                 str(site), str(src)], timeout=300)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("foreign")
    site = scratch_env(root / "venv")
    src = build(root, DIST, "myfix", {"myfix/__init__.py": "", "myfix/declaration.py": DECLARATION,
                                      "myfix/patch_code.py": PATCH_CODE, "tests/test_myfix.py": PACKAGE_TESTS})
    install(src, site)
    return root


def python(root: Path) -> str:
    return str(root / "venv" / "bin" / "python")


def test_doctor_and_status_list_the_record_with_its_distribution(scratch: Path, tmp_path: Path) -> None:
    doctor = run_command([python(scratch), "-m", "verl_ascend_ext.tooling.cli", "doctor", "--json"], {GATE: "1"},
                         check=False, timeout=120)
    report = json.loads(doctor.stdout)
    row = next(p for p in report["patches"] if p["id"] == PATCH)
    assert (row["status"], row["declared_by"]) == ("will-apply", DIST), row
    assert next(g for g in report["gates"] if g["env"] == GATE)["declared_by"] == DIST
    assert report["plugin"]["feature_distributions"]["myfix"] == DIST
    text = run_command([python(scratch), "-m", "verl_ascend_ext.tooling.cli", "doctor"], {GATE: "1"}, check=False)
    assert any(PATCH in line and DIST in line for line in text.stdout.splitlines())
    status_dir = tmp_path / "status"
    run_python("import verl, verl.utils.py_functional", {GATE: "1", "VERL_ASCEND_EXT_STATUS_DIR": str(status_dir)},
               python=python(scratch))
    status = json.loads(run_command([python(scratch), "-m", "verl_ascend_ext.tooling.cli", "status", "--json", "--dir",
                                     str(status_dir)], check=False).stdout)
    assert [proc["patches"][PATCH] for proc in status["processes"]] == ["applied"], status  # the process ended
    assert status["declared_by"][PATCH] == DIST, status


def test_the_kits_scrubbed_environment_drops_the_packages_gate(scratch: Path) -> None:
    """A test of the package starts from ``scrubbed_env``: its gate, set in the developer's shell, is not inherited."""
    code = "import json, os; from verl_ascend_ext.testing import scrubbed_env; print(json.dumps(" \
           f"[os.environ.get({GATE!r}), {GATE!r} in scrubbed_env()]))"
    assert last_json(run_python(code, {GATE: "1"}, python=python(scratch)).stdout) == ["1", False]


SPAWN = """
import json, multiprocessing

def child(queue):
    import verl  # verl's own plugin discovery boots verl-ascend-ext, which loads every feature package
    from verl.utils.py_functional import union_two_dict
    from verl_ascend_ext import patch_statuses
    try:
        union_two_dict({"a": 1}, {"a": 2})
        raised = None
    except Exception as err:
        raised = type(err).__name__
    queue.put({"status": patch_statuses()["myfix-union-two-dict-check"].status.value, "raised": raised})

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue,))
    proc.start()
    print(json.dumps(queue.get(timeout=240)))
    proc.join()
"""


def test_verls_start_up_applies_it_in_a_spawned_process(scratch: Path, tmp_path: Path) -> None:
    script = tmp_path / "spawn_main.py"
    script.write_text(SPAWN)
    on = last_json(run_command([python(scratch), script], {GATE: "1"}, timeout=300).stdout)
    off = last_json(run_command([python(scratch), script], {}, timeout=300).stdout)
    assert on == {"status": "applied", "raised": "ValueError"}
    assert off == {"status": "gate-off", "raised": "AssertionError"}


def test_the_packages_own_tests_pass_with_the_kit(scratch: Path) -> None:
    proc = run_command([python(scratch), "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                        str(scratch / f"{DIST}-src" / "tests")], {}, check=False, timeout=900,
                       cwd=scratch / f"{DIST}-src")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "3 passed" in proc.stdout and "mutation score: 2/2" in proc.stdout, proc.stdout[-3000:]
    behaviour = PACKAGE_TESTS.strip().split("\n\n\ndef test_contract")[0]
    assert len([line for line in behaviour.splitlines() if line.strip()]) <= 25


@pytest.fixture(scope="module")
def bad(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The interpreter of an environment where a package declaring a bad record (MYFIX_BAD_CASE) is installed."""
    root = tmp_path_factory.mktemp("bad")
    site = scratch_env(root / "venv")
    install(build(root, "myfix-bad", "myfix_bad", {"myfix_bad/__init__.py": "", "myfix_bad/declaration.py": BAD}), site)
    return str(root / "venv" / "bin" / "python")


@pytest.mark.parametrize(("case", "message"), [
    ("id", "patch id 'distill-fsdp2-topk' is declared twice: declared by distribution verl-ascend-ext and declared "
           "by distribution myfix-bad"),
    ("target", "both target verl.trainer.distillation.losses:compute_topk_loss"),
    ("gate", "declared by distribution myfix-bad) uses gate NOBODY_DECLARES_THIS, which no feature declares"),
])
def test_a_bad_foreign_record_is_an_error_naming_its_package(bad: str, case: str, message: str) -> None:
    doctor = run_command([bad, "-m", "verl_ascend_ext.tooling.cli", "doctor"], {"MYFIX_BAD_CASE": case},
                         check=False, timeout=120)
    assert doctor.returncode == 2 and message in doctor.stdout and "myfix-bad" in doctor.stdout, doctor.stdout
    boot = run_python("import verl\nprint('started')", {"MYFIX_BAD_CASE": case}, python=bad, check=False)
    assert boot.returncode != 0 and "started" not in boot.stdout and "myfix-bad" in boot.stderr, boot.stderr[-2000:]
