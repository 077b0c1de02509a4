#!/usr/bin/env python3
"""Survey: every GLM-5.2 vLLM-Ascend record against each release and release-candidate tag of a vLLM-Ascend git repo.

    .venv/bin/python scripts/survey_vllm_ascend_tags.py GIT_DIR [--after v0.23.0] [--ref REF ...] [--json]

For each tag newer than ``--after`` (plus any ``--ref``, e.g. ``main``) the files vet reads for vLLM-Ascend
are taken with ``git show REF:PATH`` into a temporary tree with a METADATA naming the version, and the tree
is vetted (``verl_ascend_ext.tooling.vet``: doctor's prediction code). Prints the Markdown table of docs/glm52.md
(ref x record x status) followed by each refusal's reason, or JSON. Nothing of the repository is kept.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.version import InvalidVersion, Version

from verl_ascend_ext.runtime.registry import registry
from verl_ascend_ext.tooling.vet import module_files, vet

DISTRIBUTION = "vllm-ascend"


def git(git_dir: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "--git-dir", git_dir, *args], capture_output=True, text=True)


def release_tags(git_dir: str, after: str) -> list[str]:
    tags = []
    for tag in git(git_dir, "tag").stdout.split():
        try:
            version = Version(tag.removeprefix("v"))
        except InvalidVersion:
            continue
        if version > Version(after.removeprefix("v")) and not version.is_devrelease:
            tags.append(tag)
    return sorted(tags, key=lambda t: Version(t.removeprefix("v")))


def tree_of(git_dir: str, ref: str, dest: Path) -> str:
    """Write the files vet reads at ``ref`` under ``dest`` with a METADATA; return the version it names."""
    commit = git(git_dir, "rev-parse", "--short=10", f"{ref}^{{commit}}").stdout.strip()
    try:
        version = str(Version(ref.removeprefix("v")))
    except InvalidVersion:
        version = f"0+{re.sub(r'[^A-Za-z0-9]+', '.', ref)}.g{commit}"  # e.g. main: no release number
    for rel in module_files(DISTRIBUTION):
        shown = git(git_dir, "show", f"{ref}:{rel}")
        if shown.returncode == 0:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_text(shown.stdout, encoding="utf-8")
    (dest / "vllm_ascend").mkdir(exist_ok=True)
    info = dest / f"vllm_ascend-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm-ascend\nVersion: {version}\n")
    return f"{version} ({commit})"


def survey(git_dir: str, refs: list[str]) -> list[dict]:
    ids = [r.id for r in registry().records if r.distribution == DISTRIBUTION]
    rows = []
    for ref in refs:
        with tempfile.TemporaryDirectory(prefix="vllm-ascend-survey-") as tmp:
            label = tree_of(git_dir, ref, Path(tmp))
            report, _ = vet([tmp])
            patches = {p["id"]: p for p in report["patches"] if p["id"] in ids}
            for p in patches.values():
                p["detail"] = p["detail"].replace(tmp + "/", "")
                p["where"] = p["where"].replace(tmp + "/", "")
            rows.append({"ref": ref, "version": label, "patches": patches})
    return rows


def _cell(patch: dict) -> str:
    """The status; a ``covered`` one names the records that fix the path (short ids)."""
    covering = re.match(r"covered by (.*?): ", patch["detail"]) if patch["status"] == "covered" else None
    if covering is None:
        return patch["status"]
    names = [re.sub(r"^glm52-ascend-", "", part.split(" (")[0]) for part in covering.group(1).split(", ")]
    return f"covered by {', '.join(f'`{n}`' for n in names)}"


def markdown(rows: list[dict]) -> str:
    ids = list(rows[0]["patches"]) if rows else []
    short = [re.sub(r"^glm52-ascend-", "", i) for i in ids]
    out = ["| ref (version, commit) | " + " | ".join(f"`{s}`" for s in short) + " |",
           "|---" * (len(ids) + 1) + "|"]
    for row in rows:
        cells = [_cell(row["patches"][i]) for i in ids]
        out.append(f"| `{row['ref']}` {row['version']} | " + " | ".join(cells) + " |")
    out.append("")
    for row in rows:
        for i in ids:
            p = row["patches"][i]
            if p["status"] == "refused":
                reason = re.search(r"recognises \((.*)\)\. Installed", p["detail"], re.S)
                out.append(f"- `{row['ref']}` `{i}` ({p['where'] or 'not found'}): "
                           f"{reason.group(1) if reason else p['detail']}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("git_dir", help="a vLLM-Ascend git directory (bare or .git)")
    parser.add_argument("--after", default="v0.23.0", help="survey release tags newer than this (default v0.23.0)")
    parser.add_argument("--ref", action="append", default=[], help="also survey this ref (repeatable), e.g. main")
    parser.add_argument("--include-after", action="store_true", help="also survey the --after tag itself")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if git(args.git_dir, "rev-parse", "--git-dir").returncode != 0:
        print(f"{args.git_dir}: not a git directory; pass the repository's .git (or a bare clone)", file=sys.stderr)
        return 2
    refs = ([args.after] if args.include_after else []) + release_tags(args.git_dir, args.after) + args.ref
    rows = survey(args.git_dir, refs)
    print(json.dumps(rows, indent=2) if args.json else markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
