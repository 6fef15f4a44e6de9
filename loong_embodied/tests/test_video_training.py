"""``loong train`` straight from a LeRobot v3.0 folder whose camera is an mp4 video feature (the
layout of LeRobot's hub datasets): the policy trains on the decoded frames."""

from __future__ import annotations

import pytest
import yaml

from loong_core.testing import losses, run_train

pytest.importorskip("av")

INDEX_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
ENV = {"LOONG_PLUGINS": "embodied"}


@pytest.fixture(scope="module")
def metaworld_video(lerobot_metaworld, tmp_path_factory):
    """The shipped Meta-World dataset with its camera re-encoded as mp4 video (one file per episode)."""
    from loong_embodied.lerobot.dataset import LeRobotDataset
    from loong_embodied.lerobot.writer import LeRobotWriter

    source = LeRobotDataset(lerobot_metaworld, float_images=False)
    features = {k: dict(v) for k, v in source.info.features.items() if k not in INDEX_COLUMNS}
    features["observation.image"]["dtype"] = "video"
    writer = LeRobotWriter(tmp_path_factory.mktemp("video") / "metaworld", fps=int(source.info.fps),
                           features=features, robot_type="sawyer")
    for position in range(source.num_episodes):
        for i in source.episode_frames(position):
            frame = source[int(i)]
            writer.add_frame({**{k: frame[k] for k in features}, "task": frame["task"]})
        writer.save_episode()
    return writer.finalize()


def _train(dataset, run_dir):
    run_train(["experiment=flow_policy_debug", f"data.path={dataset}", f"trainer.run_dir={run_dir}",
               "trainer.train_iters=3", "trainer.progress_bar=false", "trainer.tensorboard=false",
               "trainer.save_at_end=false"], env=ENV, timeout=300)
    return losses(run_dir)


def test_policy_trains_on_decoded_video_frames_like_on_the_png_images(metaworld_video, lerobot_metaworld, tmp_path):
    from loong_embodied.lerobot.format import read_info

    assert read_info(metaworld_video).features["observation.image"]["dtype"] == "video"
    video = _train(metaworld_video, tmp_path / "video")
    png = _train(lerobot_metaworld, tmp_path / "png")
    assert sorted(video) == sorted(png) == [1, 2, 3]
    # Same weights, batches and noise; only the pixels differ, by the codec's error (3-4 of 255):
    # measured 1e-7 apart (the action output layer starts at zero, so step 1 is equal).
    for step in video:
        assert video[step] == pytest.approx(png[step], rel=1e-4), (step, video, png)
    config = yaml.safe_load((tmp_path / "video" / "config.yaml").read_text())
    assert config["model"]["image_keys"] == ["observation.image"]   # the video camera feeds the policy
