"""Profile rows → arrays, filters, outliers and the workload CV estimate, on the real data."""

import numpy as np
import pytest

from kneecap.errors import InputError
from kneecap.model import profiles


@pytest.fixture(scope="module")
def rows(profiles_csv):
    return profiles.read_csv_text(profiles_csv.read_text())


def test_arrays_skip_outliers_and_filters_select(rows):
    data = profiles.profile_arrays(rows)
    n_out = sum(r["suspect_outlier"] == "True" for r in rows)
    assert n_out > 0 and len(data) == len(rows) - n_out
    assert set(data.models) == {"opt-1.3b", "opt-2.7b", "llama-2-7b"}
    assert np.all(data.throughput_tok_s > 0) and data.batch.shape == data.output_len.shape
    sel = profiles.filter_rows(rows, profiles.parse_where(["model=llama-2-7b", "source=background", "source=batching_results"]))
    assert sel and all(r["model"] == "llama-2-7b" and r["source"] in ("background", "batching_results") for r in sel)


def test_output_cv_from_kv_usage(rows):
    cv = profiles.estimate_output_cv(rows)
    assert cv["dummy_mean"] < 0.15  # fixed-length prompts
    assert 0.7 < cv["sharegpt"] < 1.1  # ShareGPT output lengths are heterogeneous
    per_row = profiles.apply_output_cv(rows[:3] + [{"output_cv": "0.5", "dataset": "sharegpt"}], cv)
    assert per_row[-1] == 0.5 and per_row[0] == cv[rows[0]["dataset"]]


def test_missing_column_and_bad_values_name_the_field():
    with pytest.raises(InputError) as e:
        profiles.profile_arrays([{"model": "opt-1.3b", "batch": "1", "input_len": "1", "output_len": "1"}])
    assert e.value.field == "throughput_tok_s"
    with pytest.raises(InputError) as e:
        profiles.profile_arrays([{"model": "opt-1.3b", "batch": "-1", "input_len": "1", "output_len": "1"}],
                                require_throughput=False)
    assert e.value.field == "batch" and "row 1" in str(e.value)
    with pytest.raises(InputError) as e:
        profiles.parse_where(["model"])
    assert e.value.field == "--where"
