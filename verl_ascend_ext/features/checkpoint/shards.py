"""Read a safetensors checkpoint directory from its headers only: per-shard integrity and the tensor inventory.

Each shard is opened with the ``safetensors`` library (``safe_open(..., framework="numpy")``: no torch),
which memory-maps the file and validates the header before anything else: the header lies inside the
file, every tensor's byte range lies inside the data section, its size is dtype size x product of
shape, the ranges neither overlap nor leave gaps and end exactly at the end of the file. Names, dtypes
and shapes come from the library too; tensor data is never read. Directory-level checks (index against
shards, a tensor in two shards, stray shards) are done here.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

INDEX = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_SHOWN = 5

# Bits per element of every safetensors dtype (sub-byte float formats are packed).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}


Tensor = tuple[str, tuple[int, ...]]  # (dtype, shape) as the shard's header declares it; plain tuples: 1e5 of them


def describe(tensor: Tensor) -> str:
    """``BF16[6144, 2048]``."""
    return f"{tensor[0]}[{', '.join(map(str, tensor[1]))}]"


class ShardError(Exception):
    """A shard the safetensors library refuses; the message names the file and says what is wrong."""


def read_shard(path: Path, interned: dict[Tensor, Tensor] | None = None) -> dict[str, Tensor]:
    """``{name: (dtype, shape)}`` of one shard, validated by the safetensors library; raise ShardError if refused.

    ``interned``: one shared tuple per distinct (dtype, shape) (a few dozen in a model of 1e5 tensors),
    which keeps memory and time down.
    """
    same = (interned if interned is not None else {}).setdefault
    try:
        with safe_open(str(path), framework="numpy") as f:
            out = {}
            for name in f.keys():  # noqa: SIM118  (safe_open is not iterable)
                tensor = f.get_slice(name)
                found = (tensor.get_dtype(), tuple(tensor.get_shape()))
                out[name] = same(found, found)
            return out
    except SafetensorError as err:
        try:
            message = diagnose(path, str(err))
        except OSError as gone:  # removed or made unreadable between the two opens
            message = f"{path} cannot be read: {gone}"
        raise ShardError(message) from None
    except OSError as err:
        raise ShardError(f"{path} cannot be read: {err}") from None


def diagnose(path: Path, library_message: str) -> str:
    """Say in plain words why the library refused ``path``.

    Hand-written on purpose: the library exposes no data offsets and its errors name neither the byte
    counts nor (for a size mismatch) the tensor. Runs only on a refused file, on its header only.
    """
    refused = f"{path} is not a valid safetensors file"
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return (f"{refused}: it has {size} byte(s), fewer than the 8-byte header length that starts every "
                    f"safetensors file (truncated or empty)")
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            return (f"{path} is not a complete safetensors file: its header length {length} exceeds the "
                    f"{size - 8} byte(s) after the length field (truncated, or not a safetensors file)")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except ValueError as err:
        return f"{refused}: its header ({length} bytes) is not valid JSON: {err} (corrupt header)"
    if not isinstance(header, dict):
        return f"{refused}: its header is JSON but not an object (corrupt header)"
    found = _layout_problem(header, size - 8 - length)
    return f"{refused}: {found}" if found else f"{refused}: {library_message}"


def _layout_problem(header: dict[str, Any], data_size: int) -> str | None:
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        except (TypeError, KeyError, ValueError):
            return f"the header entry of tensor {name!r} lacks dtype, shape or a [start, end] data_offsets pair"
        if dtype not in DTYPE_BITS:
            return f"tensor {name!r} has dtype {dtype!r}, which safetensors does not know"
        if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
                or not all(isinstance(o, int) for o in (start, end))):
            return f"tensor {name!r} has a malformed shape {shape!r} or data_offsets {[start, end]!r}"
        need = DTYPE_BITS[dtype] * math.prod(shape) / 8
        if end - start != need:
            return (f"tensor {name!r} is {dtype}{list(shape)}, which needs {need:g} bytes, but its data_offsets "
                    f"[{start}, {end}] span {end - start}")
        spans.append((start, end, name))
    spans.sort()
    covered, previous = 0, None
    for start, end, name in spans:
        if start < covered:
            return f"tensors {previous!r} and {name!r} overlap (bytes {start}..{covered} of the data section)"
        if start > covered:
            return f"bytes {covered}..{start} of the data section belong to no tensor (gap before {name!r})"
        covered, previous = end, name
    if covered > data_size:
        return (f"it is truncated: its header describes {covered} bytes of tensor data but the file holds only "
                f"{data_size} (tensor {previous!r} ends past the end of the file; a writer killed mid-save?)")
    if covered < data_size:
        return f"it has {data_size - covered} byte(s) after the last tensor's data that no tensor describes"
    return None


@dataclass
class Inventory:
    """What a checkpoint directory holds, read from its headers, and what is wrong with it."""

    directory: Path
    tensors: dict[str, Tensor] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)  # tensor name -> the shard file holding it
    shards: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    stray_shards: list[str] = field(default_factory=list)
    unreadable: set[str] = field(default_factory=set)  # names the index puts in an absent or refused shard
    index: Path | None = None


class CheckpointInputError(Exception):
    """A directory that cannot be checked at all (absent, empty); the message names it."""


def read_checkpoint(directory: Path, role: str) -> Inventory:
    """Read every shard of ``directory`` (the ones its index names, else every ``*.safetensors``).

    ``role`` ("export", "reference") only words the messages. Problems are collected, not raised; a
    directory with nothing to read raises CheckpointInputError.
    """
    if not directory.is_dir():
        raise CheckpointInputError(f"the {role} {directory} is not a directory (pass the directory that holds the "
                                   f"*.safetensors files and {INDEX})")
    present = sorted(p.name for p in directory.glob("*.safetensors"))
    inventory = Inventory(directory=directory)
    index = directory / INDEX
    weight_map = _weight_map(index, inventory) if index.is_file() else None
    if weight_map is None and not present:
        raise CheckpointInputError(
            f"the {role} {directory} holds no *.safetensors file and no {INDEX}: nothing to check "
            f"(wrong directory, or the save wrote nothing)")
    if weight_map is None:
        names = present
    else:
        inventory.index = index
        names = sorted(set(weight_map.values()))
        inventory.stray_shards = sorted(set(present) - set(names))
    interned: dict[Tensor, Tensor] = {}
    for shard in names:
        path = directory / shard
        if weight_map is not None and not path.is_file():
            indexed = [n for n, f in weight_map.items() if f == shard]
            inventory.problems.append(f"{path} is named by {index} (for {len(indexed)} tensor(s)) but does not "
                                      f"exist (or is not a file)")
            inventory.unreadable.update(indexed)
            continue
        try:
            held = read_shard(path, interned)
        except ShardError as err:
            inventory.problems.append(str(err))
            inventory.unreadable.update(n for n, f in (weight_map or {}).items() if f == shard)
            continue
        inventory.shards.append(shard)
        twice = held.keys() & inventory.where.keys()
        if twice:
            shown = [f"{name} (also in {inventory.where[name]})" for name in sorted(twice)]
            inventory.problems.append(f"{path} holds {len(twice)} tensor(s) already in another shard: {_show(shown)}")
            for name in twice:
                del held[name]  # the first shard's copy stands
        inventory.tensors.update(held)
        inventory.where.update(dict.fromkeys(held, shard))
    if weight_map is not None:
        _index_agrees(inventory, weight_map)
    return inventory


def _weight_map(index: Path, inventory: Inventory) -> dict[str, str] | None:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        inventory.problems.append(f"{index} is not a readable safetensors index (needs a 'weight_map'): {err!r}; "
                                  f"every *.safetensors file of the directory was read instead")
        return None
    if not isinstance(weight_map, dict) or not set(map(type, weight_map.values())) <= {str}:
        inventory.problems.append(f"{index}: 'weight_map' is not an object of tensor name -> file name; every "
                                  f"*.safetensors file of the directory was read instead")
        return None
    return weight_map


def _index_agrees(inventory: Inventory, weight_map: dict[str, str]) -> None:
    readable, where = set(inventory.shards), inventory.where
    if where == weight_map:
        return  # the common case, decided in C: every indexed name is in its shard and nothing else is anywhere
    elsewhere: dict[str, list[str]] = {}
    for name in [n for n, f in weight_map.items() if f in readable and where.get(n) != f]:
        held = where.get(name)
        elsewhere.setdefault(weight_map[name], []).append(name if held is None else f"{name} (found in {held})")
    for shard, names in sorted(elsewhere.items()):
        inventory.problems.append(f"{inventory.index} names {len(names)} tensor(s) in {inventory.directory / shard} "
                                  f"that it does not hold: {_show(names)}")
    unindexed = sorted(where.keys() - weight_map.keys())
    if unindexed:
        inventory.problems.append(f"{len(unindexed)} tensor(s) in the shards are not in {inventory.index} (loaders "
                                  f"that follow the index never see them): {_show(unindexed)}")
        for name in unindexed:
            del inventory.tensors[name], where[name]


def _show(items: list[str]) -> str:
    more = f" (+{len(items) - _SHOWN} more)" if len(items) > _SHOWN else ""
    return ", ".join(items[:_SHOWN]) + more

