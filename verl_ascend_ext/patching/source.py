"""Reading code without running it: locate a module's file, extract and normalise one definition.

The same extraction serves two callers, so that a prediction and the real thing cannot disagree:
- statically (doctor, on a login node): the target is found by walking the installed package tree
  from the top-level package's location, without importing the package;
- in-process (when the target module was imported): the file and line come from the live
  function's code object.
Normalisation parses the definition and unparses it without its docstring, so comments and
formatting do not matter, but every statement does. Parsed files are kept on disk keyed by their content
(see ``content_digest``) and in-process by their stat (see ``_stamp``).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import logging
import os
import re
import socket
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

from verl_ascend_ext.patching.cachedir import CACHE_ENV, cache_dir


@dataclass(frozen=True)
class Definition:
    """One function (or class) definition as found in a source file."""

    qualname: str
    path: str
    lineno: int
    text: str  # normalised source (ast.unparse, docstring removed)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.lineno}"


class Lookup(NamedTuple):
    """Where module files and distribution versions are looked up instead of the installed environment.

    ``roots``: directories holding top-level packages (as site-packages does); ``versions``: distribution
    name (canonical, lower-case with dashes) -> version. ``verl-ascend vet`` predicts against an artifact
    (a wheel, sdist or source tree) this way, with the same code doctor uses.
    """

    roots: tuple[Path, ...]
    versions: Mapping[str, str]


_lookup: ContextVar[Lookup | None] = ContextVar("verl_ascend_ext_lookup", default=None)


@contextmanager
def looking_in(lookup: Lookup) -> Iterator[None]:
    """Within this block, ``find_module_file`` and ``lookup_version`` see only ``lookup``."""
    token = _lookup.set(lookup)
    try:
        yield
    finally:
        _lookup.reset(token)


def active_lookup() -> Lookup | None:
    return _lookup.get()


def canonical_name(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _find_in_roots(module: str, roots: tuple[Path, ...]) -> Path | None:
    top, *rest = module.split(".")
    for root in roots:
        if not rest and (root / f"{top}.py").is_file():
            return root / f"{top}.py"
        base = root / top
        for part in rest[:-1]:
            base = base / part
        if not base.is_dir():
            continue
        if not rest:
            return base / "__init__.py" if (base / "__init__.py").is_file() else None
        if (base / f"{rest[-1]}.py").is_file():
            return base / f"{rest[-1]}.py"
        if (base / rest[-1] / "__init__.py").is_file():
            return base / rest[-1] / "__init__.py"
    return None


def find_module_file(module: str) -> Path | None:
    """Path of ``module``'s source file, found without importing it or its parents.

    Only the top-level package is looked up through the import system (which, for a top-level
    name, imports nothing); submodules are found by walking its directories. Inside ``looking_in``,
    only the lookup's roots are searched.
    """
    lookup = _lookup.get()
    if lookup is not None:
        return _find_in_roots(module, lookup.roots)
    loaded = sys.modules.get(module)
    loaded_file = getattr(loaded, "__file__", None)
    if loaded_file and loaded_file.endswith(".py"):
        return Path(loaded_file)
    top, *rest = module.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not rest:
        return Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    dirs = [Path(p) for p in (spec.submodule_search_locations or [])]
    for part in rest[:-1]:
        dirs = [d / part for d in dirs if (d / part).is_dir()]
    last = rest[-1]
    for d in dirs:
        if (d / f"{last}.py").is_file():
            return d / f"{last}.py"
        if (d / last / "__init__.py").is_file():
            return d / last / "__init__.py"
    return None


def _strip_docstring(node: ast.AST) -> ast.AST:
    body = getattr(node, "body", None)
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        node.body = body[1:] or [ast.Pass()]
    return node


def _collect(body: list[ast.stmt], prefix: str, out: dict[str, ast.AST]) -> None:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{node.name}"
            out[name] = node  # a later definition rebinds the name, as executing the module does
            if isinstance(node, ast.ClassDef):
                _collect(node.body, f"{name}.", out)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            nested = [n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt)]
            nested += [s for handler in getattr(node, "handlers", []) for s in handler.body]
            _collect(nested, prefix, out)


INDEX_FORMAT = 4  # bump when the normalisation or the entry layout changes: older entries are then ignored
INDEX_DIR_ENV = CACHE_ENV
PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"  # ast.unparse output depends on it


def index_dir() -> Path:
    """Where normalised definitions are kept between processes (``$VERL_ASCEND_EXT_CACHE/source-index``)."""
    return cache_dir() / "source-index"


def content_digest(data: bytes) -> str:
    """The key of a file version in the on-disk index: a hash of its bytes (not its path, mtime or size).

    Reproducible image builds normalise mtimes and a one-character upstream fix keeps the size, so only
    the content tells two versions apart. blake2b of the 7 files (343 KB) the GLM-5.2 set reads: 0.9 ms.
    """
    return hashlib.blake2b(data, digest_size=20).hexdigest()


def _index_file(digest: str) -> Path:
    return index_dir() / f"{digest}-py{PYTHON}-f{INDEX_FORMAT}.json"


def _stamp(path: str) -> tuple[int, int, int, int]:
    """What the in-process caches are keyed by: (mtime, size, inode, ctime), all from one stat.

    Only a cache of this process is keyed by it (a stat is far cheaper than hashing the file on every
    lookup). What is persisted is keyed by the hash of the very bytes that were parsed, so a file that
    changes while keeping this stamp can at worst mislead this process, never another one; and ctime,
    which ``os.utime`` cannot set back, changes on every write, so even that needs a rewrite within the
    filesystem's timestamp granularity.
    """
    st = os.stat(path)
    return st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns


Definitions = dict[str, tuple[int, int, str]]
Bases = dict[str, tuple[str, ...]]


class _Entry(NamedTuple):
    """What the index keeps for one file version: every definition, the top-level classes' bases, and (once a
    record asked for it) the normalised text of the whole module."""

    digest: str
    definitions: Definitions
    bases: Bases
    module: str | None


# What this process did to get normalised source (read by tests: a warm process parses nothing).
_counts = {"parsed": 0, "index_hits": 0, "index_misses": 0}


def counts() -> dict[str, int]:
    """Files parsed, and on-disk index entries found usable (hits) or not (misses), by this process so far."""
    return dict(_counts)


def _tree(path: str, data: bytes) -> ast.Module:
    _counts["parsed"] += 1
    return ast.parse(data.decode("utf-8"), filename=path)


def _parse(path: str, data: bytes, digest: str) -> _Entry:
    tree = _tree(path, data)
    found: dict[str, ast.AST] = {}
    _collect(tree.body, "", found)
    result: Definitions = {}
    for qualname, node in found.items():
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        text = ast.unparse(_strip_docstring(node))
        result[qualname] = (node.lineno, first, text)
    bases = {node.name: tuple(b.id for b in node.bases if isinstance(b, ast.Name))
             for node in tree.body if isinstance(node, ast.ClassDef)}
    return _Entry(digest, result, bases, None)


_matches: dict[str, bool] | None = None


def remembered_match(patterns: tuple[tuple[str, ...], tuple[str, ...]], text: str, compute: Callable[[], bool]) -> bool:
    """A fingerprint's verdict on ``text``, remembered across processes next to the source index.

    Compiling and running the regular expressions of every record costs more than reading the index;
    the verdict depends only on the patterns and the normalised text, so it is keyed by both.
    """
    global _matches
    store = index_dir() / f"matches-{INDEX_FORMAT}.json"
    if _matches is None:
        _matches = _read_verdicts(store)
    key = hashlib.sha256(f"{patterns!r}\0{text}".encode()).hexdigest()[:32]
    known = _matches.get(key)
    if known is not None:
        return known
    verdict = compute()
    _matches[key] = verdict
    _write_json(store, {**_read_verdicts(store), **_matches}, "verdicts")
    return verdict


def _write_json(target: Path, document: object, what: str) -> None:
    """Write ``document`` to ``target`` atomically: concurrent writers, the last one wins, no half-written file."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_text(json.dumps(document), encoding="utf-8")
        os.replace(tmp, target)
    except OSError as err:
        logging.getLogger("verl_ascend_ext").info("verl-ascend-ext: %s not written (%s): %s", what, target, err)


