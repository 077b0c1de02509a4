"""Mutants of released sources, one per fingerprint pattern: is each pattern what tells that code apart?

For a pattern of the shape that decides a record's verdict on a release (``original`` or a variant's where the
record will apply, the matching one of ``fixed`` / ``fixed_shapes`` where the fix is upstream, of
``covered_shapes`` where other records fix the path, with their ``also`` parts), the mutant is that release
with one small, valid edit to the definition the pattern reads:

- ``contains``: one token inside each match renamed (a name gets ``_mutated``, a string or number changes),
  so that the pattern no longer matches;
- ``absent``: one statement that the pattern matches inserted at the top or the bottom of the body
  (the shortest text the expression matches, completed to a statement).

Of the candidate edits, the one that changes the fewest other patterns of the same shape is kept. The
pattern is **killed** when its mutant changes the record's verdict and no other pattern of the shape
changed: the pattern alone tells the mutant apart. It is **dead** when its best edit also changes another
pattern (the pattern is redundant under such edits) or leaves the verdict as it was, and **unexercised**
when no cached release is decided by its shape or no valid edit breaks it. A dead or unexercised pattern is
kept only with a reason on its fingerprint (``Fingerprint.kept``). The edit is made on the normalised text
of the definition, which replaces the definition's lines in a copy of the file (a valid module, checked).
"""

from __future__ import annotations

import ast
import bisect
import io
import keyword
import re
import textwrap
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from verl_ascend_ext.patching.engine import fingerprint_matches, source_definition
from verl_ascend_ext.patching.record import Fingerprint, PatchRecord
from verl_ascend_ext.patching.source import (
    MODULE_QUALNAME,
    Definition,
    definition_in_file,
    find_module_file,
    looking_in,
)
from verl_ascend_ext.testing.releases import Release, replace_file

try:  # Python 3.11+
    from re import _constants as _sre
    from re import _parser as _sre_parse
except ImportError:  # Python 3.10
    import sre_constants as _sre  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]


class Pattern(NamedTuple):
    """One regular expression of a record's fingerprints, and where it sits."""

    record: PatchRecord
    shape: str  # "original", "fixed" or "fixed_shapes[i]"
    part: str  # "" for the shape itself, ".also[0]", ".also[0].also[1]", ...
    kind: str  # "contains" or "absent"
    regex: str
    fingerprint: Fingerprint  # the part holding it (its ``at`` says which definition it reads)

    @property
    def name(self) -> str:
        return f"{self.record.id} {self.shape}{self.part} {self.kind} {self.regex!r}"

    @property
    def reason(self) -> str | None:
        """The reason the fingerprint gives for keeping this pattern (``Fingerprint.kept``), if any."""
        return dict(self.fingerprint.kept).get(self.regex)


def shapes(record: PatchRecord) -> list[tuple[str, Fingerprint]]:
    """The shapes a verdict is decided by, in ``classify``'s order; ``never`` ones have none.

    Fixed shapes, then shapes covered by other records, then the code to fix: ``original`` and each variant's
    (``covered_shapes`` and ``variants`` are read only where the record type has them).
    """
    covered = getattr(record, "covered_shapes", ())
    variants = getattr(record, "variants", ())
    out = [("fixed", record.fixed), *((f"fixed_shapes[{i}]", s) for i, s in enumerate(record.fixed_shapes)),
           *((f"covered_shapes[{i}]", s) for i, s in enumerate(covered)), ("original", record.original),
           *((f"variants[{i}].original", v.original) for i, v in enumerate(variants))]
    return [(name, shape) for name, shape in out if not shape.never]


def _to_fix(shape: str) -> bool:
    """Whether ``shape`` (a ``shapes`` name) recognises code to fix, which needs the target's own definition."""
    return shape == "original" or shape.startswith("variants[")


def _parts(fingerprint: Fingerprint, path: str = "") -> Iterator[tuple[str, Fingerprint]]:
    yield path, fingerprint
    for i, part in enumerate(fingerprint.also):
        yield from _parts(part, f"{path}.also[{i}]")


