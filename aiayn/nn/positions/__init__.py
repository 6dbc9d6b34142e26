"""Position schemes (§3.5 and after): each in its own module, chosen by name through
aiayn/registry.py; see ``aiayn.nn.positions.base`` for the interface."""

from aiayn import registry
from aiayn.config import ModelConfig
from aiayn.nn.positions.base import (
    NO_POSITIONS,
    PositionScheme,
    PositionSizes,
    PositionState,
    check_positions,
)
from aiayn.nn.positions.learned import LearnedPositions
from aiayn.nn.positions.rope import RotaryEmbedding, apply_rotary, rotate_half
from aiayn.nn.positions.sinusoidal import SinusoidalPositions, sinusoidal_table


def build_positions(config: ModelConfig) -> PositionScheme:
    """The scheme ``config.positions.scheme`` names, for the model's sizes."""
    scheme_class = registry.resolve("positional", config.positions.scheme)
    scheme: PositionScheme = scheme_class(config.positions, PositionSizes.of(config))
    return scheme


__all__ = [
    "NO_POSITIONS",
    "LearnedPositions",
    "PositionScheme",
    "PositionSizes",
    "PositionState",
    "RotaryEmbedding",
    "SinusoidalPositions",
    "apply_rotary",
    "build_positions",
    "check_positions",
    "rotate_half",
    "sinusoidal_table",
]
