"""``loong eval vqa``: a trained VLM answers greedily from its run directory, and its answers are the
arg-max predictions of the model's forward pass on the training-time inputs."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from loong_core.errors import ConfigError
from loong_core.kernels.segment_mask import with_attention_mask
from loong_core.testing import run_train

MAX_NEW = 3


def loong_json(capsys, *args: str) -> dict:
    """Run ``loong ARGS --json`` (the CLI's entry point, in this process) and parse its output."""
    from loong_core.cli.main import main

    capsys.readouterr()
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def one_process():
    """Loading a model in this process initialises a one-rank process group and sets RANK,
    WORLD_SIZE, MASTER_PORT...; both are undone after the test so later subprocess runs start clean."""
    from megatron.core import parallel_state as ps

    saved = dict(os.environ)
    yield
    ps.destroy_model_parallel()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory, tiny):
    run_dir = tmp_path_factory.mktemp("eval_vqa") / "digits"
    run_train([*tiny, f"trainer.run_dir={run_dir}", "trainer.train_iters=4", "trainer.eval_interval=0"])
    return run_dir


@pytest.fixture(scope="module")
def qwen_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("eval_vqa") / "qwen2_5_vl"
    run_train(["experiment=qwen2_5_vl_debug", f"trainer.run_dir={run_dir}", "trainer.train_iters=2",
               "trainer.eval_interval=0", "trainer.progress_bar=false", "trainer.tensorboard=false"])
    return run_dir


def _argmax_rows(logits: torch.Tensor, rows: range, vocab: int) -> list[int]:
    return [int(logits[0, r, :vocab].argmax()) for r in rows]


def _check_against_forward(got_ids: list[int], predicted: list[int], end_ids: set[int]) -> None:
    """``predicted[j]``: the forward's arg-max after prompt + ``got_ids[:j]``: it must be the j-th
    generated token, and the one after the last must end the turn unless the limit stopped it."""
    assert got_ids == predicted[: len(got_ids)]
    if len(got_ids) < MAX_NEW:
        assert predicted[len(got_ids)] in end_ids


def test_digits_run_answers_are_the_forward_passes_argmax(digits_run, one_process, capsys, caplog):
    import logging

    from loong_vlm.eval.loading import load_vlm
    from loong_vlm.eval.tasks import task_for
    from loong_vlm.eval.vqa import evaluate, next_token_logits

    with caplog.at_level(logging.INFO):
        result = loong_json(capsys, "eval", "vqa", "--checkpoint", str(digits_run), "--limit", "6", "--show", "6",
                            "--max-new-tokens", str(MAX_NEW))
    assert "answering 6 questions: step" in caplog.text  # progress while it answers
    assert result["count"] == 6 and result["source"] == "valid" and len(result["examples"]) == 6
    assert result["correct"] == sum(row["correct"] for row in result["examples"])
    assert result["accuracy"] == pytest.approx(result["correct"] / 6)

    vlm = load_vlm(digits_run / "checkpoints" / "iter_0000004")
    task = task_for(vlm.data)
    vocab, end_ids = vlm.provider.config.foundation.vocab_size, task.end_ids
    for item, row in zip(task.items("valid", 6), result["examples"]):
        sample = vlm.data.sample(int(row["where"].split()[-1]))  # the training sample of this digit
        answer_at = int(torch.nonzero(sample["answer_mask"])[0, 0])
        prompt = sample["tokens"][: answer_at + 1].tolist()
        assert row["expected"] == vlm.data.tokenizer.decode([int(sample["labels"][answer_at])])
        assert item.prompt == prompt
        with torch.no_grad():
            first = vlm.model(sample["tokens"][None], sample["position_ids"][None], None,
                              images=sample["images"][None])
            tokens = torch.tensor([prompt + row["got_ids"]])
            forced = vlm.model(tokens, torch.arange(tokens.shape[1])[None], None, images=sample["images"][None])
        # the decoder's inputs for the prompt give the training sample's logits at the answer position
        decoder_logits = next_token_logits(vlm, task.inputs([item], [prompt]))[0]
        torch.testing.assert_close(decoder_logits, first[0, answer_at, :vocab], rtol=1e-5, atol=1e-5)
        predicted = _argmax_rows(forced, range(answer_at, answer_at + len(row["got_ids"]) + 1), vocab)
        _check_against_forward(row["got_ids"], predicted, end_ids)

    one_by_one = evaluate(vlm, limit=6, show=6, max_new_tokens=MAX_NEW, batch_size=1)
    assert [r["got_ids"] for r in one_by_one["examples"]] == [r["got_ids"] for r in result["examples"]]
    with pytest.raises(ConfigError, match="--data is for llava runs"):
        evaluate(vlm, data_file="records.jsonl")


