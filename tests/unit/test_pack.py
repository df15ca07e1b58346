"""`kneecap pack` (kneecap.model.packing, kneecap.commands.pack): the example fleet packs onto
fewer GPUs with every deployment's SLO predicted met; bad input exits 2 naming the entry and
field; a deployment no GPU of the inventory serves exits 1 naming it; the JSON's shape."""

from __future__ import annotations

import contextlib
import copy
import io
import json

import pytest
import yaml

from kneecap.cli import main
from kneecap.errors import InputError
from kneecap.model import packing
from tests.support.examples import FLEET

GPUS = "h100-80gb=12,l40s=4,l4=4"
ENTRIES = yaml.safe_load(FLEET.read_text())


def _run(capsys, *argv):
    try:
        rc = main(["pack", *argv])
    except SystemExit as exc:
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The example fleet through the CLI, once (capsys is per test: stdout captured here)."""
    png = tmp_path_factory.mktemp("pack") / "fleet.png"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["pack", "-f", str(FLEET), "--gpus", GPUS, "--json", "--plot", str(png)])
    return rc, json.loads(buf.getvalue()), png


def test_the_example_fleet_packs_onto_fewer_gpus_with_every_slo_predicted_met(example):
    rc, out, png = example
    assert rc == 0 and out["feasible"] and out["all_slo_met"]
    assert len(ENTRIES) >= 4 and len({e["model"] for e in ENTRIES}) >= 4
    before, after = out["before"], out["after"]
    assert before["gpus"] == sum(e["replicas"] for e in ENTRIES) == 12
    assert after["gpus"] * 3 <= before["gpus"] * 2  # at least one GPU in three returned
    assert after["cost_per_hour"] < before["cost_per_hour"]
    assert set(after["by_type"]) - {"h100-80gb"}  # a smaller GPU type where one suffices
    for d in out["deployments"]:
        q = {0.5: "p50", 0.95: "p95", 0.99: "p99"}[d["slo"]["quantile"]]
        a = d["after"]
        assert a["slo_met"] and a["slo_met_with_margin"], d["name"]
        assert a["ttft_s"][q] <= 0.9 * d["slo"]["ttft_s"] and a["tpot_s"][q] <= 0.9 * d["slo"]["tpot_s"], d["name"]
        assert len(a["gpus"]) == d["replicas"] and len(set(a["gpu_indices"])) == d["replicas"]  # replicas apart
    for g in out["placement"]:
        assert g["memory_share"] <= 0.95 + 1e-9
        assert all(isinstance(e["max_num_seqs"], int) and 0 < e["gpu_memory_utilization"] < 1 for e in g["engines"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_shape(example):
    _, out, _ = example
    assert {"feasible", "margin", "before", "after", "gpus_returned", "savings_per_hour", "all_slo_met",
            "placement", "deployments", "seed", "plot", "evaluations"} <= set(out)
    assert out["margin"] == 0.1 and out["gpus_returned"] == out["before"]["gpus"] - out["after"]["gpus"]
    assert set(out["before"]) == {"gpus", "cost_per_hour", "by_type"}
    g = out["placement"][0]
    assert set(g) == {"index", "gpu", "cost_per_hour", "memory_share", "engines"}
    assert set(g["engines"][0]) == {"deployment", "replica", "max_num_seqs", "gpu_memory_utilization", "gpu_share",
                                    "interference_s", "ttft_s", "tpot_s"}
    d = out["deployments"][0]
    assert set(d) == {"name", "model", "replicas", "rate_rps", "slo", "before", "after"}
    assert set(d["before"]["ttft_s"]) == {"p50", "p95", "p99"}
    assert set(d["after"]) >= {"gpus", "ttft_s", "tpot_s", "slo_met"}


def test_the_packing_is_deterministic():
    deps = packing.parse_fleet(ENTRIES[:2])
    inv = packing.parse_inventory([{"type": "h100-80gb", "count": 3}])
    a = packing.pack(deps, inv, samples=8000)
    b = packing.pack(deps, inv, samples=8000)
    assert a == b


def _write(tmp_path, entries):
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(entries))
    return str(path)


def _broken(**change):
    entries = copy.deepcopy(ENTRIES[:2])
    for dotted, value in change.items():
        *keys, last = dotted.split("__")
        node = entries[1]
        for k in keys:
            node = node[k]
        if value is KeyError:
            del node[last]
        else:
            node[last] = value
    return entries


@pytest.mark.parametrize("change, field, words", [
    ({"accelerator__type": "h100"}, "fleet[1].accelerator.type", "ambiguous GPU"),
    ({"accelerator__type": "tpu-v9"}, "fleet[1].accelerator.type", "unknown GPU"),
    ({"model": "llama-9"}, "fleet[1].model", "unknown model"),
    ({"name": "chat-8b"}, "fleet[1].name", "duplicate name"),
    ({"replicas": 0}, "fleet[1].replicas", "positive integer"),
    ({"workload__requestsPerSecond": KeyError}, "fleet[1].workload.requestsPerSecond", "missing"),
    ({"workload__inputLengthMean": "long"}, "fleet[1].workload.inputLengthMean", "expected"),
    ({"slo__quantile": 0.9}, "fleet[1].slo.quantile", "0.95"),
    ({"slo": {"quantile": 0.95}}, "fleet[1].slo", "ttftSeconds"),
    ({"accelerator__count": 2}, "fleet[1].accelerator.count", "tensor parallel 1"),
    ({"engine": {"tensorParallelSize": 2}}, "fleet[1].engine.tensorParallelSize", "tensor parallel 1"),
    ({"slo__ttftSecond": 1.0}, "fleet[1].slo.ttftSecond", "unknown field"),
])
def test_bad_entries_exit_2_naming_the_entry_and_field(tmp_path, capsys, change, field, words):
    rc, out, err = _run(capsys, "-f", _write(tmp_path, _broken(**change)), "--json")
    assert rc == 2 and out == ""
    (line,) = err.splitlines()
    report = json.loads(line)
    assert report["field"] == field and report["exitCode"] == 2 and words in report["error"]
    assert "'rag-32b'" in report["error"] or "'chat-8b'" in report["error"]  # the entry, by name


def test_bad_inventory_and_files_exit_2(tmp_path, capsys):
    fleet = _write(tmp_path, ENTRIES[:1])
    rc, _, err = _run(capsys, "-f", fleet, "--gpus", "l40s=four", "--json")
    assert rc == 2 and json.loads(err)["field"] == "gpus"
    rc, _, err = _run(capsys, "-f", fleet, "--gpus", "a99=2", "--json")
    assert rc == 2 and json.loads(err)["field"] == "gpus" and "unknown GPU" in json.loads(err)["error"]
    rc, _, err = _run(capsys, "-f", str(tmp_path / "none.yaml"), "--json")
    assert rc == 2 and json.loads(err)["field"] == "fleet"
    rc, _, err = _run(capsys, "-f", fleet, "--margin", "1.5", "--json")
    assert rc == 2 and json.loads(err)["field"] == "margin"
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump([{"type": "l4", "count": 1}, {"type": "l4-24gb", "count": 2}]))
    rc, _, err = _run(capsys, "-f", fleet, "--inventory", str(inv), "--json")
    assert rc == 2 and json.loads(err)["field"] == "inventory[1].type"
    with pytest.raises(InputError, match="fleet"):
        packing.parse_fleet([])


def test_a_deployment_no_gpu_serves_exits_1_naming_it(tmp_path, capsys):
    """rag-32b (65 GB of weights) fits neither an L40S nor an L4; nothing else is offered."""
    rc, out, _ = _run(capsys, "-f", _write(tmp_path, ENTRIES[1:2]), "--gpus", "l40s=4,l4=4", "--json",
                      "--samples", "8000")
    assert rc == 1
    res = json.loads(out)
    assert not res["feasible"] and res["unplaced"]["deployment"] == "rag-32b"
    assert "rag-32b" in res["message"] and {b["gpu"] for b in res["unplaced"]["best"]} == {"l40s", "l4"}
    assert all(not b["fits"] and "memory" in b["reason"] for b in res["unplaced"]["best"])


def test_an_slo_no_placement_meets_exits_1_with_the_best_it_could_do(tmp_path, capsys):
    entries = copy.deepcopy(ENTRIES[:1])
    entries[0]["slo"]["tpotSeconds"] = 0.005  # below one decode step of an 8B model on an H100
    rc, out, _ = _run(capsys, "-f", _write(tmp_path, entries), "--json", "--samples", "8000")
    assert rc == 1
    res = json.loads(out)
    (best,) = res["unplaced"]["best"]
    assert res["unplaced"]["deployment"] == "chat-8b" and best["gpu"] == "h100-80gb"
    assert best["tpot_s"] > 0.005 and best["score"] > 1 and "SLO" in best["reason"]
    assert res["deployments"][0]["before"]["slo_met"] is False


def test_text_output(tmp_path, capsys):
    rc, out, _ = _run(capsys, "-f", _write(tmp_path, ENTRIES[2:3]), "--samples", "8000")
    assert rc == 0 and out.startswith("today   2 GPUs, $10.00/h") and "summarize-9b" in out
