"""kneecap.control.quantity: Kubernetes resource quantities parsed and printed in canonical form."""

from __future__ import annotations

import decimal

import pytest

from kneecap.control.quantity import canonical_quantity, parse_quantity
from kneecap.errors import InputError


@pytest.mark.parametrize("given,canonical,value", [
    (1, "1", "1"), (0.5, "500m", "0.5"), ("1024Mi", "1Gi", "1073741824"), ("1000m", "1", "1"),
    ("1500m", "1500m", "1.5"), ("1.5Gi", "1536Mi", "1610612736"), ("0.5Gi", "512Mi", "536870912"),
    ("1.5Ki", "1536", "1536"), ("1000k", "1M", "1000000"), ("0.1m", "100u", "0.0001"),
    ("1e3", "1e3", "1000"), ("1.5e3", "1500", "1500"), ("0", "0", "0"), ("0Gi", "0", "0"),
    ("0.0000000001", "1n", "0.000000001"), ("100Gi", "100Gi", "107374182400"), ("-1", "-1", "-1"),
])
def test_canonical_quantity(given, canonical, value):
    assert canonical_quantity(given) == canonical
    assert parse_quantity(given) == decimal.Decimal(value)
    assert canonical_quantity(canonical) == canonical  # idempotent


@pytest.mark.parametrize("bad", ["two", "1K", "1.2.3", "", "1Gib", True, None, "--1"])
def test_malformed_quantities(bad):
    with pytest.raises(InputError):
        canonical_quantity(bad)
