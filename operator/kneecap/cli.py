"""`kneecap` command line: one subcommand per module in ``kneecap.commands``.

Each command module exposes ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``. Modules are imported lazily so ``kneecap fit`` does not pay
for kopf or aiohttp. Exit codes and ``--json`` output: ``kneecap.commands.common``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys

from kneecap import __version__
from kneecap.commands.common import EXIT_BAD_INPUT, EXIT_INTERRUPTED
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
    "pack": "pack",
}

def print_error(message: str, field: str | None, as_json: bool, prog: str = "kneecap") -> None:
    """One report of a bad input on stderr: a JSON object under --json, else a line."""
    if as_json:
        print(json.dumps({"error": message, "field": field, "exitCode": EXIT_BAD_INPUT}), file=sys.stderr)
    else:
        print(f"{prog}: error: {message}", file=sys.stderr)


def help_text(action: argparse.Action) -> str:
    """An option's help with its default when it has one and does not say it already."""
    text = action.help or ""
    default = action.default
    if default in (None, False, argparse.SUPPRESS) or isinstance(default, list) or "default" in text:
        return text
    shown = f"{default:g}" if isinstance(default, float) else str(default)
    return f"{text} (default {shown})".strip()


class _Help(argparse.HelpFormatter):
    def _get_help_string(self, action):
        return help_text(action).replace("%", "%%") if action.option_strings else super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    json_errors = False  # set by main when --json is on the command line

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # argparse already exits 2; keep its message short
        if not self.json_errors:
            self.print_usage(sys.stderr)
        flag = re.match(r"argument (?:[-\w]+/)?--?([-\w]+)", message)
        print_error(message, flag.group(1).replace("-", "_") if flag else None, self.json_errors, self.prog)
        self.exit(EXIT_BAD_INPUT)


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
    parser.add_argument("--version", action="version", version=f"kneecap {__version__}")
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
    _Parser.json_errors = "--json" in argv
    args = build_parser(only).parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except InputError as exc:
        print_error(str(exc), exc.field, getattr(args, "json", False), f"kneecap {args.command}")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
