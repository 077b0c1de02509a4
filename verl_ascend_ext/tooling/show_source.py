"""``verl-ascend source MODULE:QUALNAME``: the normalised text a fingerprint is matched against.

Read statically, as doctor reads it (the module is located without importing it or its package), and
normalised as the engine normalises it (``ast.unparse``, docstring removed, comments and formatting gone).
Write a record's regular expressions against exactly this output. ``--from ARTIFACT`` reads a release that is
not installed (a wheel, an sdist or a source directory), unpacked and looked up exactly as ``vet`` does.
"""

from __future__ import annotations

import difflib
import io
import sys
from typing import TextIO

from verl_ascend_ext.patching.record import split_target
from verl_ascend_ext.patching.source import (
    MODULE_QUALNAME,
    Lookup,
    definition_in_file,
    definitions,
    find_module_file,
    looking_in,
)


def show(target: str, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print ``target``'s normalised definition to ``out`` (its file and line to ``err``); 1 when not found."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        module, qualname = split_target(target)
    except ValueError as error:
        print(f"verl-ascend source: {error} (e.g. 'vllm.v1.engine.core:EngineCore.wake_up', or "
              f"'pkg.mod:{MODULE_QUALNAME}' for a module's top-level code)", file=err)
        return 1
    path = find_module_file(module)
    if path is None:
        print(f"verl-ascend source: module {module} not found in this environment (not installed, or no .py "
              "source); it was looked up without importing it", file=err)
        return 1
    try:
        found = definition_in_file(path, qualname, inherited=True)
    except SyntaxError as error:
        print(f"verl-ascend source: {path} does not parse: {error.msg} at line {error.lineno}", file=err)
        return 1
    except UnicodeDecodeError as error:
        print(f"verl-ascend source: {path} is not UTF-8 text: {error}", file=err)
        return 1
    if found is None:
        close = difflib.get_close_matches(qualname, list(definitions(path)), n=5, cutoff=0.6)
        hint = f"; close names there: {', '.join(close)}" if close else ""
        print(f"verl-ascend source: {qualname} is not defined in {path} (module {module}){hint}", file=err)
        return 1
    inherited = "" if found.qualname == qualname else f", inherited from {found.qualname}"
    print(f"# {found.where}{inherited} (normalised: ast.unparse, no docstring, no comments)", file=err)
    out.write(found.text + "\n")
    return 0


def show_from(target: str, artifact: str, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``show`` on the release in ``artifact`` (wheel, sdist or directory), read as ``vet`` reads it; 1 on bad input."""
    import tempfile
    from pathlib import Path

    from verl_ascend_ext.tooling.vet import ArtifactError, open_artifact, shown_paths

    err = err or sys.stderr
    with tempfile.TemporaryDirectory(prefix="verl-ascend-source-") as tmp:
        try:
            opened = open_artifact(artifact, Path(tmp))
        except ArtifactError as error:
            print(f"verl-ascend source: {error}", file=err)
            return 1
        print(f"# {opened.distribution} {opened.version} from {artifact} ({opened.kind})", file=err)
        capture, notes = io.StringIO(), io.StringIO()
        with looking_in(Lookup((opened.root,), opened.versions)):
            code = show(target, capture, notes)
        err.write(shown_paths(notes.getvalue(), {str(opened.root): opened.shown}))
        (out or sys.stdout).write(capture.getvalue())
        return code
