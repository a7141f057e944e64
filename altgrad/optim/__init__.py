"""ULP-aware optimizers (ManifoldAdamW, GridOptim), the Madam anchor, the relative-step control (RelativeAdamW),
and the config-driven factory."""

from altgrad.optim.base import QuantAwareOptimizer
from altgrad.optim.factory import build_optimizer, weight_decay_groups
from altgrad.optim.grid import GridOptim
from altgrad.optim.grid_walk import grid_ordinal, ordinal_value, walk
from altgrad.optim.madam import Madam
from altgrad.optim.manifold import ManifoldAdamW
from altgrad.optim.relative import RelativeAdamW
from altgrad.optim.stiffness import STIFFNESS_KINDS, Grid, stiffness

__all__ = [
    "STIFFNESS_KINDS",
    "Grid",
    "GridOptim",
    "Madam",
    "ManifoldAdamW",
    "QuantAwareOptimizer",
    "RelativeAdamW",
    "build_optimizer",
    "grid_ordinal",
    "ordinal_value",
    "stiffness",
    "walk",
    "weight_decay_groups",
]
