"""The flags several commands share, defined once so they are spelled, typed and defaulted alike.

Exit codes of every command (README, Commands): 0 done; 1 ran but the answer is a failure
(an infeasible rate, every scrape failed); 2 bad input (a flag, a file, a spec); 130 interrupted.
Under ``--json`` stdout carries only JSON: one object (most commands) or one object per line
(``observe``, ``run``, ``twin``: events as they happen); a bad input is reported once, as one
object ``{"error", "field", "exitCode"}`` on stderr (stdout stays empty).
"""

from __future__ import annotations

import argparse
import math
import sys

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130

QUANTILE_DEFAULT = 0.95
_SUFFIX = {"k": 10**3, "K": 2**10, "m": 10**6, "M": 2**20, "g": 10**9, "G": 2**30, "t": 10**12, "T": 2**40}


def human_int(text: str) -> int:
    """vLLM's human-readable integers: ``4096``, ``1k`` (10³), ``1K`` (2¹⁰), ``8G`` (2³⁰)."""
    s = str(text).strip()
    try:
        if s and s[-1] in _SUFFIX:
            return int(float(s[:-1]) * _SUFFIX[s[-1]])
        return int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer like 4096, 32k or 8G, got {text!r}") from None


def quantile(text: str) -> float:
    """An SLO quantile in (0, 1); 50/95/99 are read as percentiles."""
    try:
        q = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a quantile in (0, 1), got {text!r}") from None
    if q in (50, 90, 95, 99):
        q /= 100
    if not (math.isfinite(q) and 0 < q < 1):
        raise argparse.ArgumentTypeError(f"expected a quantile in (0, 1), got {text!r}")
    return q


def add_json(parser: argparse.ArgumentParser, what: str = "print one JSON object") -> None:
    parser.add_argument("--json", action="store_true", help=what)


def add_quantile(parser, default: float = QUANTILE_DEFAULT) -> None:
    parser.add_argument("--quantile", type=quantile, default=default, metavar="Q",
                        help=f"SLO quantile, any in (0, 1) (default {default:g})")


class _DeprecatedAlias(argparse.Action):
    """A former spelling: stores into the new flag's dest and says so on stderr."""

    def __init__(self, option_strings, dest, new: str, **kw):
        self.new = new
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"kneecap: warning: {option_string} is deprecated, use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_slo(parser, *, ttft: float | None = None, tpot: float | None = None, with_ttft: bool = True,
            old_tpot: tuple[str, ...] = ()) -> None:
    """--slo-ttft-s and --slo-tpot-s (time per output token: vLLM's inter-token latency); `old_tpot`
    are former spellings kept as hidden, warning aliases."""
    if with_ttft:
        parser.add_argument("--slo-ttft-s", type=float, default=ttft, metavar="S",
                            help="time-to-first-token SLO, seconds" + (f" (default {ttft:g})" if ttft else ""))
    parser.add_argument("--slo-tpot-s", type=float, default=tpot, metavar="S",
                        help="time-per-output-token SLO, seconds" + (f" (default {tpot:g})" if tpot else ""))
    for old in old_tpot:
        parser.add_argument(old, dest="slo_tpot_s", type=float, action=_DeprecatedAlias, new="--slo-tpot-s")