def patterns(record: PatchRecord) -> list[Pattern]:
    """Every pattern of ``record``'s shapes (``also`` parts included), the shapes of code to fix first."""
    out = []
    for name, shape in sorted(shapes(record), key=lambda s: not _to_fix(s[0])):
        for path, part in _parts(shape):
            out += [Pattern(record, name, path, "contains", p, part) for p in part.contains]
            out += [Pattern(record, name, path, "absent", p, part) for p in part.absent]
    return out


def target_definition(record: PatchRecord) -> Definition | None:
    """The record's own definition as ``predict`` reads it (inside ``looking_in``: in the release)."""
    path = find_module_file(record.module)
    if path is None:
        return None
    try:
        return definition_in_file(path, record.qualname, inherited=True)
    except SyntaxError:
        return None


def read_part(part: Fingerprint, own: Definition | None) -> Definition | None:
    """The definition ``part`` reads (the engine's rule: ``own``, a bare qualname in own's file, or module:qualname)."""
    if not part.at:
        return own
    if ":" not in part.at:
        return definition_in_file(own.path, part.at, inherited=True) if own is not None else None
    return source_definition(part.at)


def deciding_shape(record: PatchRecord, release: Release) -> str | None:
    """Which shape decides ``record``'s verdict on ``release`` (None: refused there, no shape matches)."""
    with looking_in(release.lookup()):
        own = target_definition(record)
        for name, shape in shapes(record):
            if _to_fix(name) and own is None:
                continue
            if fingerprint_matches(shape, own):
                return name
    return None


# ---- the shortest text a pattern matches ------------------------------------------------------------------

_CATEGORY = {_sre.CATEGORY_DIGIT: "0", _sre.CATEGORY_NOT_DIGIT: "x", _sre.CATEGORY_SPACE: " ",
             _sre.CATEGORY_NOT_SPACE: "x", _sre.CATEGORY_WORD: "x", _sre.CATEGORY_NOT_WORD: " "}


def _in_class(items: list[tuple[object, object]]) -> str:
    negate = bool(items) and items[0][0] is _sre.NEGATE
    wanted = items[1:] if negate else items

    def member(ch: str) -> bool:
        for op, av in wanted:
            if (op is _sre.LITERAL and chr(av) == ch) or (op is _sre.RANGE and av[0] <= ord(ch) <= av[1]) or (
                    op is _sre.CATEGORY and re.fullmatch({_sre.CATEGORY_DIGIT: r"\d", _sre.CATEGORY_NOT_DIGIT: r"\D",
                                                          _sre.CATEGORY_SPACE: r"\s", _sre.CATEGORY_NOT_SPACE: r"\S",
                                                          _sre.CATEGORY_WORD: r"\w",
                                                          _sre.CATEGORY_NOT_WORD: r"\W"}[av], ch)):
                return True
        return False

    for ch in "x_ a0(.,:'":
        if member(ch) != negate:
            return ch
    raise ValueError("character class with no simple member")


def shortest_match(regex: str) -> str:
    """A shortest text ``regex`` matches (first branch, fewest repeats); ValueError for constructs it cannot make."""
    groups: dict[int, str] = {}

    def make(items: object) -> str:
        out = []
        for op, av in items:  # type: ignore[attr-defined]
            if op is _sre.LITERAL:
                out.append(chr(av))
            elif op is _sre.NOT_LITERAL:
                out.append("x" if chr(av) != "x" else "y")
            elif op is _sre.ANY:
                out.append("x")
            elif op is _sre.IN:
                out.append(_in_class(av))
            elif op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT, getattr(_sre, "POSSESSIVE_REPEAT", None)):
                low, _high, sub = av
                out.append(make(sub) * low)
            elif op is _sre.SUBPATTERN:
                group, sub = av[0], av[-1]
                text = make(sub)
                if group is not None:
                    groups[group] = text
                out.append(text)
            elif op is _sre.BRANCH:
                out.append(make(av[1][0]))
            elif op is _sre.GROUPREF:
                out.append(groups.get(av, ""))
            elif op is _sre.CATEGORY:
                out.append(_CATEGORY[av])
            elif op in (_sre.AT, _sre.ASSERT, _sre.ASSERT_NOT):
                continue
            else:
                raise ValueError(f"cannot make text for {op} in {regex!r}")
        return "".join(out)

    return make(_sre_parse.parse(regex))


