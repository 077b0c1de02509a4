"""``verl-ascend source MODULE:QUALNAME`` prints the text fingerprints are matched against, read statically."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from subprocesses import last_json, run_python

from verl_ascend_ext.features.weight_sync.declaration import KV_BARRIER, UPDATE_WEIGHTS
from verl_ascend_ext.patching import engine
from verl_ascend_ext.tooling.cli import main

PROBE = '''"""Module docstring."""
import os


class Base:
    def step(self, x):  # a comment
        """Docstring, dropped."""
        return os.sep + str(x)    # spacing is normalised


class Child(Base):
    pass
'''


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "source_probe_mod.py").write_text(PROBE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / "source_probe_mod.py"


def test_prints_the_normalised_definition(probe: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["source", "source_probe_mod:Base.step"]) == 0
    out, err = capsys.readouterr()
    assert out == "def step(self, x):\n    return os.sep + str(x)\n"
    assert f"{probe}:6" in err


def test_inherited_method_is_found_as_the_engine_finds_it(probe: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["source", "source_probe_mod:Child.step"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("def step(self, x):") and "inherited from Base.step" in err


def test_output_is_what_a_record_fingerprint_matches(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["source", UPDATE_WEIGHTS]) == 0
    out = capsys.readouterr().out
    assert out == engine.source_definition(UPDATE_WEIGHTS).text + "\n"
    assert all(re.search(p, out, re.M) for p in KV_BARRIER.original.contains)  # verl 0.9.0 installed


@pytest.mark.parametrize(("target", "message"), [
    ("source_probe_mod:Base.stpe", "Base.stpe is not defined in .*close names there: Base.step"),
    ("no_such_module_xyz:f", "module no_such_module_xyz not found"),
    ("source_probe_mod", "must look like 'package.module:Qualified.name'"),
])
def test_not_found_is_exit_1_with_a_clear_message(probe: Path, target: str, message: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["source", target]) == 1
    out, err = capsys.readouterr()
    assert out == "" and re.search(message, err)


def test_reads_without_importing() -> None:
    out = last_json(run_python(f"""
        import contextlib, io, json, sys
        from verl_ascend_ext.tooling.cli import main
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = main(["source", "{UPDATE_WEIGHTS}"])
        print(json.dumps({{"code": code, "verl": "verl" in sys.modules}}))
    """).stdout)
    assert out == {"code": 0, "verl": False}
