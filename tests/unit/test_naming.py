from dataclasses import fields

import pytest

from kneecap.control.decide import Recommendation
from kneecap.naming import status_key
from kneecap.observe.observation import Observation


@pytest.mark.parametrize("name,key", [
    ("ttft_p95_s", "ttftP95Seconds"), ("prompt_tok_s", "promptTokensPerSecond"),
    ("request_rate_rps", "requestsPerSecond"), ("goodput_rps", "goodputRequestsPerSecond"),
    ("input_len_cv", "inputLengthCV"), ("kv_gib", "kvGiB"), ("released_gib", "releasedGiB"),
    ("pred_e2e_s", "predictedE2eSeconds"), ("t_end_s", "windowEndUnixSeconds"),
    ("max_num_seqs", "maxNumSeqs"), ("kv_cache_memory_bytes", "kvCacheMemoryBytes"),
])
def test_status_keys_follow_api_conventions(name, key):
    assert status_key(name) == key


def test_every_status_field_is_unique_and_unabbreviated():
    for cls in (Observation, Recommendation):
        keys = [status_key(f.name) for f in fields(cls)]
        assert len(set(keys)) == len(keys)
        for k in keys:  # no unit abbreviations survive (API conventions: durations as …Seconds)
            assert not k.endswith(("S", "Rps", "TokS", "Gib")) or k.endswith("Seconds"), k
