"""Named experiments as Hydra multiruns: their grids and job dirs (plan), reruns that skip finished jobs (resume),
and the learning rates lr_scan picks for the other experiments (lr_pick)."""
