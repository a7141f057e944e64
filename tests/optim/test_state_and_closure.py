"""Every optimizer: save → load → continue is bitwise identical to not stopping; step(closure) runs the closure."""

from __future__ import annotations

import io
from collections.abc import Callable

import lightning as L
import pytest
import torch
from optim_helpers import PLAIN, TinyNet

from altgrad.optim import GridOptim, Madam, ManifoldAdamW, RelativeAdamW
from altgrad.quant.layers import weight_grids

FACTORIES: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "manifold[update]": lambda params, grids: ManifoldAdamW(params, lr=0.5, weight_decay=0.1, grids=grids, **PLAIN),
    "manifold[grad,smooth]": lambda params, grids: ManifoldAdamW(params, lr=1e-2, stiffness_on="grad",
                                                                 stiffness_kind="smooth", grids=grids, **PLAIN),
    "grid[adam]": lambda params, grids: GridOptim(params, lr=0.7, weight_decay=0.1, seed=4, grids=grids, **PLAIN),
    "grid[sgd,real]": lambda params, grids: GridOptim(params, lr=0.05, inner="sgd", lr_unit="real", seed=4,
                                                      grids=grids, **PLAIN),
    "madam": lambda params, grids: Madam(params, lr=0.05, grids=grids, **PLAIN),
    "relative": lambda params, grids: RelativeAdamW(params, lr=0.05, weight_decay=0.1, grids=grids,
                                                    plain_weight_decay=0.1, **PLAIN),
}
BATCHES = [torch.randint(0, 11, (4, 9), generator=torch.Generator().manual_seed(i)) for i in range(8)]


def build(name: str) -> tuple[TinyNet, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = TinyNet()
    return model, FACTORIES[name](model.parameters(), weight_grids(model))


def train(model: TinyNet, opt: torch.optim.Optimizer, batches: list[torch.Tensor]) -> None:
    for idx in batches:
        def closure(idx: torch.Tensor = idx) -> torch.Tensor:
            opt.zero_grad()
            loss = model.loss(idx)
            loss.backward()
            return loss

        opt.step(closure)


@pytest.mark.parametrize("name", list(FACTORIES))
def test_save_load_continue_is_bitwise_identical(name):
    model, opt = build(name)
    train(model, opt, BATCHES)
    straight = {k: v.clone() for k, v in model.state_dict().items()}

    model, opt = build(name)
    train(model, opt, BATCHES[:4])
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=True)  # what Lightning does by default
    model, opt = build(name)
    model.load_state_dict(checkpoint["model"])
    opt.load_state_dict(checkpoint["optimizer"])
    train(model, opt, BATCHES[4:])
    resumed = model.state_dict()
    assert straight.keys() == resumed.keys()
    for key, value in straight.items():
        assert torch.equal(value, resumed[key]), key
    assert any(not torch.equal(value, build(name)[0].state_dict()[key]) for key, value in straight.items())


def test_grid_state_dict_carries_the_generator_state():
    model, opt = build("grid[adam]")
    train(model, opt, BATCHES[:1])
    rng = opt.state_dict()["rng"]
    assert rng["seed"] == 4 and set(rng["generators"]) == {"cpu"}
    assert rng["generators"]["cpu"].dtype == torch.uint8


@pytest.mark.parametrize("name", list(FACTORIES))
def test_step_calls_the_closure_with_grad_enabled_and_returns_its_loss(name):
    model, opt = build(name)
    calls = []

    def closure() -> torch.Tensor:
        calls.append(torch.is_grad_enabled())
        opt.zero_grad()
        loss = model.loss(BATCHES[0])
        loss.backward()
        return loss

    with torch.no_grad():
        loss = opt.step(closure)
    assert calls == [True] and isinstance(loss, torch.Tensor) and torch.isfinite(loss)


class TinyModule(L.LightningModule):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.net = TinyNet()
        self.name = name
        self.seen = 0

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.seen += 1
        return self.net.loss(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return FACTORIES[self.name](self.parameters(), weight_grids(self))


@pytest.mark.parametrize("name", ["manifold[update]", "grid[adam]", "madam", "relative"])
def test_lightning_trains_through_the_closure(name, tmp_path):
    torch.manual_seed(0)
    module = TinyModule(name)
    before = [p.detach().clone() for p in module.parameters()]
    data = torch.utils.data.TensorDataset(torch.stack(BATCHES).flatten(0, 1))
    trainer = L.Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    assert module.seen == 3 and trainer.global_step == 3
    assert all(not torch.equal(b, p.detach()) for b, p in zip(before, module.parameters()))
