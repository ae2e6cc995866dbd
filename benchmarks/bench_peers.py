"""tiny_engine on hwplug side by side with what a CPU user would run instead.

Engines: transformers' ``generate()`` (the baseline), tiny_engine on hwplug,
CTranslate2, vLLM's CPU build and llama.cpp (llama-cpp-python), each in its
own process (a worker: this file with ``--worker ENGINE``, run by that
engine's Python, JSON on stdout). The peers live in their own virtual
environments (``make bench-peers`` creates them); an engine whose Python or
package is missing, or whose worker fails, is reported as ``skipped`` with
the reason.

Two peers run in two set-ups each, as engines of their own (``VARIANTS``):
``vllm`` (the scheduler limits sized to the workload: its sequences and all its
prompt tokens in one step) and
``vllm-guide`` (as vLLM's CPU install guide says: OpenMP threads bound to the
benchmark's cores, Intel's OpenMP and TCMalloc preloaded where present,
vLLM's default scheduler limits); ``llamacpp`` and ``llamacpp-fa`` (flash
attention off and on). The report keeps the faster of each pair per model
and workload (``variants``) and gives tiny_engine's ratio to it.

Models (written once to ``--cache``, with transformers + safetensors, and a
word-level tokenizer ``t0 .. tN`` so that every engine can load them):

- ``bench``: the model of benchmarks/bench_engine.py (Llama, 4 layers, hidden
  512, 8 heads, 4 key/value heads, intermediate 1408, vocabulary 8192);
- ``llama250m``: hidden 1024, 12 layers, 16 heads, 4 key/value heads,
  intermediate 2816, vocabulary 32000 (about 250M parameters).

llama.cpp reads a GGUF file written once per model and dtype beside the
checkpoint by ``write_gguf`` (in the llamacpp venv, with the ``gguf``
package: ``--convert-gguf``).

Workloads (token ids drawn from a seeded generator, the same for every engine):

- ``fixed``: 16 prompts x 128 tokens -> 128 new tokens each, greedy;
- ``mix``: a serving mix of 32 prompts of 32-512 tokens with 16-256 new
  tokens each (seed 0). Engines that take one length for a batch
  (transformers, CTranslate2) generate the longest one for all and keep each
  prompt's own: that is what their user can do; the tokens counted are the
  requested ones;
- ``single``: one user, 1 prompt x 128 tokens -> 128 new tokens.

In each worker: load, then one token for one prompt (start-up: from the
parent's spawn of the process to that token), then whatever the engine still
does before it runs at full speed (tiny_engine: the compilation of its model,
which runs in a worker thread while its first tokens run eagerly; reported
as ``full_speed_seconds``, from the spawn), a warm-up on other prompts of
the same shapes (2 new tokens), a prefill run (1 new token, other prompts of
the same shapes, so that no prefix cache helps), then the timed run. Decode
tokens/s is the tokens after each prompt's first divided by (timed run -
prefill run); ``decode_ms_per_token`` is (timed run - prefill run) over the
decode steps (the largest new-token count - 1): the time between two tokens
that a user sees. For ``single``, ``weight_bytes_per_token`` (the bytes of
weights a decode step reads) times decode tokens/s is ``weights_gb_per_s``,
beside the machine's own streaming read (``stream_read_gb_per_s``, once per
benchmark). Peak resident memory is the worker's ``VmHWM``. Rounds are
interleaved: round 1 of every engine, then round 2, and so on; the report has
the median, min and max of each figure, the fraction of sequences
token-identical to transformers' output, and ``ratio``: each engine's end-to-end
tokens/s over transformers'.

``python benchmarks/bench_peers.py [--models bench,llama250m --workloads
fixed,mix,single --engines transformers,tiny_engine,ctranslate2,vllm,vllm-guide,
llamacpp,llamacpp-fa --rounds 3 --dtype fp32|bf16 --threads N
--peers-dir /tmp/hwplug-peers --out FILE]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ENGINES = (
    "transformers",
    "tiny_engine",
    "ctranslate2",
    "vllm",
    "vllm-guide",
    "llamacpp",
    "llamacpp-fa",
)
# One peer in two set-ups: the report keeps the faster per model and workload.
VARIANTS: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm", "vllm-guide"),
    "llamacpp": ("llamacpp", "llamacpp-fa"),
}
# The peers' venvs under --peers-dir, and what their worker imports.
VENVS = {
    "ctranslate2": "ct2",
    "vllm": "vllm",
    "vllm-guide": "vllm",
    "llamacpp": "llamacpp",
    "llamacpp-fa": "llamacpp",
}
IMPORTS = {"ct2": "ctranslate2", "vllm": "vllm", "llamacpp": "llama_cpp, gguf"}
WORKLOADS = ("fixed", "mix", "single")
MODELS: dict[str, dict[str, int]] = {
    "bench": {
        "layers": 4,
        "hidden": 512,
        "heads": 8,
        "kv_heads": 4,
        "intermediate": 1408,
        "vocab": 8192,
    },
    "llama250m": {
        "layers": 12,
        "hidden": 1024,
        "heads": 16,
        "kv_heads": 4,
        "intermediate": 2816,
        "vocab": 32000,
    },
}
MAX_POSITIONS = 1024
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
DTYPE_BYTES = {"fp32": 4, "bf16": 2}


# -- workloads ---------------------------------------------------------------------------------
def workload(name: str, vocab: int, variant: int, scale: float = 1.0) -> dict[str, Any]:
    """Prompts and new-token counts; ``variant`` 0 is the timed set, others have its shapes."""
    shapes = random.Random(0)
    if name == "fixed":
        lens, new = [128] * 16, [128] * 16
    elif name == "mix":
        lens = [shapes.randint(32, 512) for _ in range(32)]
        new = [shapes.randint(16, 256) for _ in range(32)]
    elif name == "single":
        lens, new = [128], [128]
    else:
        raise ValueError(f"unknown workload {name!r}: {', '.join(WORKLOADS)}")
    if scale != 1.0:  # smoke runs: fewer prompts and tokens, the same kind of mix
        count = max(min(2, len(lens)), round(len(lens) * scale))
        lens = [max(4, round(n * scale)) for n in lens[:count]]
        new = [max(2, round(n * scale)) for n in new[:count]]
    tokens = random.Random(1000 + variant)
    prompts = [[tokens.randrange(3, vocab) for _ in range(n)] for n in lens]
    return {"prompts": prompts, "max_tokens": new}


# -- the checkpoint --------------------------------------------------------------------------
def ensure_checkpoint(cache: Path, model: str) -> Path:
    """The model's transformers checkpoint under ``cache``, written once."""
    path = cache / model / "hf"
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return path
    sys.path.insert(0, str(REPO / "examples" / "tiny_engine" / "src"))
    from tiny_engine.make_checkpoint import make_checkpoint
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    spec = MODELS[model]
    make_checkpoint(
        path,
        arch="llama",
        layers=spec["layers"],
        hidden=spec["hidden"],
        heads=spec["heads"],
        kv_heads=spec["kv_heads"],
        intermediate=spec["intermediate"],
        vocab=spec["vocab"],
        max_positions=MAX_POSITIONS,
        init_std=0.02,
    )
    # A word-level tokenizer t0 .. tN (id i is "t{i}"): CTranslate2's converter and
    # vLLM want one; the benchmark itself feeds token ids.
    vocab = {f"t{i}": i for i in range(spec["vocab"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2", pad_token="t0"
    )
    fast.save_pretrained(path)
    return path


# -- llama.cpp's GGUF file ----------------------------------------------------------------------
# transformers' Llama names -> GGUF's (llama.cpp's ``llama`` architecture)
GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
GGUF_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_tensor_name(name: str) -> str:
    """The GGUF name of a transformers Llama tensor (``ValueError`` for any other)."""
    if name in GGUF_NAMES:
        return GGUF_NAMES[name]
    match = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.weight", name)
    if match is None or match.group(2) not in GGUF_LAYER_NAMES:
        raise ValueError(f"no GGUF name for {name!r}")
    return f"blk.{match.group(1)}.{GGUF_LAYER_NAMES[match.group(2)]}.weight"


def permute_qk(weight: Any, heads: int) -> Any:
    """q or k rows from transformers' rotary layout to llama.cpp's (numpy or torch).

    transformers rotates the two halves of each head (``rotate_half``), llama.cpp's
    ``llama`` architecture adjacent pairs: within each head, row ``j`` of the first half
    and row ``j`` of the second become rows ``2j`` and ``2j + 1``. This is ``permute``
    of LlamaModel in llama.cpp's convert_hf_to_gguf.py; ``heads`` is the query heads
    for q and the key/value heads for k."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def unpermute_qk(weight: Any, heads: int) -> Any:
    """The inverse of ``permute_qk``."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def gguf_tensor(name: str, weight: Any, config: dict[str, Any]) -> Any:
    """A checkpoint tensor as llama.cpp wants it: q and k permuted, the rest as is."""
    heads = config["num_attention_heads"]
    if name.endswith("self_attn.q_proj.weight"):
        return permute_qk(weight, heads)
    if name.endswith("self_attn.k_proj.weight"):
        return permute_qk(weight, config.get("num_key_value_heads") or heads)
    return weight


def rope_theta(config: dict[str, Any]) -> float:
    """The rotary base of a config.json (transformers 5 keeps it in ``rope_parameters``)."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or "default"
    if kind != "default":
        raise ValueError(f"rope type {kind!r}: write_gguf knows only the default rope")
    return float(config.get("rope_theta") or params.get("rope_theta") or 10000.0)


def write_gguf(checkpoint: Path, out: Path, dtype: str) -> None:
    """The Llama checkpoint as a GGUF file for llama.cpp (in the llamacpp venv).

    Matrices in float32 or bfloat16 (``dtype``), norms in float32 as llama.cpp's
    own converter writes them. No tokenizer: ``tokenizer.ggml.model`` is "none"
    (llama.cpp's LLAMA_VOCAB_TYPE_NONE, which makes ``llama.vocab_size`` dummy
    tokens): the benchmark feeds token ids, and llama.cpp then needs no vocabulary."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    config = json.loads((checkpoint / "config.json").read_text())
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // heads
    tmp = out.with_name(out.name + ".tmp")
    writer = gguf.GGUFWriter(tmp, "llama")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.get("num_key_value_heads") or heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(rope_theta(config))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    bf16 = dtype == "bf16"
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if bf16 else gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("none")
    for part in sorted(checkpoint.glob("*.safetensors")):
        for name, array in load_file(part).items():
            if name.endswith("rotary_emb.inv_freq"):
                continue
            data = gguf_tensor(name, array.astype(np.float32), config)
            if bf16 and data.ndim > 1:
                kind = gguf.GGMLQuantizationType.BF16
                writer.add_tensor(
                    gguf_tensor_name(name), gguf.quants.quantize(data, kind), raw_dtype=kind
                )
            else:
                writer.add_tensor(gguf_tensor_name(name), np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, out)


# -- figures -----------------------------------------------------------------------------------
def param_count(spec: dict[str, int]) -> int:
    """Parameters of a ``MODELS`` Llama (untied head): embedding and head included."""
    h, v, inter = spec["hidden"], spec["vocab"], spec["intermediate"]
    kv = spec["kv_heads"] * (h // spec["heads"])
    layer = 2 * h * h + 2 * h * kv + 3 * h * inter + 2 * h  # q, o; k, v; MLP; 2 norms
    return spec["layers"] * layer + h + 2 * v * h  # final norm, embedding, head


def weight_bytes_per_token(spec: dict[str, int], dtype: str) -> int:
    """The bytes of weights one decode step streams at ``dtype``: every parameter but
    the embedding table's unread rows (a token reads one row of it)."""
    return (param_count(spec) - (spec["vocab"] - 1) * spec["hidden"]) * DTYPE_BYTES[dtype]


def decode_ms_per_token(e2e_s: float, prefill_s: float, max_tokens: list[int]) -> float | None:
    """The time between two tokens: (timed run - prefill run) over the decode steps;
    None without a decode step, or where the prefill run took as long as the timed run
    (a noisy machine)."""
    steps = max(max_tokens) - 1
    if steps < 1 or e2e_s <= prefill_s:
        return None
    return (e2e_s - prefill_s) / steps * 1000


def stream_read_gb_per_s(threads: int | None, size: int = 1 << 30, repeats: int = 5) -> float:
    """This machine's streaming read: torch summing a ``size``-byte float32 buffer with
    ``threads`` threads, the best of ``repeats`` passes, in GB/s (1e9 bytes)."""
    import torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        buffer = torch.ones(size // 4, dtype=torch.float32)  # written: its pages are real
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            buffer.sum().item()
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)
    return round(size / best / 1e9, 2)


def best_variant(e2e: dict[str, float]) -> str | None:
    """The faster engine of a peer's set-ups (end-to-end tokens/s; the first on a tie)."""
    return max(e2e, key=lambda engine: e2e[engine]) if e2e else None


def variant_report(e2e: dict[str, float]) -> dict[str, Any]:
    """Per peer of ``VARIANTS`` that ran: each set-up's end-to-end tokens/s (``e2e``:
    engine -> median, one model and workload) and the faster one."""
    out: dict[str, Any] = {}
    for peer, engines in VARIANTS.items():
        ran = {engine: e2e[engine] for engine in engines if engine in e2e}
        if ran:
            out[peer] = {"best": best_variant(ran), "e2e_tokens_per_s": ran}
    return out


def tiny_engine_ratios(e2e: dict[str, float]) -> dict[str, Any]:
    """tiny_engine's end-to-end tokens/s over transformers' and over each peer's
    faster set-up (``VARIANTS``), for one model and workload; ``e2e`` maps each engine
    that ran to its median."""
    if "tiny_engine" not in e2e:
        return {}
    ours = e2e["tiny_engine"]
    out: dict[str, Any] = {}
    if "transformers" in e2e:
        out["transformers"] = round(ours / e2e["transformers"], 2)
    for peer, variants in variant_report(e2e).items():
        out[peer] = round(ours / e2e[variants["best"]], 2)
        out[f"{peer}_variant"] = variants["best"]
    return out


# -- workers: each runs in its engine's own Python -------------------------------------------
def _rss_mib() -> float:
    """This process's peak resident memory in MiB: ``VmHWM`` (the high-water mark of
    its own address space). ``ru_maxrss`` survives ``exec``: a worker would report at
    least what its parent held when it was started."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


class Worker:
    """One engine: ``load()``, then ``generate(prompts, max_tokens)`` -> token lists."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dtype = DTYPES[args.dtype]
        self.info: dict[str, Any] = {}

    def load(self) -> None:
        raise NotImplementedError

    def generate(self, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
        raise NotImplementedError

    def settle(self) -> None:
        """Wait for what the engine still does after its first token before it runs at
        full speed (nothing, for most engines)."""


class TransformersWorker(Worker):
    def load(self) -> None:
        import torch
        import transformers

        if self.args.threads:
            torch.set_num_threads(self.args.threads)
        self.torch = torch
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            self.args.checkpoint, dtype=getattr(torch, self.dtype)
        ).eval()
        self.info = {"version": transformers.__version__, "threads": torch.get_num_threads()}

    def generate(self, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
        torch = self.torch
        longest, new = max(map(len, prompts)), max(max_tokens)
        # one batch, left-padded; every prompt gets the longest count, each keeps its own
        ids = torch.tensor([[0] * (longest - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            out = self.model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
            )
        return [row[longest : longest + n] for row, n in zip(out.tolist(), max_tokens)]


class TinyEngineWorker(Worker):
    def load(self) -> None:
        import torch
        from tiny_engine import LLM

        from hwplug.core.config import SchedulerConfig

        if self.args.threads:
            torch.set_num_threads(self.args.threads)
        w = self.args.workload_shapes
        config = {
            "model": {"dtype": self.dtype, "max_model_len": w["max_len"]},
            # the workload's sequences at once; hwplug's default step budget (8192 tokens,
            # more only for a longer sequence): one step of every prompt of the serving
            # mix (9.7k tokens) ran its prefill at about 117 GFLOPS against about 130 in
            # steps of 2-8k (docs/peers.md), its activations far out of cache
            "scheduler": {
                "max_num_seqs": w["count"],
                "max_num_batched_tokens": max(
                    SchedulerConfig().max_num_batched_tokens, w["max_len"]
                ),
            },
            "cache": {"kv_cache_memory_bytes": 1 << 30},
        }
        self.llm = LLM(self.args.checkpoint, config=config, platform="cpu")
        stats = self.llm.stats
        self.info = {
            "threads": torch.get_num_threads(),
            **{k: stats.get(k) for k in ("platform", "attention_backend", "compilation_level")},
        }

    def generate(self, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
        out = self.llm.generate(prompts, max_tokens=max_tokens, ignore_eos=True)
        return [list(o) for o in out]

    def settle(self) -> None:
        # The model compiles in a worker thread while the first tokens run eagerly.
        self.llm.wait_compiled()
        self.info["compiled"] = self.llm.stats["compiled"]


class CTranslate2Worker(Worker):
    def load(self) -> None:
        import ctranslate2

        threads = self.args.threads or os.cpu_count() or 1
        self.generator = ctranslate2.Generator(
            self.args.ct2_model, device="cpu", compute_type=self.dtype, intra_threads=threads
        )
        self.info = {
            "version": ctranslate2.__version__,
            "compute_type": self.generator.compute_type,
            "threads": threads,
        }

    def generate(self, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
        new = max(max_tokens)
        # one batch and one length for all (CTranslate2 has no per-prompt limit)
        results = self.generator.generate_batch(
            [[f"t{t}" for t in p] for p in prompts],
            max_length=new,
            min_length=new,
            sampling_topk=1,
            include_prompt_in_result=False,
            max_batch_size=len(prompts),
        )
        return [list(r.sequences_ids[0][:n]) for r, n in zip(results, max_tokens)]


class VLLMWorker(Worker):
    """vLLM with its scheduler limits sized to the workload (its sequences and all its
    prompt tokens in one step)."""

    guide = False

    def load(self) -> None:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        if self.args.threads:
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "all")
        import vllm

        w = self.args.workload_shapes
        limits = {}
        if not self.guide:
            limits = {
                "max_num_seqs": w["count"],
                "max_num_batched_tokens": max(w["tokens"], w["max_len"]),
            }
        self.vllm = vllm
        self.llm = vllm.LLM(
            model=self.args.checkpoint,
            dtype=self.dtype,
            max_model_len=w["max_len"],
            skip_tokenizer_init=True,
            enable_prefix_caching=False,
            **limits,
        )
        self.info = {"version": vllm.__version__, "scheduler_limits": limits or "vLLM's defaults"}
        if self.guide:
            for key in ("VLLM_CPU_OMP_THREADS_BIND", "LD_PRELOAD"):
                self.info[key] = os.environ.get(key)

    def generate(self, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
        params = [
            self.vllm.SamplingParams(
                temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False
            )
            for n in max_tokens
        ]
        inputs = [{"prompt_token_ids": p} for p in prompts]
        outs = self.llm.generate(inputs, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]


class VLLMGuideWorker(VLLMWorker):
    """vLLM as its CPU install guide says: the parent sets ``VLLM_CPU_OMP_THREADS_BIND``
    and ``LD_PRELOAD`` (``guide_env``); vLLM's default scheduler limits."""

    guide = True


class LlamaCppWorker(Worker):
    """llama.cpp through llama-cpp-python's low-level API: one sequence id per prompt,
    all prompts in one batch, then one batch a step of every live sequence's last token,
    greedy (the argmax of each sequence's logits)."""

    flash_attn = False
    GGML_TYPES = {"f32": 0, "f16": 1, "bf16": 30}  # enum ggml_type
    KV_CACHE = {
        ("fp32", False): "f32",
        ("fp32", True): "f16",
        ("bf16", False): "bf16",
        ("bf16", True): "bf16",
    }

    def load(self) -> None:
        import llama_cpp
        import numpy

        self.ll, self.np = llama_cpp, numpy
        llama_cpp.llama_backend_init()
        model_params = llama_cpp.llama_model_default_params()
        self.model = llama_cpp.llama_model_load_from_file(self.args.gguf.encode(), model_params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {self.args.gguf}")
        w = self.args.workload_shapes
        threads = self.args.threads or os.cpu_count() or 1
        params = llama_cpp.llama_context_default_params()
        params.n_seq_max = w["count"]
        # each sequence its own stream of the KV cache (kv_unified false, the default:
        # llama.h advises it for sequences that share no prefix), max_len cells each
        params.kv_unified = False
        params.n_ctx = w["count"] * w["max_len"]
        params.n_batch = params.n_ubatch = max(w["tokens"], w["count"])
        params.n_threads = params.n_threads_batch = threads
        params.flash_attn_type = 1 if self.flash_attn else 0  # LLAMA_FLASH_ATTN_TYPE_*
        # The KV cache in the run's dtype (llama.cpp's default is f16), but f16 for
        # flash attention in fp32: llama.cpp would cast a float32 cache to f16 for it
        # at every step (the same values, read twice).
        kv_cache = self.KV_CACHE[self.args.dtype, self.flash_attn]
        params.type_k = params.type_v = self.GGML_TYPES[kv_cache]
        self.ctx = llama_cpp.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create its context")
        vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.capacity = params.n_batch
        self.batch = llama_cpp.llama_batch_init(self.capacity, 0, 1)
        self.info = {
            "version": llama_cpp.__version__,
            "threads": threads,
            "flash_attn": self.flash_attn,
            "kv_cache": kv_cache,
            "gguf": Path(self.args.gguf).name,
        }

    def _step(self, entries: list[tuple[int, int, int, bool]]) -> list[int]:
        """One ``llama_decode`` of (token, position, sequence, wants logits) entries: the
        argmax of the logits of each entry that wants them, in order."""
        ll, batch = self.ll, self.batch
        if len(entries) > self.capacity:
            raise RuntimeError(f"{len(entries)} tokens in a batch of {self.capacity}")
        for i, (token, pos, seq, logits) in enumerate(entries):
            batch.token[i] = token
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = logits
        batch.n_tokens = len(entries)
        status = ll.llama_decode(self.ctx, batch)
        if status:
            raise RuntimeError(f"llama_decode returned {status}")
        picks = []
        for i, entry in enumerate(entries):
            if entry[3]:
                row = self.np.ctypeslib.as_array(
                    ll.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,)
                )
                picks.append(int(row.argmax()))
        return picks

    def generate(self, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
        self.ll.llama_memory_clear(self.memory, True)
        entries = [
            (token, pos, seq, pos == len(prompt) - 1)
            for seq, prompt in enumerate(prompts)
            for pos, token in enumerate(prompt)
        ]
        out = [[token] for token in self._step(entries)]
        while live := [s for s, toks in enumerate(out) if len(toks) < max_tokens[s]]:
            steps = [(out[s][-1], len(prompts[s]) + len(out[s]) - 1, s, True) for s in live]
            for seq, token in zip(live, self._step(steps)):
                out[seq].append(token)
        return out


class LlamaCppFlashWorker(LlamaCppWorker):
    flash_attn = True


WORKERS: dict[str, type[Worker]] = {
    "transformers": TransformersWorker,
    "tiny_engine": TinyEngineWorker,
    "ctranslate2": CTranslate2Worker,
    "vllm": VLLMWorker,
    "vllm-guide": VLLMGuideWorker,
    "llamacpp": LlamaCppWorker,
    "llamacpp-fa": LlamaCppFlashWorker,
}


def workload_shapes(loads: list[dict[str, Any]]) -> dict[str, int]:
    """What an engine is configured for to serve every one of ``loads``: the most
    prompts, the most prompt tokens, and the longest sequence (plus a margin)."""
    shapes = [(len(p), n) for w in loads for p, n in zip(w["prompts"], w["max_tokens"])]
    return {
        "count": max(len(w["prompts"]) for w in loads),
        "tokens": max(sum(map(len, w["prompts"])) for w in loads),
        "max_len": max(p + n for p, n in shapes) + 8,
    }


def run_worker(args: argparse.Namespace) -> int:
    """One engine, one model, the workloads in turn: print one JSON object."""
    spawned = args.spawned
    loads = {w: workload(w, args.vocab, 0, args.scale) for w in args.workloads}
    args.workload_shapes = workload_shapes(list(loads.values()))
    worker = WORKERS[args.worker](args)
    start = time.perf_counter()
    worker.load()
    load_s = time.perf_counter() - start
    first = worker.generate([loads[args.workloads[0]]["prompts"][0]], [1])
    assert len(first[0]) == 1, first
    report: dict[str, Any] = {
        "engine": args.worker,
        "load_seconds": round(load_s, 3),
        "startup_seconds": round(time.time() - spawned, 3),
        "info": worker.info,
        "workloads": {},
    }
    worker.settle()
    report["full_speed_seconds"] = round(time.time() - spawned, 3)
    for name in args.workloads:
        timed = loads[name]
        warm = workload(name, args.vocab, 2, args.scale)
        worker.generate(warm["prompts"], [min(2, n) for n in warm["max_tokens"]])
        pre = workload(name, args.vocab, 1, args.scale)
        start = time.perf_counter()
        worker.generate(pre["prompts"], [1] * len(pre["prompts"]))
        prefill_s = time.perf_counter() - start
        start = time.perf_counter()
        out = worker.generate(timed["prompts"], timed["max_tokens"])
        e2e_s = time.perf_counter() - start
        lengths = [len(o) for o in out]
        if lengths != timed["max_tokens"]:
            raise RuntimeError(f"{args.worker} generated {lengths}, asked {timed['max_tokens']}")
        generated = sum(timed["max_tokens"])
        decoded = generated - len(timed["prompts"])
        latency = decode_ms_per_token(e2e_s, prefill_s, timed["max_tokens"])
        report["workloads"][name] = {
            "e2e_seconds": round(e2e_s, 3),
            "prefill_seconds": round(prefill_s, 3),
            "e2e_tokens_per_s": round(generated / e2e_s, 2),
            "decode_tokens_per_s": round(decoded / max(e2e_s - prefill_s, 1e-9), 2),
            "decode_ms_per_token": None if latency is None else round(latency, 3),
            "outputs": out,
        }
    report["peak_rss_mib"] = round(_rss_mib(), 1)
    print("@@RESULT@@" + json.dumps(report))
    return 0


# -- the driver ------------------------------------------------------------------------------
def engine_python(engine: str, peers_dir: Path) -> Path:
    if engine in VENVS:
        return peers_dir / VENVS[engine] / "bin" / "python"
    return Path(sys.executable)


def _run_tail(cmd: list[str]) -> str | None:
    """Run ``cmd``; None when it succeeds, else the last line of its error."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if not done.returncode:
        return None
    return (done.stderr.strip().splitlines() or ["?"])[-1]


def prepare(engine: str, python: Path, hf: Path, dtype: str) -> tuple[dict[str, Any], str | None]:
    """Extra worker arguments, or the reason the engine is skipped."""
    if engine in VENVS:
        venv = python.parents[1]
        if (venv / "SKIPPED").exists():
            return {}, (venv / "SKIPPED").read_text().strip()
        if not python.exists():
            return {}, f"no venv at {venv} (make bench-peers creates it)"
        module = IMPORTS[venv.name]
        tail = _run_tail([str(python), "-c", f"import {module}"])
        if tail:
            return {}, f"import {module} failed: {tail}"
    if engine == "ctranslate2":
        out = hf.parent / "ct2-float32"
        code = (
            "import sys, ctranslate2;"
            "ctranslate2.converters.TransformersConverter(sys.argv[1]).convert("
            "sys.argv[2], quantization='float32', force=True)"
        )
        if not (out / "model.bin").exists():
            tail = _run_tail([str(python), "-c", code, str(hf), str(out)])
            if tail:
                return {}, f"conversion failed: {tail}"
        return {"ct2_model": str(out)}, None
    if VENVS.get(engine) == "llamacpp":
        out = hf.parent / f"gguf-{dtype}.gguf"
        convert = ["--convert-gguf", str(out), "--checkpoint", str(hf), "--dtype", dtype]
        if not out.exists():
            tail = _run_tail([str(python), str(Path(__file__).resolve()), *convert])
            if tail:
                return {}, f"GGUF conversion failed: {tail}"
        return {"gguf": str(out)}, None
    return {}, None


def cpu_list(cores: list[int]) -> str:
    """CPU numbers as a list of ranges: [0, 1, 2, 5] -> "0-2,5"."""
    spans: list[list[int]] = []
    for core in sorted(cores):
        if spans and core == spans[-1][1] + 1:
            spans[-1][1] = core
        else:
            spans.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


TCMALLOC_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


def guide_env(venv: Path, threads: int | None) -> dict[str, str]:
    """vLLM's CPU install guide's environment: the OpenMP threads bound to the cores
    this process may use (the first ``threads`` of them), TCMalloc and Intel's OpenMP
    (the intel-openmp wheel's lib/libiomp5.so) preloaded where they exist. TCMalloc
    has no pip package: the system's libtcmalloc_minimal.so.4, if installed."""
    cores = sorted(os.sched_getaffinity(0))[: threads or None]
    env = {"VLLM_CPU_OMP_THREADS_BIND": cpu_list(cores)}
    found = [Path(d) / "libtcmalloc_minimal.so.4" for d in TCMALLOC_DIRS]
    tcmalloc = next((str(path) for path in found if path.exists()), None)
    iomp = venv / "lib" / "libiomp5.so"
    preload = [tcmalloc, str(iomp) if iomp.exists() else None, os.environ.get("LD_PRELOAD")]
    if preload[0] or preload[1]:
        env["LD_PRELOAD"] = ":".join(filter(None, preload))
    return env


def spawn(
    engine: str, python: Path, args: argparse.Namespace, hf: Path, model: str, extra: dict
) -> dict[str, Any]:
    cmd = [
        str(python),
        str(Path(__file__).resolve()),
        "--worker",
        engine,
        "--checkpoint",
        str(hf),
        "--vocab",
        str(MODELS[model]["vocab"]),
        "--workloads",
        ",".join(args.workloads),
        "--dtype",
        args.dtype,
        "--scale",
        str(args.scale),
        "--spawned",
        repr(time.time()),
    ]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if "ct2_model" in extra:
        cmd += ["--ct2-model", extra["ct2_model"]]
    if "gguf" in extra:
        cmd += ["--gguf", extra["gguf"]]
    env = dict(os.environ)
    if engine == "vllm-guide":
        env.update(guide_env(python.parents[1], args.threads))
    if engine == "tiny_engine":
        paths = [str(REPO / "src"), str(REPO / "examples" / "tiny_engine" / "src")]
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    finished = run_bounded(cmd, env, args.timeout)
    if finished is None:
        return {"error": f"worker stopped after --timeout {args.timeout:g} s without finishing"}
    returncode, stdout, stderr = finished
    for line in stdout.splitlines():
        if line.startswith("@@RESULT@@"):
            return json.loads(line[len("@@RESULT@@") :])
    tail = " | ".join((stderr.strip().splitlines() or ["no output"])[-3:])
    return {"error": f"worker exited {returncode}: {tail}"[:2000]}


def run_bounded(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int, str, str] | None:
    """Run ``cmd`` in a session of its own: its exit status, stdout and stderr, or None
    when it ran past ``timeout`` seconds. Then the whole process group is killed (a
    peer's own processes too, such as vLLM's engine core, which would otherwise keep
    the cores busy through the next engine's run) and the benchmark goes on."""
    process = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return None
    return process.returncode, stdout, stderr


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bench,llama250m")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    parser.add_argument("--threads", type=int, default=None, help="threads per engine")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="shrink the workloads (smoke runs): 0.25 ..."
    )
    parser.add_argument("--cache", type=Path, default=Path("/tmp/hwplug-peers/models"))
    parser.add_argument("--peers-dir", type=Path, default=Path("/tmp/hwplug-peers"))
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per worker")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here too")
    # worker mode (internal)
    parser.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    parser.add_argument("--ct2-model", help=argparse.SUPPRESS)
    parser.add_argument("--gguf", help=argparse.SUPPRESS)
    parser.add_argument("--convert-gguf", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--vocab", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--spawned", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.workloads = [w for w in args.workloads.split(",") if w]
    if args.convert_gguf:
        write_gguf(Path(args.checkpoint), args.convert_gguf, args.dtype)
        return 0
    if args.worker:
        return run_worker(args)

    engines = [e for e in args.engines.split(",") if e]
    models = [m for m in args.models.split(",") if m]
    for name, items, known in (
        ("engine", engines, ENGINES),
        ("model", models, MODELS),
        ("workload", args.workloads, WORKLOADS),
    ):
        for item in items:
            if item not in known:
                parser.error(f"unknown {name} {item!r}: {', '.join(known)}")
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(["python", "benchmarks/bench_peers.py", *(argv or sys.argv[1:])]),
        "dtype": args.dtype,
        "rounds": args.rounds,
        "scale": args.scale,
        "cpus": os.cpu_count(),
        "threads": args.threads,
        "stream_read_gb_per_s": stream_read_gb_per_s(args.threads),
        "models": {},
    }
    for model in models:
        hf = ensure_checkpoint(args.cache, model)
        ready: dict[str, tuple[Path, dict[str, Any]]] = {}
        result: dict[str, Any] = {"spec": MODELS[model], "engines": {}}
        for engine in engines:
            python = engine_python(engine, args.peers_dir)
            extra, reason = prepare(engine, python, hf, args.dtype)
            if reason:
                result["engines"][engine] = {"skipped": reason}
            else:
                ready[engine] = (python, extra)
        runs: dict[str, list[dict[str, Any]]] = {e: [] for e in ready}
        for round_ in range(args.rounds):
            for engine, (python, extra) in ready.items():
                print(f"bench_peers: {model} round {round_ + 1} {engine}", file=sys.stderr)
                runs[engine].append(spawn(engine, python, args, hf, model, extra))
        reference = next((r for r in runs.get("transformers", []) if "error" not in r), None)
        for engine, rounds in runs.items():
            good = [r for r in rounds if "error" not in r]
            if not good:
                result["engines"][engine] = {"skipped": rounds[0]["error"]}
                continue
            entry: dict[str, Any] = {
                "info": good[0]["info"],
                "rounds_ok": len(good),
                "errors": [r["error"] for r in rounds if "error" in r],
                "startup_seconds": summary([r["startup_seconds"] for r in good]),
                "load_seconds": summary([r["load_seconds"] for r in good]),
                "full_speed_seconds": summary([r["full_speed_seconds"] for r in good]),
                "peak_rss_mib": summary([r["peak_rss_mib"] for r in good]),
                "workloads": {},
            }
            for name in args.workloads:
                figures = [r["workloads"][name] for r in good]
                w: dict[str, Any] = {
                    key: summary([f[key] for f in figures])
                    for key in ("e2e_tokens_per_s", "decode_tokens_per_s", "e2e_seconds")
                }
                latencies = [f.get("decode_ms_per_token") for f in figures]
                if None not in latencies:
                    w["decode_ms_per_token"] = summary(latencies)
                if name == "single":
                    weights = weight_bytes_per_token(MODELS[model], args.dtype)
                    w["weight_bytes_per_token"] = weights
                    w["weights_gb_per_s"] = summary(
                        [round(f["decode_tokens_per_s"] * weights / 1e9, 2) for f in figures]
                    )
                if reference is not None:
                    ref = reference["workloads"][name]["outputs"]
                    same = [a == b for a, b in zip(figures[0]["outputs"], ref)]
                    w["identical_to_transformers"] = round(sum(same) / len(same), 3)
                entry["workloads"][name] = w
            result["engines"][engine] = entry
        base = result["engines"].get("transformers", {}).get("workloads", {})
        result["ratio"] = {
            name: {
                engine: round(
                    e["workloads"][name]["e2e_tokens_per_s"]["median"]
                    / base[name]["e2e_tokens_per_s"]["median"],
                    2,
                )
                for engine, e in result["engines"].items()
                if "workloads" in e and engine != "transformers"
            }
            for name in args.workloads
            if name in base
        }
        medians = {
            name: {
                engine: e["workloads"][name]["e2e_tokens_per_s"]["median"]
                for engine, e in result["engines"].items()
                if "workloads" in e
            }
            for name in args.workloads
        }
        result["variants"] = {name: variant_report(medians[name]) for name in args.workloads}
        result["tiny_engine_ratio"] = {
            name: tiny_engine_ratios(medians[name]) for name in args.workloads
        }
        report["models"][model] = result
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
