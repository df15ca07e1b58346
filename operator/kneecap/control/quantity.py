"""Kubernetes resource quantities (`1`, `500m`, `1Gi`, `1e3`) parsed and written in canonical form.

The API server stores every quantity as apimachinery's `resource.Quantity.String()`: `0.5` becomes
`500m`, `1024Mi` becomes `1Gi`, `1000m` becomes `1`. Comparing what the operator sends with what the
server stores therefore needs the same canonical form, implemented here after
k8s.io/apimachinery/pkg/api/resource (quantity.go: ParseQuantity, CanonicalizeBytes).
"""

from __future__ import annotations

import decimal
import re

from kneecap.errors import InputError

_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(|[numkMGTPE]|[KMGTPE]i|[eE][+-]?[0-9]+)$")
_DECIMAL_EXP = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {v: k for k, v in _DECIMAL_EXP.items()}
_BINARY_EXP = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_BINARY_SUFFIX = {v: k for k, v in _BINARY_EXP.items()}
_CTX = decimal.Context(prec=80)
_NANO = decimal.Decimal("1e-9")


def _split(value: str | int | float) -> tuple[decimal.Decimal, str]:
    """(exact value, format) where format is 'DecimalSI', 'BinarySI' or 'DecimalExponent'."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InputError("quantity", f"expected a quantity like 1, 500m, 2Gi, got {value!r}")
    text = str(value) if not isinstance(value, float) else repr(value)
    m = _QUANTITY.match(text.strip() if isinstance(value, str) else text)
    if not m:
        raise InputError("quantity", f"expected a quantity like 1, 500m, 2Gi, got {value!r}")
    number, suffix = decimal.Decimal(m.group(1)), m.group(2)
    if suffix in _BINARY_EXP:
        return _CTX.multiply(number, decimal.Decimal(2) ** _BINARY_EXP[suffix]), "BinarySI"
    if suffix[:1] in ("e", "E"):
        return _CTX.multiply(number, _CTX.power(10, int(suffix[1:]))), "DecimalExponent"
    return number.scaleb(_DECIMAL_EXP[suffix], _CTX), "DecimalSI"


def _round_nano(v: decimal.Decimal) -> decimal.Decimal:
    """Quantities keep 9 decimal places, rounding away from zero (inf.RoundUp in ParseQuantity)."""
    return v.quantize(_NANO, rounding=decimal.ROUND_UP, context=_CTX)


def parse_quantity(value: str | int | float) -> decimal.Decimal:
    """The exact value of a quantity ('1.5Gi' -> 1610612736, '500m' -> 0.5); InputError if malformed."""
    return _round_nano(_split(value)[0]).normalize(_CTX)


def _decimal_form(v: decimal.Decimal, fmt: str) -> str:
    """Integer mantissa, exponent the largest multiple of 3 that keeps it an integer (AsCanonicalBytes)."""
    sign, digits, exp = v.normalize(_CTX).as_tuple()
    mantissa = int("".join(map(str, digits)))
    shift = exp % 3  # lower the exponent to a multiple of 3
    mantissa, exp = mantissa * 10**shift, exp - shift
    number = ("-" if sign else "") + str(mantissa)
    if fmt == "DecimalExponent":
        return number + (f"e{exp}" if exp else "")
    if exp in _DECIMAL_SUFFIX:
        return number + _DECIMAL_SUFFIX[exp]
    return number + f"e{exp}"


def canonical_quantity(value: str | int | float) -> str:
    """What the API server stores for `value`: resource.Quantity's String() (CanonicalizeBytes)."""
    v, fmt = _split(value)
    v = _round_nano(v)
    if v == 0:
        return "0"
    if fmt == "BinarySI":
        if -1024 < v < 1024 or v != v.to_integral_value():
            fmt = "DecimalSI"  # small or fractional byte counts are written in decimal
        else:
            n, exp = abs(int(v)), 0
            while n % 1024 == 0 and exp < 60:
                n, exp = n // 1024, exp + 10
            return ("-" if v < 0 else "") + str(n) + _BINARY_SUFFIX.get(exp, "")
    return _decimal_form(v, fmt)
