"""Kubernetes resource quantities (``500m``, ``1Gi``, ``1e3``) as the API server stores them.

kube-apiserver parses every quantity and writes it back in canonical form (apimachinery
``resource.Quantity``: ``1`` -> ``"1"``, ``0.5`` -> ``"500m"``, ``1024Mi`` -> ``"1Gi"``,
``1000m`` -> ``"1"``). Comparing what the operator wants with what is live must compare these
forms, not the spellings.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, localcontext

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}  # powers of 1024
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {v: k for k, v in _DECIMAL.items()}
_BINARY_SUFFIX = {v: k for k, v in _BINARY.items()}
_RE = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE]([+-]?\d+))?$")
_NANO = Decimal("1e-9")


def _parse(value: str | int | float) -> tuple[Decimal, str]:
    """(value, format) with format "BinarySI", "DecimalSI" or "DecimalExponent"."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    text = repr(value) if isinstance(value, float) else str(value)
    text = text.strip()
    if isinstance(value, float) and "e" in text.lower():
        text = format(Decimal(text), "f")
    m = _RE.match(text)
    if m is None:
        raise ValueError(f"not a quantity: {value!r} (expected a number with an optional suffix "
                         "n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei or an exponent e<N>)")
    number, suffix, exponent = m.group(1), m.group(2) or "", m.group(3)
    with localcontext() as ctx:
        ctx.prec = 60
        d = Decimal(number)
        if exponent is not None:
            return d.scaleb(int(exponent)), "DecimalExponent"
        if suffix in _BINARY:
            return d * (Decimal(1024) ** _BINARY[suffix]), "BinarySI"
        return d.scaleb(_DECIMAL[suffix]), "DecimalSI"


def _round_up_to_nano(d: Decimal) -> Decimal:
    """apimachinery keeps at most nano precision and rounds away from zero's floor (up)."""
    with localcontext() as ctx:
        ctx.prec = 60
        return d.quantize(_NANO, rounding=ROUND_CEILING) if d.as_tuple().exponent < -9 else d


def parse_quantity(value: str | int | float) -> Decimal:
    """The exact value of a quantity; ValueError naming the text when it is not one."""
    return _round_up_to_nano(_parse(value)[0])


def _strip_factor(n: int, base: int) -> tuple[int, int]:
    times = 0
    while n != 0 and n % base == 0:
        n //= base
        times += 1
    return n, times


def canonical_quantity(value: str | int | float) -> str:
    """The form kube-apiserver writes back (apimachinery Quantity.CanonicalizeBytes)."""
    d, fmt = _parse(value)
    d = _round_up_to_nano(d)
    if d == 0:
        return "0"
    if fmt == "BinarySI":
        if -1024 < d < 1024 or d != d.to_integral_value():
            fmt = "DecimalSI"  # small or fractional binary values print as decimal
        else:
            amount, times = _strip_factor(int(d), 1024)
            return f"{amount}{_BINARY_SUFFIX.get(times, '') if times else ''}"
    # mantissa * 10^exponent, mantissa an integer, exponent a multiple of 3 (AsCanonicalBytes)
    sign, digits, exp = d.normalize().as_tuple()
    mantissa = int("".join(map(str, digits))) * (-1 if sign else 1)
    mantissa, more = _strip_factor(mantissa, 10)
    exp += more
    shift = exp % 3
    mantissa, exp = mantissa * 10**shift, exp - shift
    if fmt == "DecimalExponent":
        return f"{mantissa}" + (f"e{exp}" if exp else "")
    if exp > 18:  # beyond E: scale the mantissa up
        mantissa, exp = mantissa * 10 ** (exp - 18), 18
    return f"{mantissa}{_DECIMAL_SUFFIX[exp]}"
