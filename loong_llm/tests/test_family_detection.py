"""The family of an HF folder comes from its config.json's ``model_type`` (one table over the
installed adapters) when ``--family`` is omitted; a model type nobody reads is one line naming it
and the supported types, not a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from loong_llm.hf.registry import model_type_table
from loong_llm.hf.testing import write_hf_model

FAMILIES = ["llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3", "deepseek_v32", "glm4_moe",
            "minimax_m2", "deepseek_v2", "qwen3_next", "qwen3_5", "qwen3_5_moe"]


def _loong(*args: str):
    return subprocess.run([sys.executable, "-m", "loong_core.cli.main", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_every_llm_family_is_found_by_its_model_type():
    from loong_llm.hf.registry import get_adapter

    table = model_type_table()
    for family in FAMILIES:  # the text models of Qwen3.5 are qwen3_5_text / qwen3_5_moe_text
        model_types = get_adapter(family).model_types
        assert model_types and all(table[t] == family for t in model_types), (family, model_types)
    # adapters without config.json model types (diffusers pipelines) are not in the table
    assert all(isinstance(name, str) and name for name in table)


def test_unknown_model_type_is_one_line_naming_it_and_the_supported_types(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "glm9_moe"}))
    (tmp_path / "text.txt").write_text("hello world")
    for args in (("eval", "perplexity", "--hf", str(tmp_path), "--text", str(tmp_path / "text.txt")),
                 ("generate", "--hf", str(tmp_path), "--prompt", "hi"),
                 ("convert", "hf-to-loong", str(tmp_path), str(tmp_path / "out"))):
        result = _loong(*args)
        assert result.returncode == 2, result.stderr[-3000:]
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, result.stderr
        assert "model_type 'glm9_moe'" in lines[0] and "glm4_moe" in lines[0], lines[0]
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_convert_without_family_reads_model_type(tmp_path):
    src = write_hf_model("glm4_moe", tmp_path / "src", seed=2)
    result = _loong("convert", "hf-to-loong", str(src), str(tmp_path / "ckpt"))
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((tmp_path / "ckpt" / "loong_complete.json").read_text())
    assert json.dumps(record).count('"glm4_moe"') >= 1
    assert "model=glm4_moe" in result.stdout or "model.name=glm4_moe" in result.stdout, result.stdout
