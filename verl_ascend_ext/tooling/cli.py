"""The ``verl-ascend`` command line: doctor, status, stacks, vet, source, catalogue, boot-manifest, switches,
export-check, recipe, selftest, compare."""

from __future__ import annotations

import argparse
import os
import sys

SIGPIPE_EXIT = 141  # 128 + SIGPIPE, what a shell reports for `yes | head`


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verl-ascend", description="Ascend NPU extensions for verl.")
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser("doctor", help="predict what the plugin will do on this install")
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    doctor.add_argument("--ray", action="store_true",
                        help="run the doctor on every alive node of a running Ray cluster and print the differences")
    doctor.add_argument("--address", metavar="ADDR",
                        help="with --ray: the cluster's GCS address HOST:PORT (default: RAY_ADDRESS, else 'auto')")
    doctor.add_argument("--timeout", metavar="SECONDS", type=float, default=120.0,
                        help="with --ray: give up (exit 2) after this many seconds (default 120)")
    vet = sub.add_parser("vet", help="predict every patch's status on a wheel, sdist or source tree, not installed")
    vet.add_argument("artifacts", nargs="+", metavar="ARTIFACT",
                     help="a wheel, sdist or source directory of verl, vLLM or vLLM-Ascend (several: vetted together)")
    vet.add_argument("--json", action="store_true", help="print one JSON object")
    status = sub.add_parser("status", help="what really ran: the patch statuses every process recorded")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.add_argument("--dir", metavar="DIR",
                        help="status directory (default: VERL_ASCEND_EXT_STATUS_DIR, else a per-user temp dir)")
    status.add_argument("--ray", action="store_true", help="gather the records of every alive node of a Ray cluster")
    status.add_argument("--address", metavar="ADDR",
                        help="with --ray: the cluster's GCS address HOST:PORT (default: RAY_ADDRESS, else 'auto')")
    status.add_argument("--timeout", metavar="SECONDS", type=float, default=120.0,
                        help="with --ray: give up (exit 2) after this many seconds (default 120)")
    which = status.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true",
                       help="every job's records in the directory (default: one job, the newest driver's)")
    which.add_argument("--job", metavar="ID", help="the records of this job (its id: VERL_ASCEND_EXT_JOB, shown by "
                       "status)")
    status.add_argument("--prune", action="store_true",
                        help="remove this host's records of dead processes last written more than "
                             "VERL_ASCEND_EXT_STATUS_KEEP seconds ago (reading never removes anything)")
    stack = sub.add_parser("stacks", help="where every live process of a job waits (its Python stacks, grouped)")
    stack.add_argument("--json", action="store_true", help="print one JSON object")
    stack.add_argument("--dir", metavar="DIR", help="status directory (default: as status)")
    stack.add_argument("--ray", action="store_true", help="ask the processes of every alive node of a Ray cluster")
    stack.add_argument("--address", metavar="ADDR", help="with --ray: the cluster's GCS address HOST:PORT")
    stack.add_argument("--timeout", metavar="SECONDS", type=float, default=5.0,
                       help="seconds each process has to answer (default 5)")
    stack.add_argument("--job", metavar="ID", help="the job whose processes are asked (default: the newest driver's)")
    catalogue = sub.add_parser("catalogue", help="print the patch catalogue (docs/patches.md)")
    catalogue.add_argument("--check", metavar="FILE", help="exit 1 if FILE differs from the generated catalogue")
    manifest = sub.add_parser("boot-manifest", help="print the boot manifest (runtime/boot_manifest.py)")
    manifest.add_argument("--check", action="store_true", help="exit 1 if the installed manifest is stale")
    manifest.add_argument("--write", action="store_true", help="regenerate the installed manifest")
    from verl_ascend_ext.features.checkpoint.cli import add_parser as add_export_check_parser
    switches = sub.add_parser("switches", help="print docs/switches.md's table (declared gates and settings)")
    switches.add_argument("--check", metavar="FILE", help="exit 1 if FILE's generated block differs")
    switches.add_argument("--write", metavar="FILE", help="replace FILE's generated block")
    source = sub.add_parser("source", help="print the normalised source a fingerprint is matched against")
    source.add_argument("target", metavar="MODULE:QUALNAME", help="e.g. vllm.v1.engine.core:EngineCore.wake_up")
    source.add_argument("--from", dest="artifact", metavar="WHEEL|SDIST|DIR",
                        help="read a release that is not installed (as `vet` reads it) instead of the installed one")
    from verl_ascend_ext.tooling.compare.cli import add_parser as add_compare_parser
    from verl_ascend_ext.tooling.recipes.cli import add_parser as add_recipe_parser
    from verl_ascend_ext.tooling.selftest.cli import add_parser as add_selftest_parser

    add_compare_parser(sub)
    add_recipe_parser(sub)
    add_export_check_parser(sub)
    add_selftest_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line; a reader that closed the pipe early (``verl-ascend status | head``) ends it quietly, with
    the shell's status for a process ended by SIGPIPE."""
    try:
        code = run(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's own flush at exit
        return SIGPIPE_EXIT


def run(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # parse_known_args: argparse loses what follows '--' inside a subcommand; `recipe check` takes it.
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "recipe":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "doctor" and args.ray:
        from verl_ascend_ext.tooling.cluster.doctor_ray import main as doctor_ray_main

        return doctor_ray_main(address=args.address, as_json=args.json, timeout=args.timeout)
    if args.command == "doctor" and args.address:
        parser.error("--address needs --ray")
    if args.command == "doctor":
        from verl_ascend_ext.tooling.doctor import main as doctor_main

        return doctor_main(as_json=args.json)
    if args.command == "vet":
        from verl_ascend_ext.tooling.vet import main as vet_main

        return vet_main(args.artifacts, as_json=args.json)
    if args.command == "status":
        if args.address and not args.ray:
            parser.error("--address needs --ray")
        if args.prune and (args.ray or args.json):
            parser.error("--prune works on this host's directory: without --ray or --json")
        from verl_ascend_ext.tooling.status_cli import main as status_main

        return status_main(as_json=args.json, directory=args.dir, ray=args.ray, address=args.address,
                           timeout=args.timeout, prune=args.prune, job="*" if args.all else args.job)
    if args.command == "stacks":
        if args.address and not args.ray:
            parser.error("--address needs --ray")
        from verl_ascend_ext.tooling.stacks_cli import main as stacks_main

        return stacks_main(as_json=args.json, directory=args.dir, ray=args.ray, address=args.address,
                           timeout=args.timeout, job=args.job)
    if args.command == "recipe":
        from verl_ascend_ext.tooling.recipes.cli import run as recipe_run

        return recipe_run(args, extra)
    if args.command == "compare":
        from verl_ascend_ext.tooling.compare.cli import run as compare_run

        return compare_run(args)
    if args.command == "export-check":
        from verl_ascend_ext.features.checkpoint.cli import run as export_check_run

        return export_check_run(args)
    if args.command == "selftest":
        from verl_ascend_ext.tooling.selftest.cli import run as selftest_run

        return selftest_run(args)
    if args.command == "source":
        from verl_ascend_ext.tooling.show_source import show, show_from

        return show_from(args.target, args.artifact) if args.artifact else show(args.target)
    if args.command == "switches":
        from verl_ascend_ext.tooling import switches as table

        try:
            if args.check:
                problem = table.check(args.check)
                if problem:
                    print(problem, file=sys.stderr)
                    return 1
                return 0
            if args.write:
                table.write(args.write)
                return 0
        except (OSError, ValueError) as err:
            print(f"verl-ascend switches: {err}", file=sys.stderr)
            return 2
        sys.stdout.write(table.render() + "\n")
        return 0
    if args.command == "catalogue":
        from pathlib import Path

        from verl_ascend_ext.tooling.catalogue import render

        text = render()
        if args.check:
            if Path(args.check).read_text(encoding="utf-8") != text:
                print(f"{args.check} is stale: regenerate it with `verl-ascend catalogue > {args.check}`",
                      file=sys.stderr)
                return 1
            return 0
        sys.stdout.write(text)
        return 0
    if args.command == "boot-manifest":
        from verl_ascend_ext.tooling import boot_manifest

        if args.check:
            stale = boot_manifest.check()
            for line in stale:
                print(f"{boot_manifest.path()} is stale: {line}", file=sys.stderr)
            if stale:
                print("regenerate it with `verl-ascend boot-manifest --write`", file=sys.stderr)
            return 1 if stale else 0
        text = boot_manifest.render()
        if args.write:
            boot_manifest.path().write_text(text, encoding="utf-8")
            return 0
        sys.stdout.write(text)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
