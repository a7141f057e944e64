"""Lightning callbacks: FakeQuantCallback (surgery + storage policy) and one diagnostics instrument per module.

stability, activations, gradients, flips, bits, rank, attention, divergence, fallback (optional), range_clip
(optional); shared plumbing in base.py (intervals, names, logging) and probe.py (side passes that change nothing).
"""
