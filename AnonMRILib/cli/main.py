"""Entry point of the ``anonmri`` command.

Each sub-command lives in its own module of this package and exposes ``add_parser(subparsers)``,
which registers the command and sets ``func(args) -> int`` as its default. Errors a user can
cause (:class:`~AnonMRILib.errors.AnonMRIError`) are printed as one line on stderr with exit
status 2 and no traceback; nothing is written in that case.
"""
import argparse
import importlib
import sys
from typing import List, Optional

#: sub-command modules, in the order ``anonmri --help`` lists them
COMMAND_MODULES = (
    "info",
    "remodel",
    "lesion",
    "privacy_transform",
    "render",
    "deface",
    "score",
    "brainmask",
    "demo",
    "bids",
)


def build_parser() -> argparse.ArgumentParser:
    from AnonMRILib import __version__

    parser = argparse.ArgumentParser(
        prog="anonmri",
        description="De-identify MRI by remodeling the face while keeping the brain exactly.")
    parser.add_argument("--version", action="version", version=f"anonmri {__version__}")
    parser.add_argument("--quiet", dest="quiet_before_command", action="store_true",
                        help="no progress bar or messages (also accepted after the command)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(f"AnonMRILib.cli.{name}").add_parser(subparsers)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    from AnonMRILib.errors import AnonMRIError
    from AnonMRILib.progress import Cancelled

    parser = build_parser()
    args = parser.parse_args(argv)
    args.quiet = bool(getattr(args, "quiet", False) or args.quiet_before_command)
    try:
        return int(args.func(args) or 0)
    except AnonMRIError as error:
        print(f"anonmri {args.command}: error: {error}", file=sys.stderr)
        return 2
    except (Cancelled, KeyboardInterrupt):
        print(f"anonmri {args.command}: cancelled; no partial output was written", file=sys.stderr)
        return 130
    except MemoryError:
        print(f"anonmri {args.command}: error: out of memory; try --device cpu or a smaller model size",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
