"""bench.step_profile's own pieces (the callback runs whole through the entry point: tests/diagnostics/test_e2e)."""

from __future__ import annotations

import pytest

from altgrad.bench.step_profile import StepProfile, _ranged, _unranged


def test_a_ranged_method_runs_in_its_range_and_is_restored_after():
    class Hooked:
        def on_train_batch_end(self) -> str:
            return "ran"

    hooked = Hooked()
    undo = _ranged(hooked, "on_train_batch_end", "hook:Hooked.on_train_batch_end")
    assert "on_train_batch_end" in vars(hooked) and hooked.on_train_batch_end() == "ran"
    _unranged(*undo)
    assert "on_train_batch_end" not in vars(hooked) and hooked.on_train_batch_end() == "ran"
    own = lambda: "own"  # noqa: E731 - an instance attribute that was there before comes back as it was
    hooked.on_train_batch_end = own
    undo = _ranged(hooked, "on_train_batch_end", "x")
    assert hooked.on_train_batch_end is not own
    _unranged(*undo)
    assert hooked.on_train_batch_end is own


@pytest.mark.parametrize("start, steps", [(0, 20), (10, 0)])
def test_a_window_before_the_first_step_or_of_no_steps_is_refused(start, steps):
    with pytest.raises(ValueError, match="valid: start >= 1"):
        StepProfile(start=start, steps=steps)
