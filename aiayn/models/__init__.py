"""The three model families, built from one block (see aiayn/nn/blocks.py)."""

from __future__ import annotations

from typing import Any

from aiayn.config import ModelConfig, get_preset
from aiayn.errors import UserError
from aiayn.models.base import TransformerModel
from aiayn.models.decoder import DecoderLM
from aiayn.models.encoder import EncoderLM
from aiayn.models.encoder_decoder import EncoderDecoder

_FAMILIES: dict[str, type[TransformerModel]] = {
    "encoder-decoder": EncoderDecoder,
    "decoder": DecoderLM,
    "encoder": EncoderLM,
}


def resolve_config(preset_or_config: str | ModelConfig, **overrides: Any) -> ModelConfig:
    if isinstance(preset_or_config, ModelConfig):
        return preset_or_config.replace(**overrides) if overrides else preset_or_config
    if isinstance(preset_or_config, str):
        return get_preset(preset_or_config, **overrides)
    raise UserError(
        f"expected a preset name or a ModelConfig, got {type(preset_or_config).__name__}"
    )


def build_model(preset_or_config: str | ModelConfig, **overrides: Any) -> TransformerModel:
    """Build a model from a preset name (see ``aiayn.presets``) or a config.

    ``overrides`` are ModelConfig settings in any spelling (``ModelConfig.replace``), e.g.
    ``build_model("paper-base", n_layers=2)``.
    """
    config = resolve_config(preset_or_config, **overrides)
    model: TransformerModel
    if config.vision.image_size is not None:  # the Vision Transformer (aiayn/models/vision.py)
        from aiayn.models.vision import VisionTransformer

        model = VisionTransformer(config)
    elif config.rnn.cell is not None:  # the recurrent baselines (aiayn/models/rnn.py)
        from aiayn.models.rnn import RNNEncoderDecoder

        model = RNNEncoderDecoder(config)
    else:
        model = _FAMILIES[config.arch](config)
    if config.quantization == "int8":  # int8 weights, loaded as saved (aiayn/nn/quantized.py)
        from aiayn.nn.quantized import int8_structure

        int8_structure(model)
    return model


__all__ = [
    "DecoderLM",
    "EncoderDecoder",
    "EncoderLM",
    "TransformerModel",
    "build_model",
    "resolve_config",
]
