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


def test_readme_switches_table_is_current() -> None:
    """README's table of switches is generated from the declared gates and settings (`verl-ascend switches`)."""
    from verl_ascend_ext.tooling.switches import check, render

    assert check(str(REPO / "README.md")) is None, "README.md's switches are stale: run " \
        "`verl-ascend switches --write README.md`"
    table = render()
    for gate in registry().gates:
        assert f"| `{gate.env}` | {'on' if gate.default else 'off'} |" in table
    assert "| `VERL_ASCEND_EXT_WEIGHT_SYNC_BARRIER_TIMEOUT` | `600` s |" in table  # a declared setting flows in
    assert "`VERL_ASCEND_EXT_EXPORT_CHECK` | `error`" in table
