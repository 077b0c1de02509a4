"""Features plug in through pluggy: built-ins and third parties alike; implementations are validated."""

from __future__ import annotations

from pathlib import Path

import pluggy
import pytest
from subprocesses import last_json, run_python

from verl_ascend_ext.patching import Fingerprint, Gate, PatchRecord
from verl_ascend_ext.runtime.hookspecs import hookimpl
from verl_ascend_ext.runtime.registry import FeatureDeclarationError, build_plugin_manager, collect

X_GATE = Gate("X_GATE", False, "test gate")


def record(pid: str, target: str, gate: Gate = X_GATE, **fields: object) -> PatchRecord:
    fp = Fingerprint(contains=("x",))
    return PatchRecord(id=pid, feature="t", why="w", target=target, gate=gate, distribution="d", versions=">=1",
                       original=fp, fixed=fp, wrapper="m:f", upstream="u", remove_when="r", traced=False)._replace(
                           **fields)


class Misspelled:
    @hookimpl
    def verl_ascend_ext_patch_record(self):  # missing the trailing "s"
        return []


def test_misspelled_hook_is_rejected() -> None:
    with pytest.raises(pluggy.PluginValidationError, match="verl_ascend_ext_patch_record"):
        build_plugin_manager((Misspelled(),))


def test_hook_with_unknown_argument_is_rejected() -> None:
    class BadArgs:
        @hookimpl
        def verl_ascend_ext_doctor_findings(self, environ, verbose):
            return []

    with pytest.raises(pluggy.PluginValidationError):
        build_plugin_manager((BadArgs(),))


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([record("a", "m:f"), record("a", "m:g")], "declared twice"),
        ([record("a", "m:f"), record("b", "m:f")], "both target m:f"),
        ([record("a", "m:f", gate=Gate("NOBODY", False, "-"))], "uses gate NOBODY, which no feature declares"),
        ([record("a", "m:f", gate=Gate("X_GATE", True, "-"))], "carries gate X_GATE with default True, but it is "
         "declared with default False"),
        ([record("b", "m:g", serves=(record("a", "m:f"),))], "serves patch 'a', which is not registered as given"),
        ([record("a", "m:f"), record("b", "m:g", needs=(record("a", "m:f", why="other"),))],
         "needs patch 'a', which is not registered as given"),
        ([record("a", "m:f", action="patch")],
         r"patch 'a' \(feature t, declared \(not installed: registered in-process\)\) has action 'patch'; use one of "
         "'wrap'"),
        ([record("a", "m:f", versions="0.9")], r"patch 'a' \(feature t, .*\) has versions '0.9', not a PEP 440"),
        ([record("a", "m:f", versions=">=0.9.0;<0.10")], "not a PEP 440 specifier set"),
        ([record("a", "m:f", fixed=Fingerprint(description="never"))],
         "its fixed fingerprint has no patterns.*Fingerprint.never_matching"),
        ([record("a", "m:f", original=Fingerprint(contains=("x",), also=(Fingerprint(at="m:g"),)))],
         "its original fingerprint has no patterns"),
    ],
)
def test_contradicting_declarations_are_errors(records: list[PatchRecord], message: str) -> None:
    class Feature:
        @hookimpl
        def verl_ascend_ext_gates(self):
            return [Gate("X_GATE", False, "test gate")]

        @hookimpl
        def verl_ascend_ext_patch_records(self):
            return records

    with pytest.raises(FeatureDeclarationError, match=message):
        collect(build_plugin_manager((Feature(),)))


def test_never_matching_is_explicit_and_recognises_nothing() -> None:
    never = Fingerprint.never_matching("no upstream release carries it")
    assert never.never and not never.matches("") and not never.matches("anything")
    assert collect(build_plugin_manager((_feature([record("a", "m:f", fixed=never)]),))).record("a").fixed == never


def _feature(records: list[PatchRecord]) -> object:
    class Feature:
        @hookimpl
        def verl_ascend_ext_gates(self):
            return [Gate("X_GATE", False, "test gate")]

        @hookimpl
        def verl_ascend_ext_patch_records(self):
            return records

    return Feature()


def test_builtin_features_come_from_the_entry_point_group() -> None:
    pm = build_plugin_manager()
    names = {name for name, _ in pm.list_name_plugin()}
    assert "distillation" in names


def test_third_party_feature_registers_through_the_same_group(tmp_path: Path) -> None:
    """A separately installed distribution (a real .dist-info on sys.path) adds a patch record and a gate."""
    (tmp_path / "thirdparty_feature.py").write_text(
        "from verl_ascend_ext.runtime.hookspecs import hookimpl\n"
        "from verl_ascend_ext.patching import Fingerprint, Gate, PatchRecord\n"
        "GATE = Gate('THIRDPARTY_GATE', False, 'third-party gate')\n"
        "@hookimpl\n"
        "def verl_ascend_ext_gates():\n"
        "    return [GATE]\n"
        "@hookimpl\n"
        "def verl_ascend_ext_patch_records():\n"
        "    fp = Fingerprint(contains=('json',), description='anything')\n"
        "    return [PatchRecord(id='thirdparty-json', feature='thirdparty', why='demo', target='json:dumps',\n"
        "                        gate=GATE, distribution='thirdparty', versions='>=1',\n"
        "                        original=fp, fixed=Fingerprint.never_matching('no upstream fix'),\n"
        "                        wrapper='thirdparty_feature:wrap', upstream='none', remove_when='never',\n"
        "                        traced=False)]\n"
    )
    info = tmp_path / "thirdparty-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[verl_ascend_ext.features]\nthirdparty = thirdparty_feature\n")
    out = last_json(run_python("""
        import json
        from verl_ascend_ext.runtime.registry import registry
        reg = registry()
        print(json.dumps({"ids": [r.id for r in reg.records], "gates": [g.env for g in reg.gates]}))
    """, pythonpath=str(tmp_path)).stdout)
    assert "thirdparty-json" in out["ids"] and "distill-fsdp2-topk" in out["ids"]
    assert "THIRDPARTY_GATE" in out["gates"]


def test_every_record_of_this_package_has_a_pep440_version_range() -> None:
    """Boot parses only other distributions' specifiers (``registry``): this package's own are checked here."""
    from verl_ascend_ext.runtime.registry import OWN_DISTRIBUTION, check_versions, registry

    reg = registry()
    own = [r for r in reg.records if reg.declared_by[r.id] == OWN_DISTRIBUTION]
    assert len(own) >= 20, len(own)
    for record in own:
        check_versions(record, record.id)