def _tiny_llava_file(folder: Path) -> tuple[Path, Path]:
    """Four records of the demo set's images (an image pair, a video, one image and a two-turn
    conversation), as a JSONL file outside the image folder."""
    from loong_core.config.compose import cache_root
    from loong_vlm.data.llava_digits import demo_path

    demo = demo_path(cache_root())
    rows = [json.loads(line) for line in demo.read_text().splitlines()[:3]]
    image = rows[2]["image"]
    rows.append({"image": image, "messages": [
        {"role": "user", "content": "<image>\nWhich digit is this?"}, {"role": "assistant", "content": "6"},
        {"role": "user", "content": "Which digit is this?"}, {"role": "assistant", "content": "6"}]})
    path = folder / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, demo.parent


def test_qwen2_5_vl_run_answers_a_data_file_like_its_training_forward(qwen_run, tmp_path, one_process, capsys):
    from loong_vlm.data.llava_batch import collate_llava
    from loong_vlm.eval.loading import load_vlm
    from loong_vlm.eval.tasks import task_for
    from loong_vlm.eval.vqa import next_token_logits

    data_file, image_root = _tiny_llava_file(tmp_path)
    result = loong_json(capsys, "eval", "vqa", "--checkpoint", str(qwen_run), "--data", str(data_file), "--image-root",
                        str(image_root), "--show", "4", "--max-new-tokens", str(MAX_NEW))
    assert result["count"] == 4 and result["source"] == str(data_file)
    assert [row["expected"] for row in result["examples"]] == ["2 and 5", "9", "6", "6"]

    vlm = load_vlm(qwen_run)
    task = task_for(vlm.data)
    layout, vocab = vlm.data.layout, vlm.provider.config.foundation.vocab_size
    end_of_turn = vlm.data.tokenizer.tokenizer.token_to_id("<|im_end|>")
    records = task.records("valid", str(data_file), str(image_root))
    items = task.items("valid", None, str(data_file), str(image_root))
    for record, item, row in zip(records, items, result["examples"]):
        reply = np.flatnonzero(record.mask)
        start = int(reply[np.flatnonzero(np.diff(reply) > 1)[-1] + 1]) if np.any(np.diff(reply) > 1) \
            else int(reply[0])
        ids = np.asarray([*record.ids[:start], *row["got_ids"], end_of_turn], dtype=np.int64)
        # the training path: a padded, packed sample with its MRoPE ids and attention mask, pixels collated
        sample = layout.sample([replace(record, ids=ids, mask=np.zeros_like(ids))])
        batch = collate_llava([sample], layout.processor)
        visual = {k: batch[k] for k in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
                  if k in batch}
        with torch.no_grad():
            logits = vlm.model(batch["tokens"], batch["position_ids"],
                               with_attention_mask(batch).get("attention_mask"), **visual)
        prompt_end = len(layout.expanded(replace(record, ids=ids[:start], mask=np.zeros(start, np.int64)))[0])
        assert item.prompt == ids[:start].tolist()
        torch.testing.assert_close(next_token_logits(vlm, task.inputs([item], [item.prompt]))[0],
                                   logits[0, prompt_end - 1, :vocab], rtol=1e-5, atol=1e-5)
        predicted = _argmax_rows(logits, range(prompt_end - 1, prompt_end + len(row["got_ids"])), vocab)
        _check_against_forward(row["got_ids"], predicted, task.end_ids)


def test_bad_checkpoint_paths_name_the_fix(tmp_path):
    from loong_vlm.eval.loading import resolve_run

    with pytest.raises(ConfigError, match="does not exist; pass a run directory"):
        resolve_run(tmp_path / "missing")
    with pytest.raises(ConfigError, match="expected a run directory with config.yaml"):
        resolve_run(tmp_path)
    (tmp_path / "config.yaml").write_text("name: x\n")
    with pytest.raises(ConfigError, match="no complete checkpoint under checkpoints/"):
        resolve_run(tmp_path)
