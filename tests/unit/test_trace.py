"""Request traces: the Azure LLM trace and plain CSV read exactly; bad files name the line and column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kneecap.errors import InputError
from kneecap.sim.trace import compress, read_trace

AZURE = Path(__file__).resolve().parents[2] / "data" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"


def test_azure_trace_reads_whole_with_its_published_shape():
    t = read_trace(AZURE)
    # the dataset's README: one hour of 19,366 requests; prompt mean 1,155, generated mean 211
    assert len(t.arrival_s) == len(t.input_tokens) == len(t.output_tokens) == 19_366
    assert t.arrival_s[0] == 0.0 and np.all(np.diff(t.arrival_s) >= 0)
    assert t.arrival_s[-1] == pytest.approx(3501.72, abs=0.01)
    assert t.input_tokens.mean() == pytest.approx(1154.70, abs=0.01)
    assert t.output_tokens.mean() == pytest.approx(211.13, abs=0.01)
    # the first rows: 18:15:46.6805900 (374, 44), 18:15:50.9951690 (396, 109)
    assert t.arrival_s[1] == pytest.approx(4.314579, abs=1e-6)
    assert (t.input_tokens[:2].tolist(), t.output_tokens[:2].tolist()) == ([374, 396], [44, 109])


def test_plain_csv_is_sorted_and_made_relative(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,input_tokens,output_tokens\n12.5,30,4\n10,20,3\n\n11,25,5\n")
    t = read_trace(p)
    assert t.arrival_s.tolist() == [0.0, 1.0, 2.5]
    assert t.input_tokens.tolist() == [20, 25, 30] and t.output_tokens.tolist() == [3, 5, 4]
    c = compress(t, 4.0)
    assert c.arrival_s.tolist() == [0.0, 0.25, 0.625] and c.input_tokens is t.input_tokens


@pytest.mark.parametrize("body, where, says", [
    ("arrival_s,input_tokens,output_tokens\n0,10,5\n1,ten,5\n", ":3:input_tokens", "whole number"),
    ("arrival_s,input_tokens,output_tokens\n0,10,5\n1,10,0\n", ":3:output_tokens", "at least 1"),
    ("arrival_s,input_tokens,output_tokens\nsoon,10,5\n", ":2:arrival_s", "time"),
    ("arrival_s,input_tokens,output_tokens\nnan,10,5\n", ":2:arrival_s", "finite"),
    ("arrival_s,input_tokens,output_tokens\n0,10\n", ":2", "3 columns"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,5\n2023-13-16 18:15:47,10,5\n",
     ":3:TIMESTAMP", "time"),
    ("time,prompt,output\n0,1,1\n", ":1", "header"),
    ("arrival_s,input_tokens,output_tokens\n", "", "no requests"),
])
def test_bad_trace_names_line_and_column(tmp_path, body, where, says):
    p = tmp_path / "bad.csv"
    p.write_text(body)
    with pytest.raises(InputError) as exc:
        read_trace(p)
    assert exc.value.field == f"{p}{where}"
    assert says in str(exc.value)


def test_missing_file_and_bad_factor_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        read_trace(tmp_path / "nope.csv")
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,input_tokens,output_tokens\n0,1,1\n")
    for factor in (0, -2, float("inf")):
        with pytest.raises(InputError) as exc:
            compress(read_trace(p), factor)
        assert exc.value.field == "compress"
