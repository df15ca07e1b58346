"""`kneecap fit`: calibrate SLIM on profile rows and write CALIB.json."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from kneecap.commands import common
from kneecap.errors import InputError
from kneecap.model import calibrate, profiles, slim
from kneecap.model.arch import get_arch
from kneecap.model.hardware import get_gpu

HELP = "calibrate the SLIM performance model on a profiles CSV (writes CALIB.json)"


def add_arguments(p):
    p.add_argument("profiles", metavar="PROFILES.csv",
                   help="rows with model, batch, input_len, output_len, throughput_tok_s")
    p.add_argument("--gpu", required=True, help="GPU catalog key the profiles were measured on (e.g. h100-64gb)")
    p.add_argument("--where", action="append", default=[], metavar="COL=VALUE",
                   help="keep rows whose COL equals VALUE (repeatable; repeated COL = any of)")
    p.add_argument("--model-form", default=slim.DEFAULT_FORM, choices=slim.FORMS, help="SLIM form to fit")
    p.add_argument("-o", "--output", required=True, metavar="CALIB.json", help="where to write the calibration")
    common.add_tensor_parallel(p)
    common.add_json(p, "print one JSON object (its warnings list what the filters lost)")


def read_text(path: str, field: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise InputError(field, f"no such file: {path}")
    try:
        return p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(field, f"cannot read {path}: {exc}") from None


def lost_spread(all_rows: list[dict], cv_by_dataset: dict[str, float]) -> list[str]:
    """Warnings for the workloads (datasets) of the file with output-length spread whose rows the
    filters dropped: the calibration records no CV for them, and predict/advise then assume
    fixed output lengths for such workloads (SLIM's KV term, paper 000 eq. 12, reads too low)."""
    in_file = profiles.estimate_output_cv(all_rows)
    return [f"--where keeps no usable rows of dataset {name!r} (output-length CV {cv:.2f} in this file): the "
            f"calibration has no CV for it, so predictions for such workloads assume fixed output lengths; keep "
            f"some of its rows or give predict an output_cv column / advise --output-cv {cv:.2f}"
            for name, cv in sorted(in_file.items()) if name not in cv_by_dataset and cv >= SPREAD_CV]


SPREAD_CV = 0.1  # below this a workload's output lengths are as good as fixed


def run(args) -> int:
    gpu = get_gpu(args.gpu)
    all_rows = profiles.read_csv_text(read_text(args.profiles, "PROFILES.csv"))
    rows = profiles.filter_rows(all_rows, profiles.parse_where(args.where))
    if not rows:
        raise InputError("--where", "no rows match the filters")
    data = profiles.profile_arrays(rows)
    for model in sorted(set(data.models)):
        tp = common.tensor_parallel(args, get_arch(model))
    cv_by_dataset = profiles.estimate_output_cv(list(data.rows))
    warnings = lost_spread(all_rows, cv_by_dataset) if args.where else []
    cv = profiles.apply_output_cv(data.rows, cv_by_dataset)
    cal = calibrate.fit(list(data.models), gpu, data.batch, data.input_len, data.output_len,
                        data.throughput_tok_s, form=args.model_form, output_cv=cv,
                        chunked_prefill=data.chunked_prefill, tensor_parallel_size=tp)
    cal = replace(cal, notes={
        "source": str(args.profiles), "where": list(args.where),
        "skipped_outliers": len(rows) - len(data), "output_cv_by_dataset": cv_by_dataset,
        "tensor_parallel_size": tp})
    try:
        Path(args.output).write_text(cal.to_json() + "\n")
    except OSError as exc:
        raise InputError("-o", f"cannot write {args.output}: {exc}") from None
    if args.json:
        print(json.dumps({"output": str(args.output), **json.loads(cal.to_json()), "warnings": warnings}))
    else:
        print(calibrate.report(cal))
        print(f"wrote {args.output}")
        for w in warnings:
            print(f"kneecap fit: warning: {w}", file=sys.stderr)
    return 0
