"""mp4 video features: decode the frames at given timestamps (PyAV), and encode episodes.

PyAV is optional (``pip install 'loong-embodied[video]'``); datasets whose cameras are embedded
images never need it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from loong_core.errors import MissingDependencyError
from loong_embodied.lerobot.format import LeRobotFormatError

# LeRobot's tolerance between a requested timestamp and the decoded frame's.
DEFAULT_TOLERANCE_S = 1e-4


def _av():
    try:
        import av
    except ImportError:
        raise MissingDependencyError("av", "loong-embodied[video]", "decoding mp4 video features") from None
    return av


class VideoDecoder:
    """Random access to frames of mp4 files by timestamp; keeps each file open once opened.

    Args:
        tolerance_s: Largest allowed distance between a requested and a decoded timestamp.
    """

    def __init__(self, tolerance_s: float = DEFAULT_TOLERANCE_S):
        self.tolerance_s = tolerance_s
        self._containers: dict[Path, object] = {}

    def _open(self, path: Path):
        if path not in self._containers:
            if not path.is_file():
                raise LeRobotFormatError(f"video file {path} does not exist")
            self._containers[path] = _av().open(str(path))
        return self._containers[path]

    def frames(self, path: Path, timestamps: list[float]) -> np.ndarray:
        """Frames ``[len(timestamps), H, W, 3]`` uint8 closest to ``timestamps`` (seconds)."""
        container = self._open(path)
        stream = container.streams.video[0]
        out = []
        for ts in timestamps:
            container.seek(max(0, int(ts / stream.time_base)), stream=stream, backward=True, any_frame=False)
            best, best_gap = None, float("inf")
            for frame in container.decode(stream):
                gap = abs(frame.time - ts)
                if gap < best_gap:
                    best, best_gap = frame, gap
                if frame.time > ts + self.tolerance_s:
                    break
            if best is None or best_gap > self.tolerance_s:
                raise LeRobotFormatError(
                    f"{path}: no frame within {self.tolerance_s}s of t={ts:.4f}s (closest is "
                    f"{best_gap:.4f}s away); the video and the parquet timestamps disagree")
            out.append(best.to_ndarray(format="rgb24"))
        return np.stack(out)

    def close(self) -> None:
        """Close every open file."""
        for container in self._containers.values():
            container.close()
        self._containers.clear()


def encode_video(frames: np.ndarray, path: Path, fps: float, codec: str = "auto") -> dict:
    """Write ``[N, H, W, 3]`` uint8 frames to an mp4 whose frame ``i`` has time ``i / fps``.

    Args:
        frames: The episode's frames.
        path: Output file (its folder is created).
        fps: Frame rate (integer rates encode exactly).
        codec: An ffmpeg encoder; ``auto`` tries ``libsvtav1``, ``libx264`` then ``mpeg4``.

    Returns:
        The ``info`` entry LeRobot keeps for a video feature (``video.codec``, ``video.fps``...).
    """
    from fractions import Fraction

    os.environ.setdefault("SVT_LOG", "1")   # SVT-AV1 prints its configuration to stderr otherwise
    av = _av()
    path.parent.mkdir(parents=True, exist_ok=True)
    candidates = ("libsvtav1", "libx264", "mpeg4") if codec == "auto" else (codec,)
    for name in candidates:
        try:
            av.codec.Codec(name, "w")
            break
        except Exception:  # noqa: BLE001 - PyAV raises several types for an unknown encoder
            continue
    else:
        raise LeRobotFormatError(f"none of the video encoders {candidates} is available in PyAV")
    height, width = frames.shape[1:3]
    with av.open(str(path), "w") as container:
        stream = container.add_stream(name, rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if name == "libx264":
            stream.options = {"crf": "18", "g": "2"}
        elif name == "libsvtav1":
            stream.options = {"crf": "30", "g": "2"}
        else:
            stream.options = {"qscale": "2", "g": "2"}
        for i, frame in enumerate(frames):
            video_frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
            video_frame.pts = i
            container.mux(stream.encode(video_frame))
        container.mux(stream.encode())
    return {"video.height": int(height), "video.width": int(width), "video.codec": name,
            "video.pix_fmt": "yuv420p", "video.is_depth_map": False, "video.fps": fps,
            "video.channels": 3, "has_audio": False}