_COMPLETIONS = ("{}", "{})", "x{}", "x{})", "{} x", "{}x", "{}x)", "{}()", "{}:\n    pass", "{}):\n    pass",
                "x = {}", "x = {})", "x = x{}", "x = x{})")


def statements_matching(regex: str) -> list[str]:
    """Statements (valid Python) holding the shortest text ``regex`` matches."""
    try:
        core = shortest_match(regex).strip()
    except (ValueError, KeyError):
        return []
    out = []
    for form in _COMPLETIONS:
        text = form.format(core)
        try:
            ast.parse(text)
        except SyntaxError:
            continue
        out.append(text)
    return out


# ---- edits of a normalised definition -------------------------------------------------------------------

def normalised(text: str) -> str | None:
    """``text`` normalised as the engine does (None when it does not parse): a definition, or a whole module."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    node: ast.AST = tree.body[0] if len(tree.body) == 1 and isinstance(
        tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else tree
    body = getattr(node, "body", None)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
            isinstance(body[0].value.value, str):
        node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return ast.unparse(node)


class _Token(NamedTuple):
    start: int
    end: int
    kind: int
    text: str


def _tokens(text: str) -> list[_Token]:
    offsets = [0]
    for line in text.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.NAME, tokenize.STRING, tokenize.NUMBER) and not (
                    tok.type == tokenize.NAME and (keyword.iskeyword(tok.string) or keyword.issoftkeyword(tok.string))):
                start = offsets[tok.start[0] - 1] + tok.start[1]
                out.append(_Token(start, start + len(tok.string), tok.type, tok.string))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    return out


STYLES = ("suffix", "prefix")


def _changed(token: _Token, style: str) -> str:
    if token.kind == tokenize.NAME:
        return token.text + "_mutated" if style == "suffix" else "mutated_" + token.text
    if token.kind == tokenize.NUMBER:
        return token.text + "1" if style == "suffix" else "1" + token.text.lstrip("0") if token.text.isdigit() \
            else token.text + "1"
    quote = min(i for i in (token.text.find("'"), token.text.find('"')) if i >= 0)
    if style == "suffix":
        return token.text[: quote + 1] + "mutated" + token.text[quote + 1:]
    return token.text[: quote + 1] + "mutated_" + token.text[quote + 1:]


def _without_match(text: str, tokens: list[_Token], regex: str, index: int, style: str) -> str | None:
    """``text`` with the ``index``-th token of every match of ``regex`` changed, until nothing matches.

    ``tokens`` are ``text``'s (``_tokens``); a changed token stays one token of its kind, so they are shifted,
    not made again.
    """
    tokens = list(tokens)
    for _ in range(50):
        found = re.search(regex, text, re.M)
        if found is None:
            return text
        first = bisect.bisect_left([t.start for t in tokens], found.start())
        end = max(found.end(), found.start() + 1)
        inside = []
        for i in range(first, len(tokens)):
            if tokens[i].start >= end:
                break
            if tokens[i].end <= end:
                inside.append(i)
        if not inside:
            return None
        at = inside[min(index, len(inside) - 1)]
        token = tokens[at]
        changed = _changed(token, style)
        text = text[: token.start] + changed + text[token.end:]
        shift = len(changed) - len(token.text)
        tokens[at] = token._replace(end=token.end + shift, text=changed)
        tokens[at + 1:] = [t._replace(start=t.start + shift, end=t.end + shift) for t in tokens[at + 1:]]
    return None


def _body_insertions(text: str, statement: str) -> list[str]:
    """``text`` (one definition, or a module) with ``statement`` inserted first and last in its body."""
    tree = ast.parse(text)
    lines = text.splitlines()
    single = len(tree.body) == 1 and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    if not single:
        return ["\n".join([statement, *lines]), "\n".join([*lines, statement])]
    body = tree.body[0].body  # type: ignore[attr-defined]
    indent = " " * body[0].col_offset
    block = textwrap.indent(statement, indent).splitlines()
    first, last = body[0].lineno - 1, body[-1].end_lineno
    return ["\n".join([*lines[:first], *block, *lines[first:]]), "\n".join([*lines[:last], *block, *lines[last:]])]


def candidates(pattern: Pattern, text: str) -> Iterator[str]:
    """Normalised edits of ``text`` after which ``pattern`` is broken: no longer matches (contains) or matches
    (absent), made one at a time; an edit that renames the definition itself (which only removes the target)
    comes after every edit of its body."""
    edits: Iterator[str | None]
    if pattern.kind == "contains":
        found = re.search(pattern.regex, text, re.M)
        if found is None:
            return
        tokens = _tokens(text)
        count = len([t for t in tokens if found.start() <= t.start and t.end <= found.end()])
        edits = (_without_match(text, tokens, pattern.regex, i, style) for style in STYLES for i in range(count))
    else:
        edits = (e for s in statements_matching(pattern.regex) for e in _body_insertions(text, s))
    name = _defined_name(text)
    seen: set[str] = set()
    renaming: list[str] = []
    for edit in edits:
        new = normalised(edit) if edit is not None else None
        if new is None or new in seen:
            continue
        seen.add(new)
        broken = re.search(pattern.regex, new, re.M) is None if pattern.kind == "contains" else \
            re.search(pattern.regex, new, re.M) is not None
        if not broken:
            continue
        if name is not None and _defined_name(new) != name:
            renaming.append(new)
        else:
            yield new
    yield from renaming


def _defined_name(text: str) -> str | None:
    """The name ``text`` defines when it is one function or class, else None."""
    try:
        body = ast.parse(text).body
    except SyntaxError:
        return None
    return body[0].name if len(body) == 1 and isinstance(body[0], (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                    ast.ClassDef)) else None


# ---- mutants ---------------------------------------------------------------------------------------------

class Mutant(NamedTuple):
    pattern: Pattern
    definition: Definition  # what was edited (in the release)
    text: str  # its new normalised text
    flips: tuple[str, ...]  # names of the shape's patterns that changed (the mutated one first)


def _node_span(path: Path, definition: Definition) -> tuple[int, int, int]:
    """(first line incl. decorators, last line, indentation) of ``definition`` in its file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = definition.qualname.rsplit(".", 1)[-1]
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name and \
                node.lineno == definition.lineno:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            return first, node.end_lineno or node.lineno, node.col_offset
    raise LookupError(f"{definition.qualname} not found at {definition.where}")


