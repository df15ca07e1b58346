import re
from dataclasses import fields

import pytest

from kneecap.control.decide import Recommendation
from kneecap.control.status import RingEntry
from kneecap.naming import status_key
from kneecap.observe.observation import Observation


@pytest.mark.parametrize("name,key", [
    ("ttft_p95_s", "ttftP95Seconds"), ("prompt_tok_s", "promptTokensPerSecond"),
    ("request_rate_rps", "requestsPerSecond"), ("goodput_rps", "goodputRequestsPerSecond"),
    ("input_len_cv", "inputLengthCoefficientOfVariation"), ("kv_bytes", "kvBytes"),
    ("released_bytes", "releasedBytes"), ("max_error_pct", "maxErrorPercent"),
    ("pred_e2e_s", "predictedE2eSeconds"), ("t_end_s", "windowEndUnixSeconds"),
    ("max_num_seqs", "maxNumSeqs"), ("kv_cache_memory_bytes", "kvCacheMemoryBytes"),
])
def test_status_keys_follow_api_conventions(name, key):
    assert status_key(name) == key


@pytest.mark.parametrize("name", ["kv_gib", "released_gib", "memory_mib"])
def test_a_quantity_not_in_base_units_has_no_status_key(name):
    with pytest.raises(ValueError, match="base units"):
        status_key(name)


def test_every_status_field_is_unique_and_unabbreviated():
    for cls in (Observation, Recommendation, RingEntry):
        keys = [status_key(f.name) for f in fields(cls)]
        assert len(set(keys)) == len(keys)
        for k in keys:  # no unit abbreviations survive (API conventions: durations as …Seconds, bytes)
            assert not k.endswith(("S", "Rps", "TokS", "Pct", "CV")) or k.endswith("Seconds"), k
            words = {w.lower() for w in re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", k)}
            assert not words & {"len", "pred", "pct", "mape", "cv", "std", "n"} and "GiB" not in k and "Gib" not in k, k
