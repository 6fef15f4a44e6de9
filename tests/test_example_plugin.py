"""A third-party plugin installed with pip is discovered and used by a real training run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loong_core.testing import run_train

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "loong-example-plugin"


@pytest.fixture(scope="module")
def example_site(tmp_path_factory):
    site = tmp_path_factory.mktemp("example_site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--target", str(site), str(EXAMPLE)],
                   check=True, capture_output=True, timeout=300)
    return site


def _env(site):
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}


def test_pip_installed_plugin_is_listed(example_site):
    out = subprocess.run([sys.executable, "-m", "loong_core.cli.main", "plugins", "--json"],
                         capture_output=True, text=True, check=True, env={**os.environ, **_env(example_site)})
    record = {p["name"]: p for p in json.loads(out.stdout)}["example"]
    assert record["distribution"] == "loong-example-plugin"
    assert record["registered"] == {"balancer": ["round_robin"]}
    assert "loong_on_log_step" in record["hooks"]


@pytest.mark.multirank
def test_training_uses_the_plugins_balancer_experiment_and_hooks(example_site, tmp_path):
    run_dir = tmp_path / "run"
    run_train(["experiment=example_debug", f"trainer.run_dir={run_dir}", "trainer.progress_bar=false"],
              nproc=2, env=_env(example_site))
    events = [json.loads(line) for line in (run_dir / "example_events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "log_step"] == [2, 4]
    assert events[-1] == {"event": "train_end", "step": 4}
    config = (run_dir / "config.yaml").read_text()
    assert "balancer: round_robin" in config
