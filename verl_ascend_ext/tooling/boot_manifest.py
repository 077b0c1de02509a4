"""The boot manifest (``runtime/boot_manifest.py``), generated from the registry so that it cannot drift.

``render`` gives the module's text: this package's feature entry points, gates, settings, each record's id,
target, gate and ``observed``, and the import hooks by import path (``runtime.boot_plan.manifest_data``), in
registration order. ``verl-ascend boot-manifest`` prints it, ``--check`` exits 1 when the installed module
differs, ``--write`` replaces it (in a development install: the file is part of the package).
"""

from __future__ import annotations

from pathlib import Path

from verl_ascend_ext.runtime import boot_manifest, boot_plan
from verl_ascend_ext.runtime.registry import registry

HEADER = '''"""This package's own feature declarations as the boot needs them (``runtime.boot_plan``).

Generated from the registry by `verl-ascend boot-manifest --write`; do not edit by hand
(``tests/test_boot_manifest.py`` fails when it is stale, and a process that booted with a stale one stops at the
first import of a target).
"""

DISTRIBUTION = {distribution!r}
'''

COMMENTS = {
    "FEATURES": "# (entry-point name, module) of the verl_ascend_ext.features group, sorted",
    "GATES": "# (variable, default)",
    "SETTINGS": "# (variable, default, parser module:name, unit)",
    "RECORDS": "# (patch id, target, gate variable, observed)",
    "IMPORT_HOOKS": "# (module, hook module:name)",
}


def render() -> str:
    lines = [HEADER.format(distribution=boot_manifest.DISTRIBUTION)]
    for name, rows in boot_plan.manifest_data(registry()).items():
        lines += [COMMENTS[name], f"{name} = (", *(f"    {row!r}," for row in rows), ")", ""]
    return "\n".join(lines)


def path() -> Path:
    return Path(boot_manifest.__file__)


def check() -> list[str]:
    """What differs between the installed manifest and the declarations (empty when current)."""
    return boot_plan.stale(registry())
