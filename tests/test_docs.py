"""The docs site builds strictly (broken links and undocumented hooks fail it), its hook
reference is generated from hookspecs.py, and the plugin tutorial works as written."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loong_core.testing import install_plugin, run_train

REPO = Path(__file__).resolve().parents[1]
pytest.importorskip("mkdocs")


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                           str(root / "mkdocs.yml"), "-d", str(site)],
                          capture_output=True, text=True, timeout=300, cwd=root)


def test_site_builds_with_a_reference_of_every_hook(tmp_path):
    from loong_core import hookspecs

    proc = build(REPO, tmp_path / "site")
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = (tmp_path / "site" / "reference" / "hooks" / "index.html").read_text()
    hooks = [n for n in vars(hookspecs) if n.startswith("loong_") and n != "loong_"]
    assert len(hooks) >= 14
    for name in hooks:
        assert f"<code>{name}</code>" in reference, name
    for page in ("modalities/llm", "modalities/vlm", "modalities/diffusion", "modalities/embodied",
                 "tutorial_plugin"):
        assert (tmp_path / "site" / page / "index.html").is_file()


def test_a_broken_link_fails_the_build(tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(REPO / "docs", root / "docs")
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    with open(root / "docs" / "index.md", "a") as f:
        f.write("\nSee [the missing page](no_such_page.md).\n")
    proc = build(root, tmp_path / "site")
    assert proc.returncode != 0 and "no_such_page.md" in proc.stderr


def test_an_undocumented_hook_fails_the_build(monkeypatch):
    from mkdocs.exceptions import PluginError

    from loong_core import hookspecs

    spec = importlib.util.spec_from_file_location("loong_docs", REPO / "docs" / "_build_hooks" / "loong_docs.py")
    loong_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loong_docs)

    def loong_on_something(run):
        pass

    monkeypatch.setattr(hookspecs, "loong_on_something", hookspecs.hookspec(loong_on_something),
                        raising=False)
    with pytest.raises(PluginError, match="hook loong_on_something .* has no docstring"):
        loong_docs.render()


def tutorial_files() -> dict[str, str]:
    """``path -> text`` of the code blocks of the tutorial whose first line is ``# file: PATH``."""
    text = (REPO / "docs" / "tutorial_plugin.md").read_text()
    files = {}
    for body in re.findall(r"```(?:python|toml)\n(.*?)```", text, flags=re.S):
        first, _, rest = body.partition("\n")
        if first.startswith("# file: "):
            files[first[len("# file: "):]] = rest
    return files


def test_plugin_tutorial_works_as_written(tmp_path):
    files = tutorial_files()
    toml = files["pyproject.toml"]  # (tomllib is Python 3.11+; loong supports 3.10)
    project = {"name": re.search(r'^name = "(.+)"$', toml, re.M).group(1)}
    entry, module = re.search(r'\[project.entry-points.loong\]\n(\w+) = "(.+)"', toml).groups()
    source = files[module.replace(".", "/") + ".py"]
    site = install_plugin(tmp_path / "site", project["name"], entry, {module: source})
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    listed = subprocess.run([sys.executable, "-m", "loong_core.cli.main", "plugins"], capture_output=True,
                            text=True, timeout=120, env={**os.environ, **env})
    assert re.search(rf"^{entry} +{project['name']} .* on_log_step", listed.stdout, re.M), listed.stdout
    run_dir = tmp_path / "run"
    run_train(["experiment=llama_debug", "trainer.train_iters=4", "trainer.log_interval=2",
               "trainer.eval_interval=0", "trainer.save_at_end=false", "trainer.progress_bar=false",
               "trainer.tensorboard=false", f"trainer.run_dir={run_dir}"], env=env)
    lines = (run_dir / "loss.csv").read_text().splitlines()
    assert lines[0] == "step,loss,lr" and [line.split(",")[0] for line in lines[1:]] == ["2", "4"]
