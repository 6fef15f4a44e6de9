"""The progress line and metrics.jsonl: interval averages, the modality's unit, MFU only where
FLOPs are known, one record per step and split after resumes, third-party warnings once."""

from __future__ import annotations

import json
import logging
import warnings

import pytest

from loong_core.logs import quiet_third_party
from loong_core.trainer.metrics import MetricsWriter
from loong_core.trainer.progress import Progress
from loong_core.trainer.throughput import Throughput


def test_throughput_is_the_interval_average_not_the_last_step():
    rate = Throughput("tokens", flops_per_item=10.0, peak_flops=4000.0)
    rate.add(100, 1.0)
    rate.add(500, 1.0)
    rate.add(600, 2.0)
    assert rate.averages() == {"tokens_per_sec": 300.0, "mfu": 300.0 * 10.0 / 4000.0}
    rate.reset()
    rate.add(50, 0.5)
    assert rate.averages()["tokens_per_sec"] == 100.0


def test_mfu_only_with_known_flops_and_peak():
    assert "mfu" not in Throughput("samples", 0.0, 1e12).averages()
    no_peak = Throughput("tokens", 6.0, None)
    assert no_peak.reports_mfu and "mfu" not in no_peak.averages()
    assert not Throughput("frames", None, 1e12).reports_mfu


def _line(caplog, unit: str, show_mfu: bool, metrics: dict) -> str:
    progress = Progress(total=10, start=0, enabled=True, bar=False, unit=unit, show_mfu=show_mfu)
    with caplog.at_level(logging.INFO, logger="loong.train"):
        progress.update(5, {"loss": 1.25, "lr": 1e-3, **metrics}, log_line=True)
    return caplog.records[-1].getMessage()


@pytest.mark.parametrize("unit, label", [("tokens", "tok/s 1234"), ("samples", "samples/s 2.50"),
                                         ("frames", "frames/s 300")])
def test_log_line_uses_the_models_unit(caplog, unit, label):
    line = _line(caplog, unit, False, {f"{unit}_per_sec": {"tokens": 1234, "samples": 2.5,
                                                            "frames": 300}[unit]})
    assert label in line and "mfu" not in line


def test_log_line_shows_mfu_or_na_never_a_fake_zero(caplog):
    assert "mfu 12.5%" in _line(caplog, "tokens", True, {"tokens_per_sec": 10, "mfu": 0.125})
    assert "mfu n/a" in _line(caplog, "tokens", True, {"tokens_per_sec": 10})


def _records(path) -> list[tuple[int, str]]:
    return [(r["step"], r["split"]) for r in map(json.loads, path.read_text().splitlines())]


def _run(writer: MetricsWriter, start: int, stop: int) -> None:
    writer.start(start)
    for step in range(start + 1, stop + 1):
        writer.write(step, {"loss": 1.0 / step})
        if step % 5 == 0:
            writer.write(step, {"loss": 2.0}, split="valid")
    writer.close()


def test_metrics_have_one_record_per_step_and_split_after_several_resumes(tmp_path):
    _run(MetricsWriter(tmp_path, tensorboard=False), 0, 12)   # crashed after step 12, saved at 10
    _run(MetricsWriter(tmp_path, tensorboard=False), 10, 17)  # crashed after 17, saved at 15
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 18, "spl')                          # killed mid-line
    _run(MetricsWriter(tmp_path, tensorboard=False), 15, 20)
    records = _records(tmp_path / "metrics.jsonl")
    assert records == sorted(set(records), key=records.index)
    assert [s for s, split in records if split == "train"] == list(range(1, 21))
    assert [s for s, split in records if split == "valid"] == [5, 10, 15, 20]


def test_third_party_warning_once_on_rank_zero_never_on_others(monkeypatch):
    def emit(times: int) -> list:
        with warnings.catch_warnings(record=True) as caught:
            warnings.resetwarnings()
            quiet_third_party()
            for line in range(times):
                warnings.warn_explicit(".grad of a non-leaf Tensor", UserWarning,
                                       "optimizer.py", 60 + line, module="megatron.core.optimizer")
            warnings.warn_explicit("`load_state_dict` is deprecated", FutureWarning,
                                   "strategy.py", 9, module="megatron.core.dist_checkpointing")
        return caught

    monkeypatch.setenv("RANK", "0")
    assert [str(w.message) for w in emit(3)] == [".grad of a non-leaf Tensor"]
    monkeypatch.setenv("RANK", "1")
    assert emit(3) == []
