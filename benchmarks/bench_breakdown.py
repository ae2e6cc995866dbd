#!/usr/bin/env python
"""Where a tiny_engine step goes on CPU: wall time of the linears, attention (and its
page gathers), input preparation, over one workload of benchmarks/bench_peers.py."""

import functools
import json
import sys
import time

sys.path.insert(0, "benchmarks")
import bench_peers as bp

import hwplug.attention.torch_backend as tb

kl = sys.modules["hwplug.kernels.linear"]
import tiny_engine.runner as rn  # noqa: E402 (after the path insert)
from tiny_engine import LLM  # noqa: E402

acc = {}


def wrap(obj, name, key):
    f = getattr(obj, name)

    @functools.wraps(f)
    def g(*a, **k):
        t = time.perf_counter()
        r = f(*a, **k)
        acc[key] = acc.get(key, 0) + time.perf_counter() - t
        return r

    setattr(obj, name, g)


wrap(tb.TorchAttentionBackend, "attend", "attention")
wrap(tb._Pages, "gather", "attention: page gathers")
wrap(kl, "_onednn", "linears (oneDNN)")
wrap(rn.ModelRunner, "prepare", "step inputs and metadata")
wrap(rn.ModelRunner, "execute", "runner.execute")
model, wname = sys.argv[1], sys.argv[2]
spec = bp.MODELS[model]
w = bp.workload(wname, spec["vocab"], 0)
pre = bp.workload(wname, spec["vocab"], 1)
lens = [len(p) for p in w["prompts"]]
config = {
    "model": {
        "dtype": "float32",
        "max_model_len": max(p + n for p, n in zip(lens, w["max_tokens"])) + 8,
    },
    "scheduler": {"max_num_seqs": len(lens), "max_num_batched_tokens": max(sum(lens), 1024)},
    "cache": {"kv_cache_memory_bytes": 1 << 30},
}
llm = LLM(f"/tmp/hwplug-peers/models/{model}/hf", config=config, platform="cpu")
llm.generate(pre["prompts"], max_tokens=[2] * len(lens), ignore_eos=True)
acc.clear()
t = time.perf_counter()
llm.generate(w["prompts"], max_tokens=w["max_tokens"], ignore_eos=True)
total = time.perf_counter() - t
steps = llm.stats["steps"]
print(
    json.dumps(
        {
            "model": model,
            "workload": wname,
            "seconds": round(total, 3),
            **{k: round(v, 3) for k, v in acc.items()},
            "rest (scheduler, sampling, compiled glue)": round(total - acc["runner.execute"], 3),
        },
        indent=1,
    )
)
