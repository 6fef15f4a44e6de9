"""Every ``loong`` command of the README composes, validates and fits its layout as written;
the single-rank ones run end to end with small step counts, sharing one run.

Multi-rank commands (``--nproc-per-node N``) are checked here up to the launch (config, layout,
global batch per data-parallel size); their training runs in the parallel tests of each package.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from loong_core.cli.main import build_parser
from loong_core.cli.main import main as loong_main
from loong_core.config.compose import load_config
from loong_core.runtime import check_layout
from loong_core.testing import read_metrics, run_train

README = Path(__file__).resolve().parents[1] / "README.md"
SMALL = ["trainer.train_iters=2", "trainer.eval_interval=0", "trainer.progress_bar=false",
         "trainer.tensorboard=false"]


def readme_commands() -> list[list[str]]:
    """``loong ...`` commands of the README's bash blocks (continuations joined, comments and
    ``[optional]`` parts dropped, ``&&`` chains split, ``<time>`` kept as a placeholder)."""
    text = README.read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            for part in line.split("&&"):
                words = shlex.split(re.sub(r"\[[^\]]*\]", "", part))
                if words[:1] == ["loong"]:
                    commands.append(words[1:])
    return commands


COMMANDS = readme_commands()
TRAIN = [c for c in COMMANDS if c[0] == "train"]


def _split_train(argv: list[str]) -> tuple[list[str], int]:
    args, _ = build_parser().parse_known_args(argv)
    return list(args.overrides), args.nproc_per_node


def test_readme_lists_the_commands_this_test_runs():
    assert len(TRAIN) >= 15 and any(c[:2] == ["config", "show"] for c in COMMANDS)
    assert any(c[0] == "plot" for c in COMMANDS) and any(c[0] == "sample" for c in COMMANDS)


@pytest.mark.parametrize("argv", TRAIN, ids=" ".join)
def test_readme_train_command_validates_and_fits_its_layout(argv):
    overrides, nproc = _split_train(argv)
    cfg = load_config(overrides)
    if "--nnodes" not in argv:
        check_layout(cfg, nproc)


@pytest.mark.parametrize("argv", [c for c in COMMANDS if c[0] not in ("train", "plot", "sample")],
                         ids=" ".join)
def test_readme_other_command_parses(argv):
    args, extra = build_parser().parse_known_args(argv)
    assert getattr(args, "func", None) is not None and (not extra or args.accepts_overrides)


@pytest.mark.parametrize("argv", [["config", "show"], ["config", "groups"], ["plugins"],
                                  ["plugins", "--json"]], ids=" ".join)
def test_readme_inspection_commands_run(argv, capsys):
    assert argv[0] in {c[0] for c in COMMANDS}
    assert loong_main(argv) == 0
    assert capsys.readouterr().out.strip()


@pytest.fixture(scope="module")
def default_runs(default_experiment_run, tmp_path_factory):
    """README's ``loong train`` (the session's 40-step run of the default experiment, copied into
    a fresh folder) then ``loong train trainer.resume=auto`` for one more step there."""
    assert ["train"] in COMMANDS and ["train", "trainer.resume=auto"] in COMMANDS
    cwd = tmp_path_factory.mktemp("readme") / "cwd"
    shutil.copytree(default_experiment_run[0], cwd)
    run_train(["trainer.resume=auto", *SMALL, "trainer.train_iters=41", "trainer.log_interval=1",
               "trainer.save_at_end=false"], cwd=cwd)
    (run_dir,) = (cwd / "runs" / "llama_shakespeare").iterdir()
    return cwd, run_dir


def test_readme_default_run_and_resume_auto_continue_one_run(default_runs):
    _, run_dir = default_runs
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(1, 42))


def test_readme_plot_command_draws_the_run(default_runs, capsys):
    pytest.importorskip("matplotlib")
    cwd, run_dir = default_runs
    (argv,) = [c for c in COMMANDS if c[0] == "plot"]
    assert loong_main([a.replace("runs/llama_debug/<time>", str(run_dir)) for a in argv]) == 0
    assert (run_dir / "curves.png").stat().st_size > 10_000


def test_readme_sample_command_on_an_llm_run_is_one_clear_error(default_runs, tmp_path, capsys):
    _, run_dir = default_runs
    (argv,) = [c for c in COMMANDS if c[0] == "sample"]
    argv = [str(run_dir) if a.startswith("runs/") else a for a in argv]
    argv = [str(tmp_path / "grid.png") if a == "grid.png" else a for a in argv]
    assert loong_main(argv) == 2
    err = capsys.readouterr().err
    assert "holds a 'llama' model (experiment llama_shakespeare), not a diffusion model" in err
    assert "loong generate" in err and "Traceback" not in err
