"""`kneecap load`: arrival process and length draws, the completions URL, and the CLI's checks of
its arguments and trace. Runs against a twin: tests/integration/test_load_twin.py."""

from __future__ import annotations

import numpy as np
import pytest

from kneecap.cli import main
from kneecap.errors import InputError
from kneecap.sim.loadgen import arrival_times, completions_url, sample_lengths


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0])
def test_lengths_have_the_asked_mean_and_cv(cv):
    x = sample_lengths(np.random.default_rng(1), 400_000, 300.0, cv)
    assert x.min() >= 1 and x.dtype.kind == "i"
    assert x.mean() == pytest.approx(300.0, rel=0.02)
    assert x.std() / x.mean() == pytest.approx(cv, rel=0.05)


def test_cv_zero_is_constant():
    assert set(sample_lengths(np.random.default_rng(0), 50, 127.6, 0.0)) == {128}


@pytest.mark.parametrize("burst_cv", [1.0, 2.5, 0.5])
def test_arrivals_have_the_rate_and_burstiness(burst_cv):
    t = arrival_times(np.random.default_rng(3), 50.0, 2000.0, burst_cv)
    gaps = np.diff(t)
    assert len(t) / 2000.0 == pytest.approx(50.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(burst_cv, rel=0.05)
    assert t.max() < 2000.0 and np.all(gaps >= 0)


def test_same_seed_same_arrivals():
    a = arrival_times(np.random.default_rng(7), 3.0, 10.0)
    b = arrival_times(np.random.default_rng(7), 3.0, 10.0)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("kwargs, field", [({"rate_rps": 0}, "rate"), ({"duration_s": -1}, "duration"),
                                           ({"burst_cv": 0}, "burst_cv")])
def test_bad_arguments_name_the_field(kwargs, field):
    args = {"rate_rps": 1.0, "duration_s": 1.0, "burst_cv": 1.0, **kwargs}
    with pytest.raises(InputError) as err:
        arrival_times(np.random.default_rng(0), args["rate_rps"], args["duration_s"], args["burst_cv"])
    assert err.value.field == field


def test_completions_url_forms():
    assert completions_url("http://h:1") == "http://h:1/v1/completions"
    assert completions_url("http://h:1/v1/") == "http://h:1/v1/completions"
    assert completions_url("http://h:1/v1/completions") == "http://h:1/v1/completions"


def test_cli_rejects_bad_rate_with_exit_2(capsys):
    assert main(["load", "http://127.0.0.1:9", "--rate", "-1", "--duration", "1", "--json"]) == 2
    assert '"field": "rate"' in capsys.readouterr().err


def test_cli_bad_trace_names_line_and_column_with_exit_2(tmp_path, capsys):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,input_tokens,output_tokens\n0,10,5\n0.5,-3,5\n")
    assert main(["load", "http://127.0.0.1:9", "--trace", str(p)]) == 2
    assert f"{p}:3 column input_tokens" in capsys.readouterr().err
    assert main(["load", "http://127.0.0.1:9", "--trace", str(p), "--rate", "3"]) == 2
    assert "--rate does not apply" in capsys.readouterr().err
    assert main(["load", "http://127.0.0.1:9", "--duration", "3"]) == 2
    assert "--rate is required" in capsys.readouterr().err
