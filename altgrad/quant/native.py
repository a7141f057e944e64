"""The CPU float32 road of a quantizer call: native_kernel.cpp, built once per machine with the system C++ compiler.

A whole call (amax → scale → quantize(x·s)/s → statistics, new scaler state) runs as one C function on a
contiguous float32 CPU tensor, bit for bit what the torch kernel computes (tests/quant/test_native.py), with no
dynamo trace or guard check per process or per call. The shared library is compiled by ``$CXX`` (default ``c++``)
with the flags below, through a subprocess, and loaded with ctypes; it is cached on disk under
``${XDG_CACHE_HOME:-~/.cache}/altgrad/native/`` keyed by the source, the enum table (kernel_abi.py, written beside
it as kernel_abi.h), compiler, flags and machine, so a later process only loads it. Whether a quantizer takes this
road is the run's ``quant.kernel`` (``auto``: here where it serves; see fake_quant.choose_road). Where the build
fails, ``kernel()`` warns once and returns None (``auto`` then takes the compiled road); ``require()`` raises with
the reason.

``linear_ext()`` is the torch side of the same road (native_linear.cpp, built by torch.utils.cpp_extension, which
needs ninja, once per machine and torch version, cached beside the kernel): a quantizer call from Python without
ctypes' argument conversion (``Plan``), and a quantized Linear's training call as one C++ autograd node; both call
this kernel through its address. Where it cannot be built, it warns once and the calls go through ctypes
(``CallPlan``) and QuantLinear's Python node: the same bits, more Python per call.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from types import ModuleType

import torch

from altgrad.quant import kernel_abi

try:
    import fcntl
except ImportError:  # Unix only: elsewhere concurrent builds are not serialized (each renames a whole file in)
    fcntl = None

SOURCE = Path(__file__).with_name("native_kernel.cpp")
FLAGS = ("-O3", "-march=native", "-fno-fast-math", "-ffp-contract=off", "-fopenmp", "-std=c++17", "-shared",
         "-fPIC")
ROUNDING_CODES = {name: i for i, name in enumerate(kernel_abi.ROUNDINGS)}
VARIANT_FLAGS = {name: kernel_abi.flag(name) for name in kernel_abi.VARIANT_FLAGS}
KINDS = {name: i for i, name in enumerate(kernel_abi.SCALE_KINDS)}  # scale kinds the kernel computes (or is given)
MAX_NUMEL = 2**31  # the stochastic hash counts elements in int32


def _compiler() -> str:
    return os.environ.get("CXX", "c++")


def _machine() -> str:
    """What ``-march=native`` depends on: the architecture and, on Linux, the CPU's model and feature flags."""
    parts = [platform.machine()]
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                parts.append(line)
            if len(parts) >= 3:
                break
    except OSError:
        parts.append(platform.processor())
    return "\n".join(parts)


