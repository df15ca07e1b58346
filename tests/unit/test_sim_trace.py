"""The trace reader: the public traces' layouts as published, ordering, and errors that name the line and column."""

from __future__ import annotations

import numpy as np
import pytest

from kneecap.errors import InputError
from kneecap.sim.trace import compress, read_trace


def _write(tmp_path, text: str, name: str = "t.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_azure_format_fractions_and_order(tmp_path):
    p = _write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                         "2023-11-16 18:15:50.9951690,396,109\n"
                         "2023-11-16 18:15:46.6805900,374,44\n"
                         "2023-11-16 18:16:46.6805901,10,1\n")
    t = read_trace(p)
    assert t.arrival_s[0] == 0.0
    np.testing.assert_allclose(t.arrival_s, [0.0, 4.314579, 60.0000001], atol=1e-6)
    assert t.input_tokens.tolist() == [374, 396, 10]
    assert t.output_tokens.tolist() == [44, 109, 1]
    assert t.source == str(p)


def test_plain_format_any_origin_and_extra_columns(tmp_path):
    p = _write(tmp_path, "user,arrival_s,input_tokens,output_tokens\na,100.5,10,20\nb,100,7,3\n\n")
    t = read_trace(p)
    assert t.arrival_s.tolist() == [0.0, 0.5]
    assert t.input_tokens.tolist() == [7, 10] and t.output_tokens.tolist() == [3, 20]


def test_azure_2024_offsets_and_whole_seconds(tmp_path):
    """The 2024 release's timestamps carry a UTC offset, and a row on a whole second has no fraction."""
    p = _write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                         "2024-05-10 00:00:00.009930+00:00,2162,5\n"
                         "2024-05-10 00:00:01+00:00,100,7\n"
                         "2024-05-10T02:00:00.5+02:00,3,4\n"  # the same instant as 00:00:00.5 UTC
                         "2024-05-10 00:00:02.25Z,9,9\n")
    t = read_trace(p)
    np.testing.assert_allclose(t.arrival_s, [0.0, 0.49007, 0.99007, 2.24007], atol=1e-6)
    assert t.input_tokens.tolist() == [2162, 3, 100, 9]


def test_burstgpt_layout_seconds_and_failed_rows(tmp_path):
    """BurstGPT's columns as released (its zero-token rows are failed requests, kept)."""
    p = _write(tmp_path, "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                         "5,ChatGPT,472,18,490,Conversation log\n"
                         "45,GPT-4,1087,0,1087,API log\n"
                         "3,ChatGPT,0,0,0,Conversation log\n")
    t = read_trace(p)
    assert t.arrival_s.tolist() == [0.0, 2.0, 42.0]
    assert t.input_tokens.tolist() == [0, 472, 1087] and t.output_tokens.tolist() == [0, 18, 0]


def test_mooncake_json_lines_in_milliseconds(tmp_path):
    p = _write(tmp_path, '{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47]}\n'
                         '\n{"timestamp": 0, "input_length": 6472, "output_length": 52, "hash_ids": [0]}\n',
               "t.jsonl")
    t = read_trace(p)
    assert t.arrival_s.tolist() == [0.0, 27.482]
    assert t.input_tokens.tolist() == [6472, 6955] and t.output_tokens.tolist() == [52, 52]


@pytest.mark.parametrize("text, where, what", [
    ('{"timestamp": 1, "input_length": 2, "output_length": 3}\n{"timestamp": 2, "input_length": 2}\n',
     ":2", "missing output_length"),
    ('{"timestamp": 1, "input_length": 2, "output_length": 3}\n{"timestamp": 2,\n', ":2", "not a JSON object"),
    ('{"timestamp": "soon", "input_length": 2, "output_length": 3}\n', ":1 key timestamp", "milliseconds"),
    ('{"timestamp": 1, "input_length": -2, "output_length": 3}\n', ":1 key input_length", "non-negative integer"),
    ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\nnan,a,1,2,3,x\n",
     ":2 column Timestamp", "finite number of seconds"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.1+25:00,1,2\n", ":2 column TIMESTAMP", "date-time"),
])
def test_bad_rows_of_the_other_layouts_name_line_and_key(tmp_path, text, where, what):
    p = _write(tmp_path, text, "t.jsonl")
    with pytest.raises(InputError) as e:
        read_trace(p)
    assert e.value.field == f"{p}{where}"
    assert what in str(e.value)


def test_the_shipped_azure_trace_reads_whole():
    from pathlib import Path

    t = read_trace(Path(__file__).resolve().parents[2] / "data" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv")
    assert len(t) == 19366
    assert np.all(np.diff(t.arrival_s) >= 0)
    assert 3500 < t.span_s < 3503


def test_compress_divides_arrivals_and_keeps_tokens(tmp_path):
    t = read_trace(_write(tmp_path, "arrival_s,input_tokens,output_tokens\n0,1,2\n10,3,4\n"))
    c = compress(t, 4)
    assert c.arrival_s.tolist() == [0.0, 2.5]
    assert c.input_tokens.tolist() == [1, 3]
    for bad in (0, -1, float("nan"), float("inf"), True):
        with pytest.raises(InputError) as e:
            compress(t, bad)
        assert e.value.field == "compress"


@pytest.mark.parametrize("text, where, what", [
    ("a,b,c\n1,2,3\n", ":1", "none of the layouts"),
    ("arrival_s,input_tokens,output_tokens\n0,1,2\nx,1,2\n", ":3 column arrival_s", "finite number"),
    ("arrival_s,input_tokens,output_tokens\n0,1,2\n1,-4,2\n", ":3 column input_tokens", "non-negative integer"),
    ("arrival_s,input_tokens,output_tokens\n0,1,2.5\n", ":2 column output_tokens", "non-negative integer"),
    ("arrival_s,input_tokens,output_tokens\n0,1\n", ":2", "expected 3 columns"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,2\nyesterday,1,2\n",
     ":3 column TIMESTAMP", "date-time"),
])
def test_bad_rows_name_line_and_column(tmp_path, text, where, what):
    p = _write(tmp_path, text)
    with pytest.raises(InputError) as e:
        read_trace(p)
    assert e.value.field == f"{p}{where}"
    assert what in str(e.value)


def test_empty_and_missing_files(tmp_path):
    with pytest.raises(InputError, match="is empty"):
        read_trace(_write(tmp_path, ""))
    with pytest.raises(InputError, match="no requests"):
        read_trace(_write(tmp_path, "arrival_s,input_tokens,output_tokens\n", "h.csv"))
    with pytest.raises(InputError, match="cannot read") as e:
        read_trace(tmp_path / "nope.csv")
    assert e.value.field == "trace"
