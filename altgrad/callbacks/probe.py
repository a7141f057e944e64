"""Side passes on the current batch that leave training exactly as it was: probes and shadow passes.

A probe calls the backbone's own ``forward`` (never the compiled ``__call__`` of a compiled model, so that graph is
neither recompiled nor broken by the temporary hooks) on a few sequences of the batch; the quantizers inside keep
their fused kernels. A shadow pass runs with every quantizer switched off under
``torch.compiler.set_stance("force_eager")`` (switched-off quantizers are identities, so nothing fused is lost).
Quantizer state (stats, amax histories: every buffer), the global RNG streams and the train/eval mode are restored
afterwards, so the next training step computes what it would have computed without the side pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import lightning as L
import torch
from torch import nn

from torch.utils.hooks import RemovableHandle

from altgrad.callbacks.base import Instrument, to_floats
from altgrad.quant.fake_quant import GradQuantizer, TensorQuantizer


def quantizers(model: nn.Module) -> list[nn.Module]:
    """Every TensorQuantizer and GradQuantizer inside the model."""
    return [m for m in model.modules() if isinstance(m, (TensorQuantizer, GradQuantizer))]


@contextmanager
def preserved_quantizer_state(model: nn.Module) -> Iterator[None]:
    """Snapshot every quantizer buffer and restore it on exit (probes must not advance scaler histories)."""
    saved = [(b, b.detach().clone()) for q in quantizers(model) for b in q.buffers(recurse=True)]
    try:
        yield
    finally:
        with torch.no_grad():
            for buf, copy in saved:
                buf.copy_(copy)


@contextmanager
def quantization_disabled(model: nn.Module) -> Iterator[None]:
    """Every quantizer switched to identity (``enabled = False``) inside the block, restored on exit."""
    qs = quantizers(model)
    flags = [q.enabled for q in qs]
    try:
        for q in qs:
            q.enabled = False
        yield
    finally:
        for q, flag in zip(qs, flags):
            q.enabled = flag


@contextmanager
def preserved_rng(device: torch.device) -> Iterator[None]:
    """Restore the CPU (and the accelerator's) RNG state on exit, so side passes do not shift the training stream."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        yield


def capture_rng(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The RNG state a training step starts from (to replay the same dropout masks in a shadow pass)."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def restore_rng(state: tuple[torch.Tensor, torch.Tensor | None], device: torch.device) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)


def split_batch(batch: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(inputs, targets) of a language-model batch: a (x, y) pair, a dict with x/y-like keys, or inputs alone."""
    if isinstance(batch, (tuple, list)):
        if len(batch) >= 2:
            return batch[0], batch[1]
        return batch[0], None
    if isinstance(batch, dict):
        for xk, yk in (("x", "y"), ("idx", "targets"), ("input_ids", "labels"), ("inputs", "targets")):
            if xk in batch:
                return batch[xk], batch.get(yk)
        raise ValueError(f"cannot find inputs in a batch dict with keys {sorted(batch)}; "
                         "valid: x/y, idx/targets, input_ids/labels, inputs/targets")
    if isinstance(batch, torch.Tensor):
        return batch, None
    raise ValueError(f"cannot read a batch of type {type(batch).__name__}; valid: (x, y) tuple, dict or tensor")


def forward_context(trainer: L.Trainer | None) -> Any:
    """The precision plugin's autocast context, so side passes compute in the training step's precision."""
    plugin = getattr(trainer, "precision_plugin", None)
    return nullcontext() if plugin is None else plugin.forward_context()


def eager() -> Any:
    """Run compiled code eagerly inside the block (no compilation, no recompilation, no guards)."""
    return torch.compiler.set_stance("force_eager")


@contextmanager
def probe(trainer: L.Trainer | None, model: nn.Module) -> Iterator[None]:
    """Eval mode, no grad, training precision; quantizer state, RNG and mode restored afterwards.

    Inside, run the model with :func:`probe_forward`.
    """
    device = next(model.parameters()).device
    was_training = model.training
    try:
        with preserved_rng(device), preserved_quantizer_state(model), torch.no_grad(), forward_context(trainer):
            model.eval()
            yield
    finally:
        model.train(was_training)


def probe_forward(model: nn.Module, x: torch.Tensor) -> Any:
    """``model.forward(x)``: the model's Python forward, bypassing a compiled ``__call__`` (hooks on submodules
    still fire; top-level hooks of ``model`` itself do not)."""
    return model.forward(x)


def probe_inputs(batch: Any, max_sequences: int) -> torch.Tensor:
    """The first ``max_sequences`` input sequences of the batch."""
    x, _ = split_batch(batch)
    return x[:max_sequences]


class ProbeInstrument(Instrument):
    """An Instrument that measures through temporary forward hooks during a probe of the batch's first
    ``max_sequences`` sequences."""

    def __init__(self, every_n_steps: int = 50, max_sequences: int = 4) -> None:
        super().__init__(every_n_steps)
        if int(max_sequences) < 1:
            raise ValueError(f"{type(self).__name__}.max_sequences={max_sequences} is not valid; valid: integer >= 1")
        self.max_sequences = int(max_sequences)

    def probe_with_hooks(self, trainer: L.Trainer | None, model: nn.Module, batch: Any,
                         hooks: Callable[[dict[str, torch.Tensor]], Iterable[RemovableHandle]]) -> dict[str, float]:
        """Register ``hooks(values)`` (they fill ``values``), run one probe forward, remove every hook (also when
        registering or the forward fails) and return the values as floats."""
        values: dict[str, torch.Tensor] = {}
        handles: list[RemovableHandle] = []
        try:
            handles.extend(hooks(values))
            with probe(trainer, model):
                probe_forward(model, probe_inputs(batch, self.max_sequences))
        finally:
            for h in handles:
                h.remove()
        return to_floats(values)
