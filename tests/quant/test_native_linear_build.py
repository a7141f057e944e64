"""The native Linear extension's build (native.linear_ext): a failed build falls back to the Python node with the
same bits, is recorded in the cache and not tried again by later processes; concurrent builds of one source build it
once, and a build folder or lock left by a killed process blocks nothing."""

from __future__ import annotations

import copy
import shutil
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.utils.cpp_extension as cpp
from torch import nn

from altgrad.quant import QuantSpec, get_format, native
from altgrad.quant.layers import QuantLinear


def _e4m3_layer(lin: nn.Linear) -> QuantLinear:
    return QuantLinear(copy.deepcopy(lin), "layer", weight=QuantSpec(get_format("e4m3")),
                       input=QuantSpec(get_format("e4m3"), rounding="stochastic"), grad=QuantSpec(get_format("e5m2")))


def _train_call(layer: QuantLinear, x0: torch.Tensor, g: torch.Tensor) -> list[torch.Tensor]:
    x = x0.clone().requires_grad_(True)
    torch.manual_seed(3)
    y = layer(x)
    y.backward(g)
    return [y.detach(), x.grad, layer.weight.grad, layer.bias.grad, *[b.clone() for b in layer.buffers()]]


def _bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.filterwarnings("default")
def test_a_failed_build_falls_back_with_the_same_bits_and_is_not_tried_again(monkeypatch: pytest.MonkeyPatch,
                                                                               tmp_path: Path) -> None:
    if native.kernel() is None or shutil.which("ninja") is None:
        pytest.skip("no native kernel or no ninja here: nothing is built")
    torch.manual_seed(0)
    lin = nn.Linear(16, 8)
    x0, g = torch.randn(5, 16), torch.randn(5, 8)
    real = native.linear_ext()
    reference = _train_call(_e4m3_layer(lin), x0, g)  # the C++ node where the extension is built
    broken = tmp_path / "native_linear.cpp"
    broken.write_text("#error a source that does not compile\n")
    monkeypatch.setattr(native, "LINEAR_SOURCE", broken)  # another source: another name, not in the cache
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_LINEAR", [])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layer = _e4m3_layer(lin)
        got = _train_call(layer, x0, g)
    said = [str(w.message) for w in caught if "native Linear extension" in str(w.message)]
    assert native.linear_ext() is None and len(said) == 1 and "RuntimeError" in said[0], said
    assert layer(x0.requires_grad_(True)).grad_fn.name() == "QuantLinearFunctionBackward"
    assert all(_bits(a, b) for a, b in zip(got, reference))
    failed = list((tmp_path / "cache" / "altgrad" / "native").glob("altgrad_quant_linear_*/failed"))
    assert len(failed) == 1 and "a source that does not compile" in failed[0].read_text()
    assert not list(failed[0].parent.glob("build-*"))  # the private build folder is gone

    def built_again(*args: object, **kwargs: object) -> None:
        raise AssertionError("a recorded failure was built again")

    monkeypatch.setattr(cpp, "load", built_again)
    monkeypatch.setattr(native, "_LINEAR", [])  # a later process: it reads the record and warns at once
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert native.linear_ext() is None
    said = [str(w.message) for w in caught if "native Linear extension" in str(w.message)]
    assert len(said) == 1 and "failed before" in said[0] and str(failed[0].parent) in said[0], said
    assert real is not None or native.linear_ext() is None


def test_concurrent_builds_build_once_and_leftovers_block_nothing(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    """Two builders of one source at once (a sweep's jobs starting together): one builds, the other waits on the
    lock and then finds the library; a lock file and build folder left by a killed process are no obstacle (flock
    is released with its process)."""
    if native.fcntl is None:
        pytest.skip("no flock here")
    name = "altgrad_quant_linear_test"
    folder = tmp_path / name
    (folder / "build-left-by-a-killed-process").mkdir(parents=True)
    (folder / "build.lock").write_text("")
    built, failed = folder / f"{name}.so", folder / "failed"
    calls: list[str] = []

    def fake_load(module_name: str, sources: list[str], extra_cflags: list[str], build_directory: str,
                  verbose: bool) -> object:
        calls.append(build_directory)
        time.sleep(0.3)  # long enough for the second builder to be waiting on the lock
        Path(build_directory, f"{module_name}.so").write_bytes(b"library")
        return "module"

    monkeypatch.setattr(cpp, "load", fake_load)
    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(native._build_linear(name, folder, built, failed)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and sorted(results, key=str) == [None, "module"]
    assert built.read_bytes() == b"library" and not failed.exists()
    assert sorted(p.name for p in folder.iterdir()) == sorted(["build-left-by-a-killed-process", "build.lock",
                                                                built.name])


@pytest.mark.filterwarnings("default")
@pytest.mark.parametrize("missing", ["compiler", "ninja"])
def test_a_missing_tool_warns_once_and_records_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                       missing: str) -> None:
    """No compiler (so no kernel either) or no ninja: one warning naming it, and nothing written to the cache (the
    next process looks again: the tool may have been installed meanwhile)."""
    if native.kernel() is None:
        pytest.skip("no native kernel here")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(native, "_LINEAR", [])
    if missing == "compiler":
        monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
        monkeypatch.setattr(native, "_KERNEL", [])
    else:
        real_which = shutil.which
        monkeypatch.setattr(native.shutil, "which", lambda cmd, *a, **k: None if cmd == "ninja" else real_which(cmd))
        monkeypatch.setattr(native, "LINEAR_SOURCE", tmp_path / "native_linear.cpp")  # not in any cache
        native.LINEAR_SOURCE.write_text("// not built\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert native.linear_ext() is None and native.linear_ext() is None
    said = [str(w.message) for w in caught if "native Linear extension" in str(w.message)]
    assert len(said) == 1 and ("native kernel is unavailable" if missing == "compiler" else "no ninja") in said[0]
    assert not list(tmp_path.rglob("failed")) and not list(tmp_path.rglob("altgrad_quant_linear_*"))
