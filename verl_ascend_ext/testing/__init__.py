"""The patch-contract kit: test your patch records (this package's or your own package's) the way this package does.

Nothing here is imported by the plugin itself (it is not part of discovery); use it from tests.

The contract, for every record on every release it concerns (``check_contract``; see ``contract``)::

    from verl_ascend_ext.testing import check_contract, from_artifact
    from my_fix.declaration import MY_RECORD

    def test_contract(tmp_path):
        releases = [from_artifact("verl-0.9.0-py3-none-any.whl", tmp_path / "a", importable=True)]
        report = check_contract([MY_RECORD], releases, tmp_path / "work")
        print(report.summary())
        assert report.ok, report.summary()

Releases (``releases``): ``from_artifact`` (a wheel, sdist or source directory, read as ``verl-ascend vet``
reads it; ``importable=True`` for a pure-Python release whose dependencies are installed, e.g. verl),
``installed_release`` (what is installed here), ``from_tree`` (a source directory of a known version),
``with_diff`` (a release with upstream's fix applied as a diff), ``cached_releases`` (what this project's
``scripts/fetch_*.sh`` cache). The record must be registered (its entry point installed): the in-process half
boots the plugin as production does.

The acts contract (``check_acts``; see ``acts``): a replacement that can call the original without doing its work
declares ``acts_when`` and reports ``acted`` exactly where it acts, checked on cases you give (``ActsCase``) and
against mutants that report acting on a stand-down path.

A behaviour test (the bug with the gate off, the fix with it on, in a fresh interpreter that boots the plugin
through verl's own discovery): ``run_python(code, {GATE.env: "1"})`` and ``last_json`` (``subprocesses``), from
one scrubbed environment, so a variable of your shell can neither pass nor fail a test.
"""

from verl_ascend_ext.testing.acts import ActsCase, ActsFinding, check_acts
from verl_ascend_ext.testing.contract import ContractReport, Failure, MutationResult, cached_releases, check_contract
from verl_ascend_ext.testing.releases import Release, from_artifact, from_tree, installed_release, with_diff
from verl_ascend_ext.testing.subprocesses import last_json, run_command, run_python, scrubbed_env

__all__ = [
    "ActsCase",
    "ActsFinding",
    "ContractReport",
    "Failure",
    "MutationResult",
    "Release",
    "cached_releases",
    "check_acts",
    "check_contract",
    "from_artifact",
    "from_tree",
    "installed_release",
    "last_json",
    "run_command",
    "run_python",
    "scrubbed_env",
    "with_diff",
]