def write_mutant(mutant: Mutant, release: Release, copy: Release) -> Path:
    """Write ``mutant``'s file into ``copy`` (a ``releases.link_copy`` of ``release``); the file written."""
    source = Path(mutant.definition.path)
    target = copy.root / source.relative_to(release.root)
    if mutant.definition.qualname == MODULE_QUALNAME:
        new = mutant.text + "\n"
    else:
        first, last, indent = _node_span(source, mutant.definition)
        lines = source.read_text(encoding="utf-8").splitlines()
        block = textwrap.indent(mutant.text, " " * indent).splitlines()
        new = "\n".join([*lines[: first - 1], *block, *lines[last:]]) + "\n"
    ast.parse(new, filename=str(target))  # the mutant is a valid module, never a parse failure
    replace_file(target, new)
    return target


def _state(pattern: Pattern, text: str) -> bool:
    return re.search(pattern.regex, text, re.M) is not None


def mutant(pattern: Pattern, release: Release) -> Mutant | None:
    """The mutant of ``release`` for ``pattern`` (its shape must decide the verdict there), or None when no
    valid edit breaks the pattern."""
    with looking_in(release.lookup()):
        own = target_definition(pattern.record)
        edited = read_part(pattern.fingerprint, own)
        if edited is None:
            return None
        others = [(p, read_part(p.fingerprint, own)) for p in patterns(pattern.record) if p.shape == pattern.shape]
    best: Mutant | None = None
    for text in candidates(pattern, edited.text):
        flips = [pattern.name]
        for other, where in others:
            if other == pattern or where is None:
                continue
            same = (where.path, where.qualname) == (edited.path, edited.qualname)
            if same and _state(other, where.text) != _state(other, text):
                flips.append(other.name)
        found = Mutant(pattern, edited, text, tuple(flips))
        if best is None or len(found.flips) < len(best.flips):
            best = found
        if len(best.flips) == 1:
            break
    return best
