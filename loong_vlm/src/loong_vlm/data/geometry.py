"""The vision geometry a dynamic-resolution dataset cuts its patches with must be the model's."""

from __future__ import annotations

from typing import Any

from loong_core.errors import ConfigError

#: Model-override keys of the geometry (the encoder / projector config's name -> ``data.<key>``),
#: as :meth:`loong_vlm.data.llava.LlavaDataModule.model_overrides` reports them.
GEOMETRY_KEYS = {"patch_size": "patch_size", "temporal_patch_size": "temporal_patch_size",
                 "spatial_merge_size": "merge_size", "tokens_per_second": "tokens_per_second",
                 "mrope_positions": "mrope", "video_layout": "video_layout", "tile_size": "tile_size",
                 "image_processing": "image_processing"}

#: Video layout of a VLM config that does not name one (``video_layout`` class attribute).
DEFAULT_VIDEO_LAYOUT = "qwen2_5"


def pop_geometry(overrides: dict[str, Any]) -> dict[str, Any]:
    """Remove and return the geometry entries of a data module's model overrides."""
    return {key: overrides.pop(key) for key in list(overrides) if key in GEOMETRY_KEYS}


def check_vision_geometry(model: Any, geometry: dict[str, Any]) -> None:
    """Raise unless the model's encoder, projector and foundation read what the data produces.

    Args:
        model: The VLM config (``encoder``, ``projector``, ``foundation``).
        geometry: From :func:`pop_geometry`; empty for datasets of fixed-size images.

    Raises:
        ConfigError: The encoder takes fixed-size images, a size differs, the data's position
            ids (MRoPE or not) do not suit the foundation, or the data lays out videos for another
            model family; the message says what to set.
    """
    if not geometry:
        return
    encoder = model.encoder
    geometry = dict(geometry)
    processing = geometry.pop("image_processing", None)
    wanted_processing = getattr(encoder, "image_processing", None)  # encoders that read one kind only
    if processing is not None and wanted_processing is not None and processing != wanted_processing:
        raise ConfigError(f"data.image_processing = {processing} but model.encoder.name={encoder.name!r} reads "
                          f"{wanted_processing} patches; set data.image_processing={wanted_processing}.")
    if processing == "navit":
        clip, frames = geometry.pop("temporal_patch_size", 1), getattr(encoder, "num_frame_embeddings", None)
        if frames is not None and clip != frames:
            raise ConfigError(f"data.temporal_patch_size = {clip} frames per video clip but "
                              f"model.encoder.num_frame_embeddings = {frames}; set data.temporal_patch_size={frames}.")
    tile = geometry.pop("tile_size", None)
    if tile is not None:  # fixed-size tiles (data.image_processing=tiles)
        if getattr(encoder, "dynamic_resolution", False):
            raise ConfigError(
                f"data.image_processing = tiles but model.encoder.name={getattr(encoder, 'name', '?')!r} reads "
                "dynamic-resolution patches; set data.image_processing=dynamic.")
        if getattr(encoder, "image_size", tile) != tile:
            raise ConfigError(f"data.tile_size = {tile} but model.encoder.image_size = {encoder.image_size}; set "
                              f"data.tile_size={encoder.image_size}.")
    elif not getattr(encoder, "dynamic_resolution", False):
        raise ConfigError(
            f"the dataset cuts images into dynamic-resolution patches (pixel_values + image_grid_thw) but "
            f"model.encoder.name={getattr(encoder, 'name', '?')!r} takes fixed-size images; use a "
            "dynamic-resolution encoder (for example model=qwen2_5_vl_debug), data.image_processing=tiles "
            "for a fixed-size encoder, or a fixed-size dataset.")
    mrope = geometry.pop("mrope_positions", None)
    uses_mrope = getattr(model.foundation, "position_embedding_type", None) == "mrope"
    if mrope is not None and bool(mrope) != uses_mrope:
        raise ConfigError(f"data.mrope = {bool(mrope)} but the foundation's position_embedding_type is "
                          f"{getattr(model.foundation, 'position_embedding_type', None)!r}; set "
                          f"data.mrope={str(uses_mrope).lower()}.")
    layout = geometry.pop("video_layout", None)
    wanted = getattr(model, "video_layout", DEFAULT_VIDEO_LAYOUT)
    if layout is not None and layout != wanted:
        raise ConfigError(f"data.video_layout = {layout} but model.name={getattr(model, 'name', '?')!r} reads videos "
                          f"laid out the {wanted} way (timestamps, frame grouping and position ids differ); set "
                          f"data.video_layout={wanted}.")
    for key, value in geometry.items():
        for part in ("encoder", "projector"):
            config = getattr(model, part)
            if not hasattr(config, key) or getattr(config, key) == value:
                continue
            data_key = GEOMETRY_KEYS[key]
            raise ConfigError(
                f"data.{data_key} = {value} but model.{part}.{key} = {getattr(config, key)}: the data must "
                f"cut patches the way the model reads them; set data.{data_key}={getattr(config, key)}.")
