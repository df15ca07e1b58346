"""One CLI vocabulary: every subcommand's --help, walked. Shared flags are spelled, typed and
defaulted alike; where a default is a command's own scenario (plan's SARA workload, the demo's),
its help says the value; every command has --json; exit codes are the documented ones."""

from __future__ import annotations

import argparse
import collections
import json
import re
from pathlib import Path

import pytest

from kneecap.cli import COMMANDS, build_parser, help_text, main
from kneecap.commands import common

ROOT = Path(__file__).resolve().parents[2]
# the same value in every command that has the flag
SAME_DEFAULT = {"--quantile": 0.95, "--seed": 0, "--json": False, "--burst-cv": 1.0, "--compress": 1.0,
                "--block-size": 16, "--gpu-memory-utilization": 0.9}
# former spellings: accepted with a warning, never shown
RETIRED = ("--slo-tbt-s", "--slo-tpot", "--slo-tbt")


def subparsers() -> dict[str, argparse.ArgumentParser]:
    p = build_parser()
    (sub,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def visible_options(parser) -> dict[str, argparse.Action]:
    return {o: a for a in parser._actions if a.help != argparse.SUPPRESS for o in a.option_strings
            if o.startswith("--") and o != "--help"}


def _type(action) -> str:
    return getattr(action.type, "__name__", "str") if action.type not in (None, str, Path) else "str"


def test_every_command_is_walked_and_has_json():
    parsers = subparsers()
    assert set(parsers) == set(COMMANDS)
    for name, parser in parsers.items():
        text = parser.format_help()
        assert "--json" in visible_options(parser), name
        for old in RETIRED:
            assert not re.search(re.escape(old) + r"\b(?!-)", text), (name, old)


def test_shared_flags_are_spelled_typed_and_defaulted_alike():
    by_flag: dict[str, dict[str, argparse.Action]] = collections.defaultdict(dict)
    for name, parser in subparsers().items():
        for flag, action in visible_options(parser).items():
            by_flag[flag][name] = action
            if "slo" in flag:  # SLO flags are seconds, spelled --slo-<metric>-s
                assert re.fullmatch(r"--slo-(ttft|tpot|e2e|kv)-s", flag), (name, flag)
    shared = {f: by for f, by in by_flag.items() if len(by) > 1}
    assert {"--quantile", "--slo-tpot-s", "--slo-ttft-s", "--gpu", "--model", "--seed"} <= set(shared)
    for flag, by in shared.items():
        types = {name: _type(a) for name, a in by.items()}
        assert len(set(types.values())) == 1, (flag, types)
        actions = {type(a).__name__ for a in by.values()}
        assert len(actions) == 1, (flag, actions)
        defaults = {name: a.default for name, a in by.items()}
        if flag in SAME_DEFAULT:
            assert set(defaults.values()) == {SAME_DEFAULT[flag]}, (flag, defaults)
            continue
        for name, action in by.items():  # a command's own default is shown in its help
            if action.default not in (None, False) and len(set(map(repr, defaults.values()))) > 1:
                shown = f"{action.default:g}" if isinstance(action.default, float) else str(action.default)
                assert shown in help_text(action), (name, flag, action.default, help_text(action))
                assert shown in "".join(subparsers()[name].format_help().split()), (name, flag)  # wrapped
    assert all(a.type is common.quantile for a in shared["--quantile"].values())


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_help_renders(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith(f"usage: kneecap {name}")


def test_errors_under_json_are_one_object_and_exit_2(capsys):
    """A bad input of any kind (argparse's, a value the command checks, a file) is reported once."""
    cases = [["memory", "--model", "llama-2-7b", "--gpu", "h100", "--max-num-seqs", "8", "--json"],
             ["plan", "--model", "llama-3.1-8b", "--budget-per-hour", "10", "--quantile", "2", "--json"],
             ["fit", "/nonexistent.csv", "--gpu", "h100-64gb", "-o", "x.json", "--json"]]
    fields, messages = [], []
    for argv in cases:
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code
        out, err = capsys.readouterr()
        assert rc == common.EXIT_BAD_INPUT and out == ""
        (line,) = err.splitlines()
        fields.append(json.loads(line)["field"])
        messages.append(json.loads(line)["error"])
        assert json.loads(line)["exitCode"] == 2
    assert fields == ["gpu", "quantile", "PROFILES.csv"]
    assert "ambiguous GPU 'h100': say which variant, one of h100-64gb, h100-80gb, h100-nvl, h100-pcie-80gb" in messages[0]


def test_readme_documents_the_exit_codes():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Commands"):]
    for code in ("`0`", "`1`", "`2`", "`130`"):
        assert code in section, code
    assert "--json" in section
