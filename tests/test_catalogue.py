"""docs/patches.md is generated from the patch records; this fails when it is stale."""

from __future__ import annotations

from repo import REPO

from verl_ascend_ext.runtime.registry import registry
from verl_ascend_ext.tooling.catalogue import render


def test_catalogue_is_current() -> None:
    current = (REPO / "docs" / "patches.md").read_text(encoding="utf-8")
    assert current == render(), "docs/patches.md is stale: run `verl-ascend catalogue > docs/patches.md`"


def test_catalogue_lists_every_record_with_its_contract() -> None:
    text = render()
    for record in registry().records:
        section = text.split(f"## `{record.id}`", 1)[1].split("\n## ", 1)[0]
        for value in (record.target, record.gate.env, record.upstream, record.remove_when):
            assert value in section, (record.id, value)


def test_switches_table_is_current() -> None:
    """docs/switches.md's table of switches is generated from the declared gates and settings (`verl-ascend
    switches`); the README points at it."""
    from verl_ascend_ext.tooling.switches import check, render

    assert check(str(REPO / "docs" / "switches.md")) is None, "docs/switches.md's switches are stale: run " \
        "`verl-ascend switches --write docs/switches.md`"
    assert "(docs/switches.md)" in (REPO / "README.md").read_text(encoding="utf-8")
    table = render()
    for gate in registry().gates:
        assert f"| `{gate.env}` | {'on' if gate.default else 'off'} |" in table
    assert "| `VERL_ASCEND_EXT_WEIGHT_SYNC_BARRIER_TIMEOUT` | `600` s |" in table  # a declared setting flows in
    assert "`VERL_ASCEND_EXT_EXPORT_CHECK` | `error`" in table


def test_readme_set_up_block_is_the_main_job_and_the_tests_and_ci_runs_the_second() -> None:
    """A fresh machine needs two commands: the main job and the tests; `.ci/run` runs the same test command."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Set-up on a fresh machine", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]
    assert commands == ["bash scripts/setup.sh", "bash scripts/test.sh"], commands
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert ci.rstrip().splitlines()[-1] == "exec bash scripts/test.sh", ci


def test_the_process_end_switch_is_listed_with_the_gates() -> None:
    from verl_ascend_ext.runtime.records.process_end import GATE
    from verl_ascend_ext.tooling.switches import render

    assert f"| `{GATE.env}` | on |" in render()