def _read_verdicts(store: Path) -> dict[str, bool]:
    try:
        stored = json.loads(store.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in stored.items() if isinstance(v, bool)} if isinstance(stored, dict) else {}


def _read_index(index: Path, digest: str) -> _Entry | None:
    """The stored entry of the file whose bytes hash to ``digest``, or None when the entry is not usable.

    Missing, unreadable, not JSON, another format or Python, another file's content (the digest is stored
    in the entry and checked), any definition not shaped (int, int, str), bases not lists of names, or a
    module text that is not a string: the entry is not trusted.
    """
    try:
        stored = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or (stored.get("format"), stored.get("python"), stored.get("content")) != (
            INDEX_FORMAT, PYTHON, digest):
        return None
    found, bases, module = stored.get("definitions"), stored.get("bases"), stored.get("module")
    if not isinstance(found, dict) or not isinstance(bases, dict) or not (module is None or isinstance(module, str)):
        return None
    result: Definitions = {}
    for name, entry in found.items():
        if not (isinstance(entry, list) and len(entry) == 3 and type(entry[0]) is int and type(entry[1]) is int
                and isinstance(entry[2], str)):
            return None
        result[name] = (entry[0], entry[1], entry[2])
    if not all(isinstance(names, list) and all(isinstance(n, str) for n in names) for names in bases.values()):
        return None
    return _Entry(digest, result, {k: tuple(v) for k, v in bases.items()}, module)


