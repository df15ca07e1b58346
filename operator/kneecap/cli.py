"""`kneecap` command line: one subcommand per module in ``kneecap.commands``.

Each command module exposes ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``. Modules are imported lazily so ``kneecap fit`` does not pay
for kopf or aiohttp.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from kneecap.errors import InputError

# name -> module under kneecap.commands
COMMANDS: dict[str, str] = {
    "run": "run",
    "demo": "demo",
    "fit": "fit",
    "predict": "predict",
    "advise": "advise",
    "memory": "memory",
    "simulate": "simulate",
    "plan": "plan",
    "observe": "observe",
    "twin": "twin",
    "load": "load",
    "replay": "replay",
}

EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse already exits 2; keep its message short
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def _available() -> dict[str, object]:
    modules = {}
    for name, mod in COMMANDS.items():
        try:
            modules[name] = importlib.import_module(f"kneecap.commands.{mod}")
        except ModuleNotFoundError as exc:
            if exc.name != f"kneecap.commands.{mod}":
                raise
    return modules


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="kneecap", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, module in _available().items():
        if only is not None and name != only:
            sub.add_parser(name, help=getattr(module, "HELP", ""))
            continue
        p = sub.add_parser(name, help=getattr(module, "HELP", ""), description=getattr(module, "HELP", ""))
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    only = argv[0] if argv and argv[0] in COMMANDS else None
    args = build_parser(only).parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except InputError as exc:
        if getattr(args, "json", False):
            print(json.dumps({"error": str(exc), "field": exc.field}), file=sys.stderr)
        print(f"kneecap {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
