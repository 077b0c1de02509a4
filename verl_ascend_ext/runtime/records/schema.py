"""The process record's shape, defined once: its fields, the roles, how a process ended, and the one factory.

A record is a JSON object a process writes about itself (``recorder``) and ``verl-ascend status`` reads
(``reader``). ``SCHEMA`` is the number written into each; it goes up whenever a field is added, removed or changes
meaning. The reader reads this schema, and the previous one by ``upgrade`` (the fields it lacks get their
defaults here, and the reader's notes say how many such records there were); any other number is named in the
notes with its count and the fix, never skipped silently.

Schema 1 (verl-ascend-ext up to 2026-12-03) grew without a bump: its records may lack ``ppid``, ``ranks``,
``ip``, ``actor_id``, ``errors`` and ``ended``, and carry ``dead_since`` (written by readers, which no longer
write). Schema 2 adds, per patch, ``acts`` (how often an ``acts_when`` record acted) and ``stood_down`` (the paths
on which its replacement ran without doing its work). Schema 3 adds ``job`` (the job a process belongs to: the
driver's id, carried to every process it starts and every Ray worker), ``seen_dead`` (deaths of other processes this
one noticed: who, when, how, so that a process that died without a word has a time of death) and ``teardown`` (written
by the process the job watch runs in, verl's trainer: when its ``fit`` ended; a death after it is the teardown's, not a
failure). Schema 4 adds ``sleeps`` (a rollout worker's device memory after each sleep: ``SLEEP_FIELDS``, the first and
the newest ``MAX_SLEEPS - 1`` of them, written by the ``sleep-memory`` records and read into verl's metrics).
Schema 5 adds ``woke_s`` to each sleep entry (the seconds of the rank's wake-ups since its previous sleep, timed by
the ``wake-up-time`` records; null where none was timed); the entries of older records lack it (read as null).
Only the standard library and ``patching.outcomes`` (itself standard library only) are imported: every process
loads this module at boot.
"""

from __future__ import annotations

from typing import Any

from verl_ascend_ext.patching.outcomes import Observed

SCHEMA = 6
OLDER = (1, 2, 3, 4, 5)  # the schemas ``upgrade`` reads (the fields they lack take their defaults)

# Roles (``role``); a Ray actor's class is kept beside it (``actor_class``).
DRIVER, RAY_WORKER, VLLM_FRONTEND, ENGINE_CORE, VLLM_WORKER, OTHER = (
    "driver", "ray-worker", "vllm-frontend", "engine-core", "vllm-worker", "other")
ROLES = (DRIVER, RAY_WORKER, VLLM_FRONTEND, ENGINE_CORE, VLLM_WORKER, OTHER)

# How a process ended (``ended["how"]``); a process that ended without any of these has ``ended`` None.
EXIT, EXCEPTION, SIGNAL = "exit", "exception", "signal"
ENDINGS = (EXIT, EXCEPTION, SIGNAL)

# How a patch's runs are seen (``patches[id]["observed"]``): ``patching.outcomes.Observed``'s values, named there.
EAGER, ACTS, TRACED, IMPORT = (Observed.EAGER.value, Observed.ACTS.value, Observed.TRACED.value,
                               Observed.IMPORT.value)

LOCAL_NAMESPACE = "local"  # every process that is not a Ray worker (a Ray worker's namespace: its session)