def _write_index(entry: _Entry) -> None:
    _write_json(_index_file(entry.digest), {"format": INDEX_FORMAT, "python": PYTHON, "content": entry.digest,
                                            "definitions": entry.definitions, "bases": entry.bases,
                                            "module": entry.module}, "source index")


@lru_cache(maxsize=256)
def _entry_cached(path: str, stamp: tuple[int, int, int, int]) -> _Entry:
    """The index entry of one file version, from the on-disk index when another process made it.

    Parsing and unparsing a large module (vLLM's engine core: ~75 ms) would otherwise be paid in every
    process of a job. The index is keyed by the hash of the file's bytes, the Python version and the
    format, written atomically; an unusable entry is parsed again and overwritten, an unwritable index
    only costs the parse.
    """
    data = Path(path).read_bytes()
    digest = content_digest(data)
    stored = _read_index(_index_file(digest), digest)
    if stored is not None:
        _counts["index_hits"] += 1
        return stored
    _counts["index_misses"] += 1
    entry = _parse(path, data, digest)
    _write_index(entry)
    return entry


def definitions(path: str | os.PathLike[str]) -> Definitions:
    """All definitions of a file: qualname -> (def line, first decorator line, normalised text)."""
    p = os.fspath(path)
    return _entry_cached(p, _stamp(p)).definitions


MODULE_QUALNAME = "<module>"  # the qualname that names a whole module's top-level code (import-action records)


@lru_cache(maxsize=64)
def _module_text_cached(path: str, stamp: tuple[int, int, int, int]) -> str:
    """The normalised text of the whole module, kept in its index entry from the first time a record asks for it
    (most files are read only for their definitions, so it is not made when the entry is)."""
    entry = _entry_cached(path, stamp)
    if entry.module is not None:
        return entry.module
    data = Path(path).read_bytes()
    text = ast.unparse(_strip_docstring(_tree(path, data)))
    if content_digest(data) == entry.digest:  # the file did not change since the entry was read
        _write_index(entry._replace(module=text))
    return text


def class_bases(path: str | os.PathLike[str]) -> Bases:
    """Top-level classes of a file -> the names of their bases that are plain names (``class A(B, C)``)."""
    p = os.fspath(path)
    return _entry_cached(p, _stamp(p)).bases


def definition_in_file(path: str | os.PathLike[str], qualname: str, inherited: bool = False) -> Definition | None:
    """``qualname``'s normalised definition in ``path``; ``"<module>"`` gives the whole module.

    With ``inherited``, a method ``Class.name`` that ``Class`` does not define itself is looked up in its
    base classes defined in the same file (depth first, left to right: the MRO for single inheritance),
    as attribute lookup on the live class would find it; the definition found names its own class.
    """
    if qualname == MODULE_QUALNAME:
        p = os.fspath(path)
        return Definition(qualname, p, 1, _module_text_cached(p, _stamp(p)))
    entry = definitions(path).get(qualname)
    if entry is None:
        klass, _, name = qualname.rpartition(".")
        if not inherited or not klass or "." in klass:
            return None
        for base in class_bases(path).get(klass, ()):
            found = definition_in_file(path, f"{base}.{name}", inherited=True)
            if found is not None:
                return found
        return None
    return Definition(qualname, os.fspath(path), entry[0], entry[2])


def definition_of_object(obj: object) -> Definition | None:
    """The definition of a live function or method, read from the file its code object names.

    A decorated function whose outer code is the decorator's (``functools.wraps`` sets ``__wrapped__``,
    e.g. verl's ``@register``) is followed down its ``__wrapped__`` chain to the function it decorates.
    """
    for _ in range(8):
        found = _definition_of_code(obj)
        if found is not None or getattr(obj, "__wrapped__", None) is None:
            return found
        obj = obj.__wrapped__  # type: ignore[attr-defined]
    return None


def _definition_of_code(obj: object) -> Definition | None:
    func = getattr(obj, "__func__", obj)
    code = getattr(func, "__code__", None)
    if code is None or not os.path.isfile(code.co_filename):
        return None
    qualname = getattr(func, "__qualname__", "")
    for name, (lineno, first, text) in definitions(code.co_filename).items():
        if code.co_firstlineno in (lineno, first) and name.rsplit(".", 1)[-1] == func.__name__:
            return Definition(qualname or name, code.co_filename, lineno, text)
    return None


def clear_cache() -> None:
    _entry_cached.cache_clear()
    _module_text_cached.cache_clear()
    global _matches
    _matches = None
