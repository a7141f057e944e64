"""Guard-evaluation time of the compiled e4m3 nano model's training graph: TorchDynamo's per-call check, timed alone.

Run from the repository root: `python docs/benchmarks/gpu/guard_eval.py [REGEX] [format=NAME]`. REGEX
(optional) drops the guards whose source name or guard type matches it (torch.compile's `guard_filter_fn`), to
attribute the time; a dropped guard is unsafe, so this is a measurement, never a setting. One variant per process
(a second compile in one process would reuse the first graph). Prints the median of 9 blocks of 500 checks."""
import re
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
import torch
from hydra import compose, initialize_config_dir
from altgrad.config import validate
from altgrad.train import build_fake_quant, build_module
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

overrides = [a for a in sys.argv[1:] if "=" in a]  # e.g. format=fp32 (default e4m3)
variants = [a for a in sys.argv[1:] if "=" not in a] or [""]
with initialize_config_dir(config_dir=str(Path.cwd() / "conf"), version_base=None):
    cfg = compose("train", overrides=["format=e4m3", "model.block_size=64",
                                       "paths.output_dir=/tmp/guard_eval"] + overrides)
run = validate(cfg, paths=False)
idx = torch.randint(0, 257, (12, 64))
checks = []
for v in variants:
    module = build_module(run, 257)
    fq = build_fake_quant(run, Path("/tmp/guard_eval"))
    fq.apply(module.model)
    fq.resolve_kernel(module.model, "cpu")
    module.model.train()
    def keep(entries, v=v):
        if not v:
            return [True] * len(entries)
        pat = re.compile(v)
        out = [not (pat.search(e.name) or pat.search(repr(e.guard_type))
                    or pat.search(str(getattr(e, "orig_guard", "")))) for e in entries]
        print(v, "guards", len(entries), "dropped", out.count(False),
              Counter(str(e.guard_type) for e, k in zip(entries, out) if not k).most_common(4))
        return out
    torch._dynamo.reset()
    model = torch.compile(module.model, options={"guard_filter_fn": keep})
    model(idx).float().sum().backward()
    entries = _debug_get_cache_entry_list(type(module.model).forward.__code__)
    new = [e for e in entries if e.guard_manager.check({"self": module.model, "idx": idx})]
    checks.append((v, new[0].guard_manager, {"self": module.model, "idx": idx}))
res = {v: [] for v, _, _ in checks}
for _ in range(9):
    for v, gm, fl in checks:
        ts = []
        for _ in range(500):
            t = time.perf_counter()
            gm.check(fl)
            ts.append(time.perf_counter() - t)
        res[v].append(statistics.median(ts) * 1e6)
for v, meds in res.items():
    print(f"{v!r:40s} guard eval (us), block medians: median {statistics.median(meds):.0f}, "
          f"range {min(meds):.0f}-{max(meds):.0f}")