# field -> default (a callable makes a fresh mutable default); the order is the order written.
FIELDS: dict[str, Any] = {
    "schema": SCHEMA,
    "host": "",
    "pid": 0,
    "ppid": None,  # which process started it (a vLLM server's EngineCore)
    "proc_start": None,  # start time in clock ticks since boot: with the pid, the process's identity
    "started": 0.0,
    "updated": 0.0,  # when the record was last written
    "role": OTHER,
    "actor_class": None,
    "title": "",
    "ranks": dict,  # rank / local_rank / world_size (verl's workers), dp_rank (a vLLM data-parallel engine core)
    "ip": None,  # the node address Ray knows a worker by
    "actor_id": None,  # the Ray actor a worker runs (what Ray's errors name)
    "loaded_by": list,
    "namespace": LOCAL_NAMESPACE,
    "versions": dict,
    "gates": dict,
    "disable": "",
    "plugin_env": dict,
    "patches": dict,  # patch id -> PATCH_FIELDS
    "errors": list,  # ERROR_FIELDS, each when it was raised
    "ended": None,  # ENDED_FIELDS, or None: running, or ended without a word
    "job": None,  # the job's id (``JOB_ENV``): the driver's record name; None for a process of no job
    "seen_dead": list,  # NOTICE_FIELDS: deaths of other processes this one noticed
    "teardown": None,  # the trainer's process: when its fit ended (the job's teardown began), or None
    "sleeps": list,  # SLEEP_FIELDS: a rollout worker's memory after each of its sleeps (the first, then the newest)
    "stuck": None,  # STUCK_FIELDS: the trainer's process found the job stuck (absent before schema 6), or None
}
# ``at``: when; ``idle_s`` / ``bound_s``: seconds without progress and the bound; ``steps``: the trainer's count;
# ``phase``: where the trainer waited; ``groups``: the job's processes by where they waited (``records.stacks.group``);
# ``apart``: the processes the rest wait on (``features.job_watch.stuck.apart``), each ``label: where``; ``mode``
STUCK_FIELDS = ("at", "idle_s", "bound_s", "steps", "phase", "groups", "apart", "mode")
PATCH_FIELDS: dict[str, Any] = {
    "status": "pending", "detail": "", "where": "", "target": "", "imported": False, "observed": EAGER,
    "exercised": None,  # eager / acts: whether it ran (acted) in this process; None where that cannot be seen
    "acts": None,  # acts: in how many calls it acted (None for the other kinds)
    "stood_down": list,  # the paths on which it ran without doing its work (``acts_when`` records), first seen first
}
ERROR_FIELDS = ("at", "by", "type", "message", "where")
ENDED_FIELDS = ("at", "how", "code", "signal", "error")
NOTICE_FIELDS = ("host", "pid", "proc_start", "role", "at", "how", "by")  # ``how``: what was seen ("no end recorded")
# ``n``: the sleep's number in the process (1 = its first); bytes of the device (``meter``: how they were read) in use
# after the sleep, freed by it, and the device's total; ``cleanup``: vLLM-Ascend's extra clean-up on (None: no such
# setting); ``woke_s``: seconds of the wake-ups since the previous sleep (None: none timed; absent before schema 5)
SLEEP_FIELDS = ("n", "at", "level", "in_use", "freed", "total", "meter", "cleanup", "woke_s")
MAX_SLEEPS = 256
SLEEP_TYPES = {"n": (int,), "in_use": (int,), "freed": (int,), "total": (int,), "meter": (str,),
               "woke_s": (int, float, type(None))}  # what readers use (a type None allows: the field may be absent)
JOB_ENV = "VERL_ASCEND_EXT_JOB"
# field -> the JSON types its value may have (a reader names a record whose fields are of other types)
TYPES: dict[str, tuple[type, ...]] = {
    "host": (str,), "pid": (int,), "ppid": (int, type(None)), "proc_start": (int, type(None)),
    "started": (int, float), "updated": (int, float), "role": (str,), "actor_class": (str, type(None)),
    "ranks": (dict,), "actor_id": (str, type(None)), "loaded_by": (list,), "namespace": (str,), "gates": (dict,),
    "patches": (dict,), "errors": (list,), "ended": (dict, type(None)), "job": (str, type(None)),
    "seen_dead": (list,), "teardown": (int, float, type(None)), "sleeps": (list,), "stuck": (dict, type(None)),
}
# Fields a reader adds to what it read (never written by a process).
READ_FIELDS = ("file", "alive")


