"""Run a kneecap subcommand in-process, as the shell would: (exit code, stdout, stderr)."""

from __future__ import annotations


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """``kneecap ARGV...`` through ``kneecap.cli.main``; argparse's SystemExit becomes its code."""
    from kneecap.cli import main

    try:
        rc = main(list(argv))
    except SystemExit as exc:
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err
