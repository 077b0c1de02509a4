"""The ``verl-ascend recipe`` subcommand: list, show NAME, check NAME [-- OVERRIDES...].

Argument parsing only; Hydra and OmegaConf are imported when ``check`` runs, never for other commands.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from verl_ascend_ext.tooling.recipes import UnknownRecipeError, get_recipe, list_recipes
from verl_ascend_ext.tooling.recipes.manifest import ManifestError, load_manifest, summary


def add_parser(sub: argparse._SubParsersAction) -> None:
    recipe = sub.add_parser("recipe", help="list, show and check the shipped recipes")
    rsub = recipe.add_subparsers(dest="recipe_command", required=True)
    rsub.add_parser("list", help="the shipped recipes").add_argument("--json", action="store_true")
    show = rsub.add_parser("show", help="where a recipe is, what it pins and its overrides")
    show.add_argument("name")
    show.add_argument("--json", action="store_true")
    check = rsub.add_parser(
        "check", help="validate a recipe against this install before spending a cluster",
        description="Compose the recipe's overrides (and OVERRIDES) with Hydra against the installed verl's "
                    "config, compare installed packages with the manifest, check gates, plugin discovery, "
                    "R2 router replay support and the device; on an NPU node run `verl-ascend selftest` of the "
                    "patches the recipe turns on. Exit 1 on any blocking finding.")
    check.add_argument("name")
    check.add_argument("overrides", nargs="*", metavar="OVERRIDES",
                       help="extra Hydra overrides, after '--' (as passed to the run script)")
    check.add_argument("--no-device", action="store_true",
                       help="not a training node: report device-only packages and the device as not checked here")
    check.add_argument("--device", choices=("npu", "gpu"), help="target device (default: the recipe's first)")
    check.add_argument("--script", type=Path, help="check this copy of the run script instead of the shipped one")
    check.add_argument("--skip-verl-validate", action="store_true",
                       help="do not run verl's validate_config (saves importing verl, ~10 s)")
    check.add_argument("--skip-selftest", action="store_true",
                       help="on an NPU node, do not run `verl-ascend selftest` before launch (the report says so)")
    check.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace, extra: list[str] | None = None) -> int:
    extra = list(extra or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    if (extra and args.recipe_command != "check") or any(e.startswith("-") for e in extra):
        print(f"error: unrecognized arguments: {' '.join(extra)}", file=sys.stderr)
        return 2
    if args.recipe_command == "check":
        args.overrides = [*args.overrides, *extra]
    try:
        if args.recipe_command == "list":
            rows = []
            for recipe in list_recipes():
                manifest = load_manifest(recipe.manifest)
                rows.append({"name": recipe.name, "title": manifest.title, "devices": list(manifest.devices),
                             "directory": str(recipe.directory)})
            if args.json:
                print(json.dumps(rows, indent=2))
            else:
                width = max((len(row["name"]) for row in rows), default=0)
                for row in rows:
                    print(f"{row['name']:<{width}}  {row['title']} [{', '.join(row['devices'])}]")
            return 0
        if args.recipe_command == "show":
            return _show(args.name, args.json)
        import contextlib

        from verl_ascend_ext.tooling.recipes.check import format_report, run_check

        with contextlib.redirect_stdout(sys.stderr):  # whatever importing verl prints must not mix into --json
            report, code = run_check(args.name, user_overrides=args.overrides, no_device=args.no_device,
                                     device=args.device, script=args.script, validate=not args.skip_verl_validate,
                                     skip_selftest=args.skip_selftest)
        print(json.dumps(report, indent=2) if args.json else format_report(report))
        return code
    except (UnknownRecipeError, ManifestError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _show(name: str, as_json: bool) -> int:
    import os

    from verl_ascend_ext.tooling.recipes.compose import RecipeScriptError, script_overrides, split_config_name

    recipe = get_recipe(name)
    info = summary(load_manifest(recipe.manifest))
    info.update(directory=str(recipe.directory), script=str(recipe.script), readme=str(recipe.readme))
    try:
        qualified, info["overrides"] = script_overrides(recipe.script, os.environ)
        info["entry"], info["config_name"] = split_config_name(qualified)
    except RecipeScriptError as err:
        info["entry"], info["config_name"], info["overrides"], info["error"] = None, None, [], str(err)
    if as_json:
        print(json.dumps(info, indent=2))
        return 0 if "error" not in info else 1
    print(f"{name}: {info['title']}\n  run:      bash {info['script']}\n  readme:   {info['readme']}\n"
          f"  devices:  {', '.join(info['devices'])}\n  gates:    {', '.join(info['gates']) or 'none'} (exported)"
          f"; relies on: {', '.join(info['expects']) or 'none'}\n"
          f"  upstream: {info['upstream']}\n\nValidated with (manifest.toml):")
    width = max((len(p["name"]) for p in info["packages"]), default=0)
    for p in info["packages"]:
        pin = " ".join(x for x in (p["version"], p["repo"] and f"{p['repo']}@{p['branch']}", p["commit"]) if x)
        print(f"  {p['name']:<{width}} [{p['on']}] {pin}")
    print(f"\nOverrides (against {info['config_name']} of {info['entry']}, with this environment):")
    print("\n".join(f"  {o}" for o in info["overrides"]))
    if "error" in info:
        print(f"error: {info['error']}", file=sys.stderr)
        return 1
    return 0
