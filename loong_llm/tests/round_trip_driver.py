"""``loong convert`` HF -> loong -> HF of many one-rank cases in one process: the suite pays one
start-up for all of them instead of two CLI processes per case.

``python round_trip_driver.py JOBS.json OUT.json``: ``JOBS`` maps a case name to ``[work dir,
hf-to-loong arguments]``; each case runs ``loong convert hf-to-loong ARGS... WORK/ckpt`` and then
``loong convert loong-to-hf WORK/ckpt WORK/out`` through the CLI's ``main`` (the same parser and
commands as the ``loong`` executable). ``OUT`` maps each case to ``null`` or what went wrong; a
failing case does not stop the others.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path


def main(jobs_path: str, out_path: str) -> int:
    from loong_core.cli.main import main as loong

    results = {}
    for case, (work, hf_to_loong_args) in json.loads(Path(jobs_path).read_text()).items():
        ckpt, out = str(Path(work) / "ckpt"), str(Path(work) / "out")
        try:
            codes = [loong(["convert", "hf-to-loong", *hf_to_loong_args, ckpt]),
                     loong(["convert", "loong-to-hf", ckpt, out])]
            results[case] = None if codes == [0, 0] else f"exit codes {codes}"
        except BaseException:  # SystemExit from argparse included
            results[case] = traceback.format_exc()
    Path(out_path).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
