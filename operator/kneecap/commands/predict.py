"""`kneecap predict`: SLIM throughput and E2E for every row of a points CSV."""

from __future__ import annotations

import csv
import json

import numpy as np

from kneecap.commands import common
from kneecap.commands.fit import read_text
from kneecap.errors import InputError
from kneecap.model import calibrate, profiles

HELP = "predict throughput and E2E latency for each row of a CSV from a calibration"


def add_arguments(p):
    p.add_argument("calibration", metavar="CALIB.json")
    p.add_argument("points", metavar="POINTS.csv", help="rows with model, batch, input_len, output_len")
    p.add_argument("-o", "--output", required=True, metavar="OUT.csv")
    common.add_json(p)


def load_calibration(path: str) -> calibrate.Calibration:
    return calibrate.Calibration.from_json(read_text(path, "CALIB.json"))


def run(args) -> int:
    cal = load_calibration(args.calibration)
    rows = profiles.read_csv_text(read_text(args.points, "POINTS.csv"))
    pts = profiles.profile_arrays(rows, require_throughput=False, skip_outliers=False)
    cv = profiles.apply_output_cv(pts.rows, cal.notes.get("output_cv_by_dataset", {}))
    kw = {"output_cv": cv, "chunked_prefill": pts.chunked_prefill} if cal.form == "kneecap" else {}
    thr, e2e = calibrate.predict(cal, list(pts.models), None, pts.batch, pts.input_len, pts.output_len, **kw)
    fields = list(rows[0].keys()) + [c for c in ("pred_throughput_tok_s", "pred_e2e_s") if c not in rows[0]]
    try:
        with open(args.output, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            for r, t, e in zip(rows, thr, e2e):
                w.writerow({**r, "pred_throughput_tok_s": f"{t:.6g}", "pred_e2e_s": f"{e:.6g}"})
    except OSError as exc:
        raise InputError("-o", f"cannot write {args.output}: {exc}") from None
    out = {"output": str(args.output), "n_rows": len(rows), "form": cal.form}
    if pts.rows and "throughput_tok_s" in rows[0]:
        try:
            meas = np.array([float(r["throughput_tok_s"]) for r in rows])
            out["mape_pct"] = float(np.mean(np.abs(thr / meas - 1.0)) * 100.0)
        except ValueError:
            pass
    if args.json:
        print(json.dumps(out))
    else:
        print(f"wrote {len(rows)} predictions to {args.output}"
              + (f" (throughput MAPE vs the file's throughput_tok_s: {out['mape_pct']:.2f}%)" if "mape_pct" in out else ""))
    return 0
