"""The ``verl-ascend`` command line: doctor, catalogue (and the subcommands features add)."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verl-ascend", description="Ascend NPU extensions for verl.")
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser("doctor", help="predict what the plugin will do on this install")
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    catalogue = sub.add_parser("catalogue", help="print the patch catalogue (docs/patches.md)")
    catalogue.add_argument("--check", metavar="FILE", help="exit 1 if FILE differs from the generated catalogue")
    from .recipes.cli import add_parser as add_recipe_parser

    add_recipe_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # parse_known_args: argparse loses what follows '--' inside a subcommand; `recipe check` takes it.
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "recipe":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "doctor":
        from .doctor import main as doctor_main

        return doctor_main(as_json=args.json)
    if args.command == "recipe":
        from .recipes.cli import run as recipe_run

        return recipe_run(args, extra)
    if args.command == "catalogue":
        from pathlib import Path

        from .catalogue import render

        text = render()
        if args.check:
            if Path(args.check).read_text(encoding="utf-8") != text:
                print(f"{args.check} is stale: regenerate it with `verl-ascend catalogue > {args.check}`",
                      file=sys.stderr)
                return 1
            return 0
        sys.stdout.write(text)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