def cache_dir() -> Path:
    """Where built kernels are kept: ``${XDG_CACHE_HOME:-~/.cache}/altgrad/native``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "altgrad" / "native"


def _library_path(compiler_path: str) -> Path:
    """The cache file of this source built by this compiler binary (path, size, mtime) with FLAGS on this machine."""
    st = os.stat(compiler_path)
    key = hashlib.sha256("\0".join([SOURCE.read_text(), kernel_abi.header(), compiler_path, str(st.st_size),
                                    str(st.st_mtime_ns), " ".join(FLAGS), _machine()]).encode()).hexdigest()[:24]
    return cache_dir() / f"quant-{key}.so"


def _build(compiler_path: str, target: Path, flags: tuple[str, ...] = FLAGS) -> None:
    """Compile SOURCE (with the generated kernel_abi.h) into ``target`` atomically (a temporary file in the same
    folder, then a rename); ``flags``: FLAGS, or a variant of them (the tests build the eight-lane road too)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        with tempfile.TemporaryDirectory(prefix="altgrad-abi-") as include:
            Path(include, "kernel_abi.h").write_text(kernel_abi.header())
            done = subprocess.run([compiler_path, *flags, "-I", include, "-o", tmp, str(SOURCE)],
                                  capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{compiler_path} exited with {done.returncode}: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


class NativeKernel:
    """The loaded library: ``call`` runs one quantizer call, ``flip_sums`` the flips diagnostic's per-segment
    sums, ``gather`` its tracked weights, ``magnitude_range`` a tensor's finite |x| ends (range use), ``bits_pass``
    the bits diagnostic's code indices and stiffness, ``stiff_adam_step`` one tensor's ManifoldAdamW / RelativeAdamW
    step, all on raw pointers (see native_kernel.cpp)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        lib = ctypes.CDLL(str(path))
        fn = lib.altgrad_quant_call
        p, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
        fn.argtypes = [p, p, i64, p, ctypes.c_int, ctypes.c_int, i32, ctypes.c_int, ctypes.c_int, p, p, p, i64,
                       ctypes.c_int, ctypes.c_int, p, ctypes.c_int, p]
        fn.restype = ctypes.c_int
        self.call = fn
        self.address = ctypes.cast(fn, ctypes.c_void_p).value  # what native_linear.cpp's plans call
        sums = lib.altgrad_flip_sums
        sums.argtypes = [p, p, p, p, p, p, i64, p]
        sums.restype = None
        self.flip_sums = sums
        gather = lib.altgrad_gather
        gather.argtypes = [i64, p, p, p, p, p, p]
        gather.restype = None
        self.gather = gather
        ends = lib.altgrad_magnitude_range
        ends.argtypes = [p, i64, p]
        ends.restype = None
        self.magnitude_range = ends
        bits = lib.altgrad_bits_pass
        bits.argtypes = [p, p, p, i64, ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_float, i32, p, p]
        bits.restype = None
        self.bits_pass = bits
        step = lib.altgrad_stiff_adam_step
        step.argtypes = [p, p, p, p, i64, ctypes.c_int, ctypes.c_int, p, ctypes.c_double, ctypes.c_double, i32, i32,
                         ctypes.c_int, ctypes.c_int, p, p, p, i64, ctypes.c_int, ctypes.c_int]
        step.restype = ctypes.c_int
        self.stiff_adam_step = step
        self.lanes = int(lib.altgrad_lanes())
        abi = lib.altgrad_abi
        abi.restype = ctypes.c_char_p
        self.abi = abi().decode()
        if self.abi != kernel_abi.describe():
            raise RuntimeError(f"{path} was built with another enum table ({self.abi!r}); delete it to rebuild")
        self._lib = lib


# [] = not tried yet; [kernel] = loaded; [None, reason] = unavailable in this process, and why
_KERNEL: list = []


def _load() -> None:
    found, reason = None, ""
    try:
        compiler = shutil.which(_compiler())
        if compiler is None:
            raise RuntimeError(f"no C++ compiler {_compiler()!r} on PATH (set CXX to one)")
        path = _library_path(compiler)
        if not path.exists():
            _build(compiler, path)
        found = NativeKernel(path)
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        reason = f"{type(err).__name__}: {err}"
        warnings.warn(f"altgrad.quant: the native CPU kernel is unavailable ({reason}); CPU float32 quantization "
                      "takes the compiled torch road", stacklevel=4)
    _KERNEL[:] = [found] if found is not None else [None, reason]


def kernel() -> NativeKernel | None:
    """The native kernel, built or loaded once per process; None where it cannot be built (one warning then says
    why; ``quant.kernel=auto`` takes the compiled torch road)."""
    if not _KERNEL:
        _load()
    return _KERNEL[0]


def require() -> NativeKernel:
    """The native kernel, or a RuntimeError saying why it cannot be built (``quant.kernel=native``)."""
    k = kernel()
    if k is None:
        raise RuntimeError(f"quant.kernel=native: the native CPU kernel is unavailable ({_KERNEL[1]}); valid: "
                           "auto (the compiled road where it is missing), compiled, eager")
    return k


def reset() -> None:
    """Forget this process's kernel and Linear extension, so the next ``kernel()`` / ``linear_ext()`` builds or loads
    them again (tests)."""
    _KERNEL.clear()
    _LINEAR.clear()


LINEAR_SOURCE = Path(__file__).with_name("native_linear.cpp")
LINEAR_FLAGS = ("-O2",)

# [] = not tried yet; [module] = loaded; [None, reason] = unavailable in this process, and why
_LINEAR: list = []


def _linear_name(compiler_path: str) -> str:
    """The extension's module name: this source for this torch, Python and compiler binary (path, size, mtime)."""
    import torch.utils.cpp_extension as cpp  # noqa: F401 - its version and ABI are part of the key

    st = os.stat(compiler_path)
    key = hashlib.sha256("\0".join([LINEAR_SOURCE.read_text(), torch.__version__, str(torch._C._GLIBCXX_USE_CXX11_ABI),
                                    sys.version, compiler_path, str(st.st_size), str(st.st_mtime_ns),
                                    " ".join(LINEAR_FLAGS), platform.machine()]).encode()).hexdigest()[:24]
    return f"altgrad_quant_linear_{key}"


def _import(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build_linear(name: str, folder: Path, built: Path, failed: Path) -> ModuleType | None:
    """Build the extension into ``built`` under a lock on ``folder`` (a second process building the same waits, then
    loads what the first built), in a private build folder renamed into place whole (a crash leaves no half-written
    library and no stale lock); a failed build is recorded in ``failed`` so later processes do not build it again.
    Returns the module it built and loaded, or None where another process had built it meanwhile."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "build.lock", "a") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released by the kernel when this process ends, however it ends
        if built.exists():
            return None
        _refuse_failed(failed)
        import torch.utils.cpp_extension as cpp

        with tempfile.TemporaryDirectory(prefix="build-", dir=folder) as tmp:
            try:
                module = cpp.load(name, [str(LINEAR_SOURCE)], extra_cflags=list(LINEAR_FLAGS), build_directory=tmp,
                                  verbose=False)
            except (OSError, ImportError, RuntimeError, subprocess.SubprocessError) as err:
                note = failed.with_suffix(".tmp")
                note.write_text(f"{type(err).__name__}: {str(err).strip()[-2000:]}\n")
                os.replace(note, failed)
                raise
            os.replace(Path(tmp) / f"{name}{Path(built).suffix}", built)  # loaded already: the mapping stays
        return module


def _refuse_failed(failed: Path) -> None:
    if failed.exists():
        raise RuntimeError(f"its build failed before ({failed.read_text().strip()[-300:]}); delete {failed.parent} "
                           "to build it again")


def _load_linear() -> None:
    found, reason = None, ""
    try:
        if kernel() is None:
            raise RuntimeError("the native kernel is unavailable")
        compiler = shutil.which(_compiler())
        if compiler is None:
            raise RuntimeError(f"no C++ compiler {_compiler()!r} on PATH (set CXX to one)")
        name = _linear_name(compiler)
        folder = cache_dir() / name
        built, failed = folder / f"{name}.so", folder / "failed"
        if not built.exists():
            _refuse_failed(failed)  # without waiting for the lock or importing the build tools
            if shutil.which("ninja") is None:
                raise RuntimeError("no ninja on PATH (torch.utils.cpp_extension builds with it; pip install ninja)")
            found = _build_linear(name, folder, built, failed)
        if found is None:  # a build of this very source: imported without asking ninja again
            found = _import(name, built)
        if found.STOCHASTIC != ROUNDING_CODES["stochastic"]:
            raise RuntimeError(f"{name} was built with another rounding table; delete {folder} to rebuild")
    except (OSError, ImportError, RuntimeError, subprocess.SubprocessError) as err:
        found, reason = None, f"{type(err).__name__}: {str(err).strip()[-500:]}"
        warnings.warn(f"altgrad.quant: the native Linear extension is unavailable ({reason}); quantizer calls go "
                      "through ctypes and QuantLinear through its Python node (the same bits, more Python per call)",
                      stacklevel=4)
    _LINEAR[:] = [found] if found is not None else [None, reason]


def linear_ext() -> ModuleType | None:
    """native_linear.cpp's module (``Plan``, ``linear``), built or loaded once per process; None where it cannot be
    built (one warning then says why)."""
    if not _LINEAR:
        _load_linear()
    return _LINEAR[0]


def takes(x: torch.Tensor) -> bool:
    """Whether x can be handed to the kernel as it is: a float32 CPU tensor of fewer than 2^31 elements, outside any
    tracing (its storage is then read directly; a non-contiguous x is copied first)."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and x.numel() < MAX_NUMEL
            and not torch.compiler.is_compiling() and type(x) in (torch.Tensor, torch.nn.Parameter))


def serving(road: str) -> NativeKernel | None:
    """The kernel where a ``quant.kernel`` road lets native code serve (``auto``, ``native``) and it is built, else
    None (the diagnostics' native passes then take torch's ops: the same values)."""
    return kernel() if road in ("auto", "native") else None


def native_contiguous(x: torch.Tensor) -> bool:
    """Whether the kernel can read x's storage in place: ``takes(x)`` and contiguous."""
    return takes(x) and x.is_contiguous()


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def quant_call(k: NativeKernel, x: torch.Tensor, params: torch.Tensor, rounding: str, variant_flags: int,
               seed: torch.Tensor | int | None, kind: str, pow2: bool, consts: torch.Tensor,
               scale: torch.Tensor | None = None, history: torch.Tensor | None = None, reduce_max: bool = True,
               update: bool = False, stats: torch.Tensor | None = None) -> torch.Tensor | None:
    """y = q(x·s)/s as a new tensor of x's shape, or None where x's storage cannot be read (a functorch wrapper).

    ``params``: the int32 kernel parameters (rounding.kernel_params); ``consts``: float32 [max, 2^-margin, smallest
    normal] (scaling.scale_consts); ``scale``: the 0-dim float32 state (the fallback for kinds tensor and delayed,
    updated with ``update``; the scale itself for kind ``given``, where it may also hold one scale per element of x,
    in x's shape, without statistics); ``history``: delayed scaling's amax history
    (updated with ``update``); ``stats``: a float32 tensor of len(STAT_NAMES) to write, or None.
    """
    operands = _operands(x)
    if operands is None:
        return None
    xc, xp, y = operands
    n = xc.numel()
    hist_len = 0 if history is None else history.numel()
    s = 0 if seed is None else int(seed)
    each = scale is not None and scale.dim() > 0
    if each:
        scale = scale.expand(x.shape).contiguous()
    rc = k.call(xp, y.data_ptr(), n, params.data_ptr(), ROUNDING_CODES[rounding], variant_flags, s, KINDS[kind],
                int(pow2), consts.data_ptr(), None if each else _ptr(scale), _ptr(history), hist_len,
                int(reduce_max), int(update), _ptr(stats), torch.get_num_threads(), _ptr(scale) if each else None)
    if rc != 0:
        raise RuntimeError(f"altgrad.quant: the native kernel refused rounding={rounding!r}, kind={kind!r}")
    return y


def _operands(x: torch.Tensor, out: torch.Tensor | None = None) -> tuple[torch.Tensor, int, torch.Tensor] | None:
    """x made contiguous (the caller holds it: the pointer is into it, possibly a copy), its data pointer and the
    float32 output: ``out`` (checked: contiguous, x's element count; x itself may be it) or a fresh tensor of x's
    shape; None where x has no storage of its own (vmap / grad transforms)."""
    xc = x.detach().contiguous()
    try:
        xp = xc.data_ptr()
    except RuntimeError:
        return None
    if out is None:
        return xc, xp, torch.empty(x.shape, dtype=torch.float32)
    if not (native_contiguous(out) and out.numel() == xc.numel()):
        raise ValueError(f"altgrad.quant: a native call's out must be a contiguous float32 CPU tensor of "
                         f"{xc.numel()} elements, not {tuple(out.shape)} {out.dtype} on {out.device}")
    return xc, xp, out


class CallPlan:
    """One quantizer's native call with every argument but the input resolved once: the pointers of its format's
    cached kernel parameters and scale constants and of its own buffers (scaler state, statistics), the codes of its
    rounding mode, variant and scale kind. ``__call__(x, seed, update)`` is then ``quant_call`` without the per-call
    look-ups (the same library call, the same bits); with ``out`` it writes into that tensor (x itself may be it:
    each element is read before it is written) and counts the write in out's version counter, as an in-place op
    would. ``holds`` is what it points into: the plan is valid while the quantizer still has exactly these tensors
    (``Quantizer.native_plan`` checks their identity)."""

    __slots__ = ("fn", "head", "tail", "stats", "holds")

    def __init__(self, k: NativeKernel, params: torch.Tensor, rounding: str, variant_flags: int, kind: str,
                 pow2: bool, consts: torch.Tensor, scale: torch.Tensor | None, history: torch.Tensor | None,
                 reduce_max: bool, stats: torch.Tensor | None, holds: tuple) -> None:
        self.fn = k.call
        self.head = (params.data_ptr(), ROUNDING_CODES[rounding], variant_flags)
        hist_len = 0 if history is None else history.numel()
        self.tail = (KINDS[kind], int(pow2), consts.data_ptr(), _ptr(scale), _ptr(history), hist_len,
                     int(reduce_max))
        self.stats = _ptr(stats)
        self.holds = (params, consts, *holds)  # kept alive: the pointers above stay valid

    def __call__(self, x: torch.Tensor, seed: torch.Tensor | int | None, update: bool,
                 out: torch.Tensor | None = None) -> torch.Tensor | None:
        operands = _operands(x, out)
        if operands is None:
            return None
        xc, xp, y = operands
        rc = self.fn(xp, y.data_ptr(), xc.numel(), *self.head, 0 if seed is None else int(seed), *self.tail,
                     int(update), self.stats, torch.get_num_threads(), None)
        if rc != 0:
            raise RuntimeError(f"altgrad.quant: the native kernel refused the call (code {rc})")
        if out is not None:
            torch.autograd.graph.increment_version(out)
        return y

    def set_stats(self, stats: torch.Tensor | None) -> None:
        """Write the statistics into ``stats`` from the next call on (None: none); it must be one of ``holds``."""
        self.stats = _ptr(stats)


def plan(k: NativeKernel, params: torch.Tensor, rounding: str, variant_flags: int, kind: str, pow2: bool,
         consts: torch.Tensor, scale: torch.Tensor | None, history: torch.Tensor | None, reduce_max: bool,
         stats: torch.Tensor | None, holds: tuple) -> object:
    """One quantizer's resolved call: native_linear.cpp's ``Plan`` where the extension is built (what QuantLinear's C++
    node takes), else a ``CallPlan``; both are called ``(x, seed, update)`` and give the same bits, and both take
    ``set_stats(tensor or None)``."""
    ext = linear_ext()
    if ext is None:
        return CallPlan(k, params, rounding, variant_flags, kind, pow2, consts, scale, history, reduce_max, stats,
                        holds)
    return ext.Plan(k.address, params, ROUNDING_CODES[rounding], variant_flags, KINDS[kind], pow2, consts, scale,
                    history, reduce_max, stats)


def variant_flags(variant: object) -> int:
    """A rounding.Variant's optional steps as native_kernel.cpp's flag bits."""
    return sum(bit for name, bit in VARIANT_FLAGS.items() if getattr(variant, name))


def flip_sums(k: NativeKernel, q_before: torch.Tensor, q_after: torch.Tensor, intended: torch.Tensor,
              last_direction: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n_segments × 6 float32 sums, new int8 directions) of diagnostics.flip_counts.segment_sums for contiguous
    segments [starts[k], starts[k+1]) (int64 CPU); inputs: float32 / int8 CPU tensors of one length."""
    qb, qa, a = (t.detach().contiguous() for t in (q_before, q_after, intended))
    last = last_direction.contiguous()
    starts = starts.contiguous()
    n_seg = starts.numel() - 1
    sums = torch.empty(n_seg, 6, dtype=torch.float32)
    new = torch.empty_like(last)
    k.flip_sums(qb.data_ptr(), qa.data_ptr(), a.data_ptr(), last.data_ptr(), new.data_ptr(), starts.data_ptr(), n_seg,
                sums.data_ptr())
    return sums, new


def magnitude_range(k: NativeKernel, x: torch.Tensor) -> torch.Tensor:
    """float32 [largest finite |x| (0: none), smallest nonzero finite |x| (+inf: none)] of a float32 CPU tensor in
    one pass (the values of torch's max and masked min: both are exact in any order)."""
    x = x.detach().contiguous()
    out = torch.empty(2, dtype=torch.float32)
    k.magnitude_range(x.data_ptr(), x.numel(), out.data_ptr())
    return out


def bits_pass(k: NativeKernel, w: torch.Tensor, s: torch.Tensor, q: torch.Tensor, fmt: object, top: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(code_index(q, fmt) as int32, log2_stiffness(w, fmt, s)) in one pass over float32 CPU tensors of one length,
    for power-of-two scales ``s`` only (the same values: see native_kernel.cpp); ``top`` the rank of fmt's max."""
    w, s, q = (t.detach().contiguous() for t in (w, s, q))
    n = w.numel()
    if s.numel() != n or q.numel() != n:
        raise ValueError(f"bits_pass needs w, s and q of one length, got {n}, {s.numel()}, {q.numel()}")
    idx = torch.empty(n, dtype=torch.int32)
    log2s = torch.empty(n, dtype=torch.float32)
    min_normal = fmt.min_normal or float("inf")  # no exponent bits: every value is subnormal
    k.bits_pass(w.data_ptr(), s.data_ptr(), q.data_ptr(), n, int(fmt.emin), int(fmt.mbits), float(fmt.min_subnormal),
                min_normal, int(top), idx.data_ptr(), log2s.data_ptr())
    return idx, log2s


class GatherPlan:
    """The pointer tables of ``gather`` for a fixed list of contiguous float32 CPU tensors (each with a sorted int64
    index of the elements it contributes, or None for all of them): built once per set of storages, then one C call
    per gather instead of an ``index_select`` per tensor and a ``cat``."""

    def __init__(self, tensors: list[torch.Tensor], indices: list[torch.Tensor | None]) -> None:
        n = len(tensors)
        self.tensors = list(tensors)  # kept alive with the indices: the tables point into both
        self.indices = [None if i is None else i.contiguous() for i in indices]
        self.counts = torch.tensor([t.numel() if i is None else i.numel() for t, i in zip(tensors, self.indices)],
                                   dtype=torch.int64)
        self.total = int(self.counts.sum())
        self.src = (ctypes.c_void_p * n)(*[t.data_ptr() for t in tensors])
        self.index = (ctypes.c_void_p * n)(*[None if i is None else i.data_ptr() for i in self.indices])
        self.n = n

    def __call__(self, k: NativeKernel, before: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the tracked weights end to end, and their float32 difference from ``before``, or None without one)."""
        if before is not None and not (before.numel() == self.total and native_contiguous(before)):
            raise ValueError(f"GatherPlan: before must be a contiguous float32 CPU tensor of {self.total} elements, "
                             f"got {before.dtype} {tuple(before.shape)} on {before.device}")
        out = torch.empty(self.total, dtype=torch.float32)
        diff = None if before is None else torch.empty(self.total, dtype=torch.float32)
        k.gather(self.n, ctypes.addressof(self.src), ctypes.addressof(self.index), self.counts.data_ptr(),
                 out.data_ptr(), _ptr(before), _ptr(diff))
        return out, diff


STIFFNESS_CODES = {"pow2": 0, "smooth": 1, "abs": 2}
"""Stiffness of ``altgrad_stiff_adam_step``: the grid's ULP (pow2), its smooth envelope, or |w| (RelativeAdamW)."""


def stiff_adam_step(k: NativeKernel, w: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                    exp_avg_sq: torch.Tensor, stiffness: str, on_update: bool, hyper: torch.Tensor, beta1: float,
                    beta2: float, emin: int = 0, mbits: int = 0, kind: str = "none", pow2: bool = True,
                    consts: torch.Tensor | None = None, scale: torch.Tensor | None = None,
                    history: torch.Tensor | None = None, reduce_max: bool = True) -> None:
    """One tensor's Adam step with stiffness in place (native_kernel.cpp ``altgrad_stiff_adam_step``): w, grad and
    the moments contiguous float32 CPU tensors of one size, written through their storage; ``hyper`` the float32
    [lr, wd, 1 − β1^t, √(1 − β2^t), ε]; the grid's scale of ``kind`` (none, tensor, delayed) from ``consts``, the
    scaler's last ``scale`` and ``history`` as a quantizer call reads them, not updated."""
    hist_len = 0 if history is None else history.numel()
    rc = k.stiff_adam_step(w.data_ptr(), grad.data_ptr(), exp_avg.data_ptr(), exp_avg_sq.data_ptr(), w.numel(),
                           STIFFNESS_CODES[stiffness], int(on_update), hyper.data_ptr(), float(beta1), float(beta2),
                           int(emin), int(mbits), KINDS[kind], int(pow2), _ptr(consts), _ptr(scale), _ptr(history),
                           hist_len, int(reduce_max), torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"altgrad.quant: the native step refused stiffness={stiffness!r}, kind={kind!r}")
