"""The patch contract, checked the same way for every record on every release it concerns.

For each record and each release in its ``versions`` (``releases.Release``):

1. prediction = what apply does: the static prediction (vet's path: ``engine.predict`` inside
   ``source.looking_in``) equals the in-process status of a process that boots the plugin as production does
   and imports the target, with every gate of the records on, all off, and the kill switch naming them;
2. gate off and the kill switch leave the target untouched (no layer of ours, no marker, the live definition
   is the released one); gate on applies exactly one layer (or stands down, as predicted), and booting again
   through every loader and applying again still leaves one;
3. mutation (``mutations``): for each pattern of the shape that decides the verdict, a copy of the release
   with that pattern's match broken changes the verdict, predicted statically, in-process and by doctor with
   the same status and (for a refusal) the same message. Dead and unexercised patterns are listed; each needs
   a reason on its fingerprint (``Fingerprint.kept``).

Gates are set explicitly (default-off gates included) and a refusal during ``import verl`` (a target verl
imports itself) is read from the stopped boot, so an author declares nothing for either. The in-process half
runs in ``child`` processes: a real import for an importable release, the released definitions
(``standin``) for one that cannot be imported here. ``check_contract`` returns a ``ContractReport``; its
``summary()`` prints what ran where, the mutation score and the time.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from verl_ascend_ext.patching.engine import predict
from verl_ascend_ext.patching.gates import DISABLE_ENV
from verl_ascend_ext.patching.record import PatchRecord, PatchStatus, Status
from verl_ascend_ext.patching.source import find_module_file, looking_in
from verl_ascend_ext.runtime.records.store import DIR_ENV
from verl_ascend_ext.testing import mutations
from verl_ascend_ext.testing.releases import Release, link_copy
from verl_ascend_ext.testing.subprocesses import last_json, run_command

SCENARIOS = ("on", "off", "killed")
IN_PROCESS = {Status.WILL_APPLY.value: Status.APPLIED.value}  # a prediction's status as the process reports it


class Failure(NamedTuple):
    record: str
    release: str
    check: str
    detail: str

    def __str__(self) -> str:
        return f"{self.record} on {self.release}: {self.check}: {self.detail}"


class MutationResult(NamedTuple):
    pattern: str
    release: str
    outcome: str  # "killed", "dead" or "unexercised"
    detail: str
    reason: str | None  # the fingerprint's ``kept`` reason


class ContractReport(NamedTuple):
    """What ``check_contract`` found: failures (empty when the contract holds), mutations, where each half ran."""

    failures: list[Failure]
    mutations: list[MutationResult]
    halves: dict[str, list[str]]  # record id -> "static + in-process (real import): verl 0.9.0 (...)" lines
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def score(self) -> tuple[int, int]:
        """(killed, killed + dead): patterns a mutation of real code showed needed, of those it could test."""
        tested = [m for m in self.mutations if m.outcome != "unexercised"]
        return sum(m.outcome == "killed" for m in tested), len(tested)

    def summary(self) -> str:
        killed, tested = self.score
        unexercised = [m for m in self.mutations if m.outcome == "unexercised"]
        out = ["patch contract: where each record was checked", ""]
        full: dict[str, None] = {}
        for record, lines in self.halves.items():
            checks: dict[str, list[str]] = {}
            for line in lines:
                how, _, release = line.partition(": ")
                full.setdefault(release)
                checks.setdefault(how, []).append(_short(release))
            out.append(f"  {record}: " + "; ".join(f"{how}: {', '.join(names)}" for how, names in checks.items()))
        out += ["", "releases:"] + [f"  {name}" for name in full]
        out += ["", f"mutation score: {killed}/{tested} patterns killed "
                    f"({len(unexercised)} unexercised, {len(self.mutations)} patterns in all)"]
        for m in self.mutations:
            if m.outcome != "killed":
                out.append(f"  {m.outcome}: {m.pattern} on {m.release}: {m.detail}; kept because: "
                           f"{m.reason or 'NO REASON GIVEN (Fingerprint.kept)'}")
        out += ["", f"{len(self.failures)} failure(s) in {self.seconds:.1f} s"]
        out += [f"  FAIL {f}" for f in self.failures]
        return "\n".join(out)


def _short(release: str) -> str:
    """``vllm-ascend 0.23.0 (sources + 0001-x.diff)`` -> ``vllm-ascend 0.23.0 + 0001-x.diff``."""
    base, _, label = release.partition(" (")
    return " + ".join([base, *label.rstrip(")").split(" + ")[1:]])


def _environments(records: Sequence[PatchRecord]) -> dict[str, dict[str, str]]:
    gates = {r.gate.env for r in records}
    return {"on": dict.fromkeys(gates, "1"), "off": dict.fromkeys(gates, "0"),
            "killed": {**dict.fromkeys(gates, "1"), DISABLE_ENV: ",".join(r.id for r in records)}}


def _with_dependencies(records: Iterable[PatchRecord]) -> list[PatchRecord]:
    """``records`` and the records they serve or need (predicted and applied together, as in production)."""
    out: dict[str, PatchRecord] = {}

    def add(record: PatchRecord) -> None:
        for other in (*record.needs, *record.serves):
            add(other)
        out.setdefault(record.id, record)

    for record in records:
        add(record)
    return list(out.values())


def predicted(record: PatchRecord, release: Release, environ: Mapping[str, str]) -> PatchStatus:
    """The static prediction (vet's and doctor's code) for ``record`` on ``release``."""
    disabled = frozenset(p.strip() for p in environ.get(DISABLE_ENV, "").split(",") if p.strip())
    with looking_in(release.lookup()):
        return predict(record, disabled, environ)


def warm_modules(records: Sequence[PatchRecord], release: Release) -> list[str]:
    """Third-party modules the targets import at their top level (imported once, before the jobs fork)."""
    own = {p.name for p in release.root.iterdir() if p.is_dir()} | {"verl_ascend_ext"}
    found: dict[str, None] = {}
    with looking_in(release.lookup()):
        files = [find_module_file(r.module) for r in records]
    for path in files:
        if path is None:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except SyntaxError:
            continue
        for node in tree.body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            for name in names:
                if name.split(".")[0] not in own and name.split(".")[0] not in sys.stdlib_module_names:
                    found.setdefault(name)
    return list(found)


def _boot_for(release: Release, mode: str) -> str:
    if release.distribution == "verl" and mode == "real":
        return "verl"  # verl's own plugin discovery, at `import verl`
    if release.distribution in ("vllm", "vllm-ascend"):
        return "vllm"  # the vllm.general_plugins entry point, as every vLLM process boots it
    return "api"


def _run_jobs(jobs: list[dict[str, Any]], warm: list[str], work: Path, python: str,
              env: Mapping[str, str], path: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    spec = work / f"jobs-{os.getpid()}-{time.monotonic_ns()}.json"
    spec.write_text(json.dumps({"warm": warm, "jobs": jobs, "path": list(path)}), encoding="utf-8")
    proc = run_command([python, "-m", "verl_ascend_ext.testing.child", spec], dict(env), check=False, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"contract jobs failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return {r["id"]: r for r in last_json(proc.stdout)["results"]}  # type: ignore[index]


def _compare(failures: list[Failure], record: PatchRecord, release: Release, check: str,
             expected: PatchStatus, got: dict[str, Any]) -> None:
    status = IN_PROCESS.get(expected.status.value, expected.status.value)
    if got.get("status") != status:
        failures.append(Failure(record.id, release.name, check,
                                f"predicted {expected.status} ({expected.detail}), in-process {got.get('status')} "
                                f"({got.get('detail')})"))
    elif expected.status is Status.REFUSED and got.get("detail") != expected.detail:
        failures.append(Failure(record.id, release.name, check,
                                f"refusal messages differ:\n  predicted: {expected.detail}\n  in-process: "
                                f"{got.get('detail')}"))


def _check_state(failures: list[Failure], record: PatchRecord, release: Release, check: str,
                 expected: PatchStatus, state: dict[str, Any], layers: int) -> None:
    if not state.get("imported"):
        failures.append(Failure(record.id, release.name, check, "the target module was not imported"))
        return
    if state.get("layers") != layers:
        failures.append(Failure(record.id, release.name, check,
                                f"{state.get('layers')} layer(s) of our replacement on the target, expected {layers}"))
    if layers == 0 and state.get("markers") and expected.status is not Status.FIXED_UPSTREAM:
        failures.append(Failure(record.id, release.name, check, f"markers {state['markers']} set on untouched code"))
    live = state.get("where") or ""
    if expected.where and live and expected.where not in (live, live.rpartition(":")[0]):  # a file, or file:line
        failures.append(Failure(record.id, release.name, check,
                                f"the live definition is {live}, not the released {expected.where}"))


def check_contract(records: Sequence[PatchRecord], releases: Sequence[Release], work: str | os.PathLike[str] | None
                   = None, *, python: str = sys.executable, parallel: int = 2,
                   env: Mapping[str, str] | None = None,
                   prepare: Sequence[str] | Mapping[str, Sequence[str]] = (),
                   path: Sequence[str | os.PathLike[str]] = ()) -> ContractReport:
    """Check the contract of ``records`` on every one of ``releases`` that each concerns (module docstring).

    ``work``: scratch directory (mutant copies, job files, the jobs' status directory; default a temporary one).
    ``python``: the interpreter of the in-process half (this one). ``env``: extra variables for those processes
    (their status directory is ``work/status`` unless ``env`` names one: doctor, which each mutant job runs, reads
    the status directory, and the machine's own may hold any number of other jobs' records). ``prepare``:
    ``"module:function"`` called in each in-process job before the plugin boots, ``path`` added to ``sys.path``
    to find it (e.g. a test double of ``torch_npu`` for patch code that imports it on a machine without an NPU);
    a mapping gives them per distribution (``{"vllm-ascend": [...]}``: only that distribution's jobs call them).
    """
    started = time.monotonic()
    if work is None:
        with tempfile.TemporaryDirectory(prefix="verl-ascend-contract-") as tmp:
            return check_contract(records, releases, tmp, python=python, parallel=parallel, env=env,
                                  prepare=prepare, path=path)
    work = Path(work)
    env = {DIR_ENV: str(work / "status"), **(env or {})}
    calls = prepare if isinstance(prepare, Mapping) else {None: prepare}
    failures: list[Failure] = []
    halves: dict[str, list[str]] = {r.id: [] for r in records}
    per_release: list[tuple[Release, list[PatchRecord], list[dict[str, Any]], list[tuple]]] = []
    results: list[MutationResult] = []
    for release in releases:
        covered = [r for r in records if release.covers(r)]
        if not covered:
            continue
        mode = "real" if release.importable else "standin"
        preparing = [*calls.get(None, ()), *calls.get(release.distribution, ())]
        jobs: list[dict[str, Any]] = []
        involved = _with_dependencies(covered)
        environments = _environments(involved)
        for scenario, environ in environments.items():
            jobs.append({"id": scenario, "kind": "scenario", "mode": mode, "root": str(release.root),
                         "prepare": preparing,
                         "boot": _boot_for(release, mode), "env": environ, "records": [r.id for r in involved],
                         "again": scenario == "on"})
        per_release.append((release, covered, jobs, []))
        for record in covered:
            how = "real import" if release.importable else "released definitions in a stand-in module"
            halves[record.id].append(f"static + in-process ({how}): {release.name}")
    from verl_ascend_ext.runtime.registry import registry

    known_ids = [r.id for r in registry().records]
    # mutants: one per pattern, on the first release its shape decides
    deciding = {(r.id, rel.name): mutations.deciding_shape(r, rel) for rel, covered, _, _ in per_release
                for r in covered}
    for record in records:
        for pattern in mutations.patterns(record):
            home = next(((rel, jobs, pending) for rel, covered, jobs, pending in per_release
                         if record in covered and deciding[(record.id, rel.name)] == pattern.shape), None)
            if home is None:
                results.append(MutationResult(pattern.name, "-", "unexercised",
                                              f"no release here is decided by its shape ({pattern.shape})",
                                              pattern.reason))
                continue
            release, jobs, pending = home
            preparing = [*calls.get(None, ()), *calls.get(release.distribution, ())]
            found = mutations.mutant(pattern, release)
            if found is None:
                results.append(MutationResult(pattern.name, release.name, "unexercised",
                                              "no valid single edit of the released source breaks it",
                                              pattern.reason))
                continue
            number = len(pending)
            copy = link_copy(release, work / f"r{releases.index(release)}" / f"m{number}", Path(found.definition.path))
            written = mutations.write_mutant(found, release, copy)
            involved = _with_dependencies([record])
            others = [i for i in known_ids if i not in {r.id for r in involved}]
            # only this record (and those it serves or needs) on: another record of the same module cannot
            # refuse first and leave it pending
            environ = {**_environments(involved)["on"], DISABLE_ENV: ",".join(others)}
            before = predicted(record, release, environ)
            after = predicted(record, copy, environ)
            job = {"kind": "mutant", "root": str(copy.root), "env": environ, "records": [r.id for r in involved],
                   "prepare": preparing}
            jobs.append({**job, "id": f"m{number}", "mode": "standin", "boot": _boot_for(release, "standin")})
            if release.importable and after.status is Status.REFUSED and not any(j["id"].startswith("real-")
                                                                                 for j in jobs):
                # one refusal per importable release also through a real import of the mutated release
                jobs.append({**job, "id": f"real-m{number}", "mode": "real", "boot": _boot_for(release, "real")})
            pending.append((pattern, found, before, after, number, written, copy))

    # one interpreter per distribution and mode (releases of one distribution warm the same third-party modules)
    groups: dict[tuple[str, bool], list[int]] = {}
    for i, (release, *_rest) in enumerate(per_release):
        groups.setdefault((release.distribution, release.importable), []).append(i)

    def run(indices: list[int]) -> dict[int, dict[str, dict[str, Any]]]:
        jobs: list[dict[str, Any]] = []
        warm: dict[str, None] = {}
        for i in indices:
            release, covered, release_jobs, _ = per_release[i]
            if release.importable:
                warm.update(dict.fromkeys(warm_modules(covered, release)))
            warm.update(dict.fromkeys(call.partition(":")[0] for call in (*calls.get(None, ()),
                                                                          *calls.get(release.distribution, ()))))
            jobs += [{**job, "id": f"{i}/{job['id']}"} for job in release_jobs]
        out = _run_jobs(jobs, list(warm), work, python, env, [str(p) for p in path])
        split: dict[int, dict[str, dict[str, Any]]] = {i: {} for i in indices}
        for key, result in out.items():
            index, _, job_id = key.partition("/")
            split[int(index)][job_id] = result
        return split

    outputs: dict[int, dict[str, dict[str, Any]]] = {}
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:  # real imports (the slow ones) start first
        for part in pool.map(run, sorted(groups.values(), key=lambda g: not per_release[g[0]][0].importable)):
            outputs.update(part)
    for i, (release, covered, _jobs, pending) in enumerate(per_release):
        out = outputs[i]
        involved = _with_dependencies(covered)
        environments = _environments(involved)
        for scenario in SCENARIOS:
            got = out[scenario]
            if "crash" in got:
                failures.append(Failure("*", release.name, scenario, got["crash"]))
                continue
            for record in covered:
                expected = predicted(record, release, environments[scenario])
                state = got["records"][record.id]
                _compare(failures, record, release, f"{scenario}: predicted == in-process", expected, state)
                if scenario == "on":
                    layers = 1 if expected.status is Status.WILL_APPLY else 0
                    _check_state(failures, record, release, "on: one layer", expected, state, layers)
                    _check_state(failures, record, release, "on, booted and applied again: still one layer",
                                 expected, got["again"][record.id], layers)
                    _compare(failures, record, release, "on, booted and applied again", expected,
                             got["again"][record.id])
                elif expected.status.value in ("gate-off", "disabled"):
                    _check_state(failures, record, release, f"{scenario}: target untouched", expected, state, 0)
        for pattern, found, before, after, number, written, _copy in pending:
            record = pattern.record
            results.append(judge(found, release, before, after, written))
            for job_id in (f"m{number}", f"real-m{number}"):
                got = out.get(job_id)
                if got is None:
                    continue
                if "crash" in got:
                    failures.append(Failure(record.id, release.name, f"mutant {job_id}", got["crash"]))
                    continue
                how = "real import" if job_id.startswith("real-") else "stand-in"
                row = got["doctor"]["records"][record.id]
                row = {"status": IN_PROCESS.get(row["status"], row["status"]), "detail": row["detail"]}
                _compare(failures, record, release, f"mutant, doctor ({pattern.name})", after, row)
                _compare(failures, record, release, f"mutant, in-process, {how} ({pattern.name})", after,
                         got["live"]["records"][record.id])
                if job_id.startswith("real-"):
                    halves[record.id].append(f"refusal of a mutant also through a real import: {release.name}")
    failures += unexplained(results)
    return ContractReport(failures, results, halves, time.monotonic() - started)


def judge(found: mutations.Mutant, release: Release, before: PatchStatus, after: PatchStatus,
          written: Path | str) -> MutationResult:
    """Killed: the mutant's verdict differs and no other pattern of the shape changed; else dead."""
    changed = after.status is not before.status
    outcome = "killed" if changed and len(found.flips) == 1 else "dead"
    why = (f"{before.status} -> {after.status} ({written})" if changed
           else f"verdict stays {after.status} ({written})")
    if len(found.flips) > 1:
        why += f"; every edit that breaks it also changes {', '.join(found.flips[1:])}"
    return MutationResult(found.pattern.name, release.name, outcome, why, found.pattern.reason)


def unexplained(results: Iterable[MutationResult]) -> list[Failure]:
    """A failure for each dead or unexercised pattern whose fingerprint gives no reason to keep it."""
    return [Failure(m.pattern.split(" ", 1)[0], m.release, "mutation",
                    f"{m.outcome} pattern with no reason: {m.pattern}: {m.detail}. Make the pattern tell code apart, "
                    "or keep it with Fingerprint(kept=((pattern, why),))")
            for m in results if m.outcome != "killed" and not m.reason]


def cached_releases(cache: str | os.PathLike[str], work: str | os.PathLike[str],
                    distributions: Iterable[str] | None = None) -> list[Release]:
    """The releases the setup caches (``scripts/fetch_*.sh``) under ``cache``, one per (distribution, version).

    verl wheels (importable: unpacked whole), vLLM and vLLM-Ascend wheels (repacked to the files vet reads),
    vLLM ``core.py`` trees of later releases, and the installed vLLM (importable). ``distributions`` narrows them.
    """
    from verl_ascend_ext.testing import releases as rel

    cache, work = Path(cache), Path(work)
    wanted = set(distributions) if distributions is not None else None
    out: dict[tuple[str, str], Release] = {}

    def keep(release: Release) -> None:
        if wanted is None or release.distribution in wanted:
            out.setdefault((release.distribution, release.version), release)

    for i, tree in enumerate(sorted((cache / "vllm-ascend-src").glob("*"))):
        if wanted is None or "vllm-ascend" in wanted:  # before the repacked wheel: it holds what patch code imports
            keep(rel.from_tree(tree, "vllm-ascend", tree.name, work / f"ascend-{i}",
                               label=f"vLLM-Ascend {tree.name} sources (scripts/fetch_vllm_ascend.sh)"))
    for i, artifact in enumerate(sorted((cache / "vet-artifacts").glob("*.whl"))):
        dist = artifact.name.split("-")[0].replace("_", "-")
        if wanted is not None and dist not in wanted:
            continue
        if dist == "vllm":  # the installed vLLM (scripts/fetch_vllm.sh) imports for real: it goes first
            keep(rel.installed_release("vllm", work / f"installed-{i}"))
        keep(rel.from_artifact(artifact, work / f"wheel-{i}", importable=dist == "verl"))
    for i, tree in enumerate(sorted((cache / "vllm-src").glob("*"))):
        if (wanted is None or "vllm" in wanted) and ("vllm", tree.name) not in out:
            keep(rel.from_tree(tree, "vllm", tree.name, work / f"tree-{i}", label=f"core.py of vLLM {tree.name}"))
    return sorted(out.values(), key=lambda r: (r.distribution, _version_key(r.version)))


def _version_key(version: str) -> tuple:
    from packaging.version import InvalidVersion, Version

    try:
        return (0, Version(version))
    except InvalidVersion:
        return (1, version)

