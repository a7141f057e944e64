"""Named experiments as Hydra multiruns: their grids and job dirs (plan), reruns that skip finished jobs (resume),
the tuned learning rate of every (format, arm) cell of a tuning sweep (lr_pick) and the table it goes into
(lr_table), and the resumable study driver (study)."""
