"""Fuzzed overrides: each gives a valid config or one clean ConfigError, never a traceback.

The keys are every leaf of the validated ``llama_debug`` config, the values edge cases per type
(``config_fuzz_cases``). A sample of the accepted ones then trains for one step: validation must
reject everything training cannot run.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
import config_fuzz_cases as cases  # noqa: E402

from loong_core.cli.main import main as loong_main  # noqa: E402
from loong_core.config.compose import load_config  # noqa: E402
from loong_core.errors import ConfigError  # noqa: E402
from loong_core.testing import run_train  # noqa: E402


@st.composite
def override_sets(draw):
    leaves = cases.leaf_keys()
    keys = sorted(leaves)
    pairs = []
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(keys))
        pool = cases.value_pool(leaves[key])
        pairs.append((key, draw(st.sampled_from(pool))))
    return pairs


def _validate_or_config_error(pairs, validate) -> None:
    overrides = [cases.override(k, v) for k, v in pairs]
    bad_key = cases.known_invalid(pairs)
    try:
        validate(overrides)
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message.strip() and "Traceback" not in message
        if bad_key:
            assert bad_key in message, (overrides, message)
        return
    assert bad_key is None, f"{overrides} passed validation, but {bad_key} breaks a rule"


@settings(max_examples=1200, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(override_sets())
def test_fuzzed_overrides_validate_or_fail_with_one_config_error(pairs):
    _validate_or_config_error(pairs, cases.validate_fast)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(override_sets())
def test_fuzzed_overrides_through_hydra_composition(pairs):
    _validate_or_config_error(pairs, lambda overrides: load_config(cases.BASE + overrides))


MALFORMED = st.text(alphabet="ab.=@+~/_ 1[]$", min_size=1, max_size=8)


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(MALFORMED)
def test_config_show_answers_malformed_overrides_with_one_error_line(capsys, text):
    code = loong_main(["config", "show", "experiment=llama_debug", text])
    out, err = capsys.readouterr()
    assert code in (0, 2), (text, code)
    if code == 2:
        assert err.startswith("error: ") and "Traceback" not in err, (text, err)


@pytest.mark.parametrize("override", ["=1", "@=1", "+=1", "trainer@=1", "a..b=1"])
def test_config_show_names_the_malformed_override(capsys, override):
    assert loong_main(["config", "show", override]) == 2
    assert f"Override {override!r} is not key=value" in capsys.readouterr().err


def _sample(count: int, seed: int = 15) -> tuple[list[list[str]], list[list[str]]]:
    """The first ``count`` accepted and 2 rejected override sets of a seeded draw."""
    rng = random.Random(seed)
    leaves = cases.leaf_keys()
    keys = sorted(leaves)
    accepted, rejected = [], []
    while len(accepted) < count or len(rejected) < 2:
        pairs = [(k, rng.choice(cases.value_pool(leaves[k])))
                 for k in rng.sample(keys, rng.choice([1, 2, 3]))]
        overrides = [cases.override(k, v) for k, v in pairs]
        try:
            load_config(cases.BASE + overrides)
        except ConfigError:
            if len(rejected) < 2:
                rejected.append(overrides)
            continue
        if len(accepted) < count:
            accepted.append(overrides)
    return accepted, rejected


ACCEPTED, REJECTED = _sample(4)


@pytest.mark.parametrize("overrides", ACCEPTED + REJECTED, ids=" ".join)
def test_loong_train_one_step_trains_or_fails_cleanly(tmp_path, overrides):
    proc = run_train([*cases.BASE, *overrides, "trainer.train_iters=1", "trainer.eval_interval=0",
                      "trainer.save_at_end=false", f"trainer.run_dir={tmp_path / 'run'}",
                      "trainer.progress_bar=false"], check=False, cwd=tmp_path)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    if overrides in REJECTED:
        assert proc.returncode == 2 and proc.stderr.startswith("error: "), proc.stderr[-3000:]
    elif proc.returncode != 0:  # only a check that needs the built run may still refuse, cleanly
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 2 and last.startswith("error: "), proc.stderr[-3000:]
        assert any(o.split("=")[0] in last for o in overrides), last
