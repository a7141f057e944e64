"""Suite-wide: calls stay on the shape-generic compiled functions unless a test switches per-shape compiles on.

``fused`` counts a signature's calls per process, so over a whole suite a common shape passes
``ALTGRAD_STATIC_AFTER`` in whichever test happens to run then and pays a ~1-3 s compile there (87 s over the suite,
measured). tests/quant/test_fused_static.py switches the static road on where it is the subject; an explicit
``ALTGRAD_STATIC_AFTER`` in the environment (e.g. ``ALTGRAD_STATIC_AFTER=1 make test-gpu``) is respected.
"""

import os

import altgrad.quant.fused as fused

if "ALTGRAD_STATIC_AFTER" not in os.environ:
    fused.STATIC_AFTER = 0