class SchemaError(ValueError):
    """A record that is not one this schema knows how to read."""


class MalformedRecord(SchemaError):
    """A record of a known schema whose fields do not have the schema's types (the reason names the field)."""


def _default(value: Any) -> Any:
    return value() if callable(value) else value


def new_record(**fields: Any) -> dict[str, Any]:
    """A record with every field of the schema: ``fields`` over the defaults (the recorder and the tests build
    records through this; an unknown field name is an error, so a typo cannot invent a field)."""
    unknown = sorted(set(fields) - set(FIELDS) - set(READ_FIELDS))
    if unknown:
        raise SchemaError(f"not fields of a schema-{SCHEMA} record: {', '.join(unknown)} (known: {', '.join(FIELDS)})")
    record = {name: _default(default) for name, default in FIELDS.items()}
    record.update(fields)
    record["schema"] = SCHEMA
    record["patches"] = {pid: new_patch(**entry) for pid, entry in record["patches"].items()}
    return record


def new_patch(**fields: Any) -> dict[str, Any]:
    """One patch's entry of a record, ``fields`` over the defaults."""
    unknown = sorted(set(fields) - set(PATCH_FIELDS))
    if unknown:
        raise SchemaError(f"not fields of a patch entry: {', '.join(unknown)} (known: {', '.join(PATCH_FIELDS)})")
    return {**{name: _default(default) for name, default in PATCH_FIELDS.items()}, **fields}


def upgrade(record: Any) -> dict[str, Any]:
    """``record`` as a schema-``SCHEMA`` record: as it is when it has this schema, completed when it has the
    previous one (the fields it lacks take their defaults; ``dead_since`` is dropped); SchemaError otherwise."""
    if not isinstance(record, dict):
        raise MalformedRecord("not a JSON object")
    schema = record.get("schema")
    if schema != SCHEMA and schema not in OLDER:
        raise SchemaError(f"schema {schema!r}")
    if schema == SCHEMA:
        out = record
    else:
        out = {name: record[name] if name in record else _default(default) for name, default in FIELDS.items()}
        out["schema"] = SCHEMA
        if isinstance(out["patches"], dict):
            out["patches"] = {pid: {name: entry[name] if name in entry else _default(default)
                                    for name, default in PATCH_FIELDS.items()}
                              for pid, entry in out["patches"].items() if isinstance(entry, dict)}
    check_types(out)
    return out


def check_types(record: dict[str, Any]) -> None:
    """MalformedRecord naming the first field whose value is not of the schema's types (a hand-edited or truncated
    record that still parses as JSON), so that a reader names it rather than fails on it."""
    for name, types in TYPES.items():
        value = record.get(name, FIELDS[name]() if callable(FIELDS[name]) else FIELDS[name])
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise MalformedRecord(f"field {name!r} is {type(value).__name__} {value!r:.40}, not "
                                  f"{' or '.join('null' if t is type(None) else t.__name__ for t in types)}")
    for name, fields in (("errors", ERROR_FIELDS), ("seen_dead", NOTICE_FIELDS), ("sleeps", SLEEP_FIELDS)):
        if not all(isinstance(entry, dict) for entry in record.get(name) or []):
            raise MalformedRecord(f"field {name!r} holds an entry that is not an object (each has {', '.join(fields)})")
    for entry in record.get("sleeps") or []:
        for name, types in SLEEP_TYPES.items():
            if not isinstance(entry.get(name), types) or isinstance(entry.get(name), bool):
                raise MalformedRecord(f"field 'sleeps' holds an entry whose {name!r} is not "
                                      f"{' or '.join('null' if t is type(None) else t.__name__ for t in types)}")
    if not all(isinstance(entry, dict) for entry in (record.get("patches") or {}).values()):
        raise MalformedRecord("field 'patches' holds an entry that is not an object")
