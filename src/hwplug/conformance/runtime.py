"""Runtime checks: the platform's KV cache, attention and graphs compute the right thing.

A simulated profile runs them on CPU tensors (what the platform's configuration
would do, computed by the CPU); a real device runs them on the device.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from typing import TYPE_CHECKING, Any

from hwplug.attention import AttentionMetadata, TritonAttentionBackend, backends_for
from hwplug.conformance.base import (
    CheckContext,
    CheckFailed,
    CheckSkipped,
    ResolutionBlocked,
    check,
)
from hwplug.core.config import CUDAGraphMode, EngineConfig
from hwplug.core.errors import ConfigError, error_line
from hwplug.core.graphs import GraphDispatcher, capture_graphs, graph_context
from hwplug.core.kv_cache import cache_dtype_to_torch
from hwplug.testing import RecordingGraphBackend

if TYPE_CHECKING:
    import torch

    from hwplug.attention import AttentionBackend
    from hwplug.core.platform import Platform

__all__: list[str] = []

_TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2, "float16": 2e-2}
_BATCHES = {
    "prefill": ([12, 7], [12, 7]),
    "chunked prefill": ([30], [6]),
    "decode": ([9, 33, 17, 1], [1, 1, 1, 1]),
    "mixed": ([20, 5, 41], [1, 5, 4]),
}


def _device(context: CheckContext) -> str:
    if context.device is None:
        raise CheckSkipped(context.runtime_problem or "no device to run on")
    return context.device


def _resolved(platform: Platform, context: CheckContext, data: dict[str, Any]) -> EngineConfig:
    cached = context.cache.get(repr(data))
    if cached is not None:
        return cached
    try:
        config = context.resolve(platform, EngineConfig.from_dict(data)).config
    except ResolutionBlocked as exc:
        raise CheckSkipped(str(exc)) from None
    except ConfigError as exc:
        raise CheckFailed(f"the config {data} does not resolve: {error_line(exc)}") from exc
    context.cache[repr(data)] = config
    return config


def _quiet_transformers() -> None:
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except Exception:  # an old or unusual transformers: its progress bar is harmless
        pass


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype)
    return dtype


# --------------------------------------------------------------------------- T01


@check(
    "T01",
    "KV cache write and gather round-trip",
    protects="a KV cache that gives back other values than it was given.",
    kind="runtime",
)
def kv_round_trip(platform: Platform, context: CheckContext) -> None:
    """For every advertised cache dtype: what ``write_kv_cache`` stores,
    ``gather_kv_cache`` reads back (fp8: within one rounding step)."""
    import torch

    # lazy: torch loads only for the checks that need it
    from hwplug.kernels import FP8_FORMATS, gather_kv_cache, write_kv_cache

    device = _device(context)
    config = _resolved(platform, context, {})
    block_size = config.cache.block_size or platform.supported_block_sizes()[0]
    gen = torch.Generator().manual_seed(context.seed)
    problems = []
    for name in platform.supported_cache_dtypes():
        dtype = cache_dtype_to_torch(name, config.model.dtype, platform)
        num_blocks, tokens, heads, size = 4, min(3 * block_size, 40), 2, 16
        key = torch.randn(tokens, heads, size, generator=gen)
        value = torch.randn(tokens, heads, size, generator=gen)
        slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
        shape = (num_blocks, block_size, heads, size)
        kc = torch.zeros(shape, dtype=dtype, device=device)
        vc = torch.zeros(shape, dtype=dtype, device=device)
        fp8 = dtype in FP8_FORMATS
        ks, vs = (0.05, 0.07) if fp8 else (1.0, 1.0)
        write_kv_cache(
            key.to(device), value.to(device), kc, vc, slots.to(device), ks, vs, backend="torch"
        )
        got_k, got_v = gather_kv_cache(
            kc, vc, slots.to(device), ks, vs, dtype=torch.float32, backend="torch"
        )
        for what, want, got, scale in (("key", key, got_k, ks), ("value", value, got_v, vs)):
            got = got.cpu()
            if fp8:
                info = torch.finfo(dtype)
                bound = want.abs() * info.eps + info.tiny * scale
                worst = ((got - want).abs() - bound).max().item()
                if worst > 0:
                    problems.append(
                        f"{name} ({dtype}): {what} read back off by more than one rounding step"
                    )
            elif not torch.equal(got, want.to(dtype).to(torch.float32)):
                problems.append(f"{name} ({dtype}): {what} read back differs from what was written")
    if problems:
        raise CheckFailed("; ".join(problems))


# --------------------------------------------------------------------------- T02


def reference_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    metadata: AttentionMetadata,
    *,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    window: int | None = None,
) -> torch.Tensor:
    """Causal paged attention in float64 over what the caches hold (dequantised); only the
    last ``window`` positions are seen when a window is given."""
    import torch

    # lazy: torch loads only for the checks that need it
    from hwplug.kernels import FP8_FORMATS

    fp8 = key_cache.dtype in FP8_FORMATS
    ks, vs = (k_scale, v_scale) if fp8 else (1.0, 1.0)
    query, key_cache, value_cache = query.cpu(), key_cache.cpu(), value_cache.cpu()
    block_size = key_cache.shape[1]
    group = query.shape[1] // key_cache.shape[2]
    starts = metadata.query_start_loc.tolist()
    lens = metadata.seq_lens.tolist()
    table = metadata.block_table.cpu().to(torch.int64)
    keys = key_cache.reshape(-1, *key_cache.shape[2:])
    values = value_cache.reshape(-1, *value_cache.shape[2:])
    out = torch.zeros((starts[-1], *query.shape[1:]), dtype=torch.float64)
    for b, seq_len in enumerate(lens):
        start, end = starts[b], starts[b + 1]
        if end == start:
            continue
        positions = torch.arange(seq_len)
        slots = table[b, positions // block_size] * block_size + positions % block_size
        k = (keys[slots].to(torch.float64) * ks).repeat_interleave(group, dim=1)
        v = (values[slots].to(torch.float64) * vs).repeat_interleave(group, dim=1)
        q = query[start:end].to(torch.float64)
        q_pos = torch.arange(seq_len - (end - start), seq_len)
        visible = positions[None, :] <= q_pos[:, None]
        if window is not None:
            visible &= positions[None, :] > q_pos[:, None] - window
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        scores = scores.masked_fill(~visible[None], float("-inf"))
        out[start:end] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    return out


def _backend_problem(backend: type[AttentionBackend], device: str) -> str | None:
    if issubclass(backend, TritonAttentionBackend) and device == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            return "Triton runs on CPU tensors only under TRITON_INTERPRET=1"
        if importlib.util.find_spec("triton") is None:
            return "triton is not installed"
    return None


def _cache_write_problem(
    what: str, got: torch.Tensor, want: torch.Tensor, slots: torch.Tensor
) -> str | None:
    """Whether a cache after the backend's call holds what the reference write stores.

    Every position must match: the written slots (fp8: within one rounding step
    of the reference's rounding), and everything else untouched (padding rows,
    whose slot is -1, included).
    """
    import torch

    # lazy: torch loads only for the checks that need it
    from hwplug.kernels import FP8_FORMATS

    got, want = got.cpu(), want.cpu()
    flat_got = got.reshape(-1, *got.shape[2:]).to(torch.float32)
    flat_want = want.reshape(-1, *want.shape[2:]).to(torch.float32)
    if got.dtype in FP8_FORMATS:
        info = torch.finfo(got.dtype)
        bound = flat_want.abs() * info.eps + info.tiny
    else:
        bound = torch.zeros_like(flat_want)
    wrong = ((flat_got - flat_want).abs() > bound) | (flat_got.isnan() != flat_want.isnan())
    bad = wrong.flatten(1).any(dim=1).nonzero().flatten().tolist()
    if not bad:
        return None
    written = set(slots[slots >= 0].tolist())
    missed = [s for s in bad if s in written]
    stray = [s for s in bad if s not in written]
    parts = []
    if missed:
        parts.append(
            f"{len(missed)} of the {len(written)} slots written this step hold other values "
            f"than the reference write (first: slot {missed[0]})"
        )
    if stray:
        parts.append(
            f"{len(stray)} slots that nothing was written to changed (first: slot {stray[0]})"
        )
    return f"its {what} cache is wrong after the call: " + "; ".join(parts)


def _attend(
    backend: type[AttentionBackend],
    lengths: tuple[list[int], list[int]],
    *,
    block_size: int,
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    head_size: int,
    device: str,
    seed: int,
    window: int | None = None,
) -> tuple[float, str | None]:
    """Run one batch (with padding rows) through ``backend``.

    Returns the largest error against the float64 reference computed from the
    reference write, and what is wrong with the caches the backend left (None
    when they hold exactly what the reference write stores).
    """
    import torch

    # lazy: torch loads only for the checks that need it
    from hwplug.kernels import FP8_FORMATS, write_kv_cache

    seq_lens, query_lens = lengths
    heads, kv_heads = 4, 2
    padding = 3
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(needed) + 2
    order = torch.randperm(num_blocks, generator=gen).tolist()
    table, used = [], 0
    for n in needed:
        table.append(order[used : used + n])
        used += n
    metadata = AttentionMetadata.from_lengths(
        seq_lens, query_lens, table, block_size, num_tokens=sum(query_lens) + padding
    ).to(device)
    n = sum(query_lens) + padding
    shape = (num_blocks, block_size, kv_heads, head_size)
    key_cache = torch.randn(shape, generator=gen).to(cache_dtype).to(device)
    value_cache = torch.randn(shape, generator=gen).to(cache_dtype).to(device)
    query = torch.randn(n, heads, head_size, generator=gen).to(dtype).to(device)
    key = torch.randn(n, kv_heads, head_size, generator=gen).to(dtype).to(device)
    value = torch.randn(n, kv_heads, head_size, generator=gen).to(dtype).to(device)
    fp8 = cache_dtype in FP8_FORMATS
    ks, vs = (0.5, 0.5) if fp8 else (1.0, 1.0)
    # what the caches must hold after the call: hwplug's reference write
    want_k, want_v = key_cache.clone(), value_cache.clone()
    write_kv_cache(key, value, want_k, want_v, metadata.slot_mapping, ks, vs, backend="torch")
    scale = head_size**-0.5
    impl = backend(
        heads, head_size, kv_heads, scale, sliding_window=window, cache_dtype=cache_dtype
    )
    # as an engine runs a step: prepared once, then the layer's forward
    step = backend.prepare(metadata, num_blocks=num_blocks, block_size=block_size)
    out = impl.forward(query, key, value, key_cache, value_cache, step, k_scale=ks, v_scale=vs)
    if out.shape != query.shape or out.dtype != dtype:
        raise CheckFailed(
            f"the {backend.name} backend returned {tuple(out.shape)} {out.dtype}, "
            f"expected {tuple(query.shape)} {dtype}"
        )
    slots = metadata.slot_mapping.cpu()
    cache_problem = _cache_write_problem("key", key_cache, want_k, slots) or _cache_write_problem(
        "value", value_cache, want_v, slots
    )
    want = reference_attention(
        query, want_k, want_v, metadata, scale=scale, k_scale=ks, v_scale=vs, window=window
    )
    got = out[: want.shape[0]].cpu().to(torch.float64)
    error = float((got - want).abs().max().item()) if want.numel() else 0.0
    return error, cache_problem


_HEAD_SIZES = (64, 128, 32, 80, 96, 112, 256, 48, 16)
"""Head sizes the runtime checks try, most common first."""


def _head_size_for(
    backend: type[AttentionBackend], config: EngineConfig, platform: Platform
) -> tuple[int | None, str]:
    """The first head size of :data:`_HEAD_SIZES` that ``backend`` serves with ``config``
    on ``platform``, or None and each size's problem."""
    import copy

    problems = []
    for size in _HEAD_SIZES:
        trial = copy.deepcopy(config)
        trial.model.head_size = size
        why = backend.problem(trial, platform)
        if why is None:
            return size, ""
        problems.append(f"{size}: {why}")
    return None, "; ".join(problems)


@check(
    "T02",
    "Attention backends match a float64 reference and write the cache",
    protects=(
        "an attention backend that computes wrong outputs for some batch shape, or leaves "
        "the KV cache other than the reference write (the next step reads it)."
    ),
    kind="runtime",
)
def attention_matches_reference(platform: Platform, context: CheckContext) -> None:
    """Every backend of the platform's order, at the first head size it serves, on
    prefill, chunked prefill, decode and mixed batches (with padding rows): for every
    model dtype the platform advertises (at the default block size), at every other
    advertised block size, for every other advertised cache dtype, and with a sliding
    window where the backend claims to serve one. The output is compared with a
    float64 reference at SPEC 12's tolerance for the model dtype (1e-4 for float32,
    2e-2 for 16 bits), and the caches with ``write_kv_cache``'s reference write (every
    slot; fp8 within one rounding step)."""
    device = _device(context)
    config = _resolved(platform, context, {})
    installed = backends_for(platform)
    default_dtype = config.model.dtype
    ran: list[str] = []
    for name in platform.attention_backends(config):
        backend = installed.get(name)
        if backend is None:
            raise CheckFailed(
                f"attention backend {name!r} is not installed, or does not serve platform "
                f"{platform.name!r} (see R13)"
            )
        why = _backend_problem(backend, device)
        head_size, problems = _head_size_for(backend, config, platform)
        if why is None and head_size is None:
            why = f"it serves none of the head sizes tried ({problems})"
        if why is not None or head_size is None:
            context.note(f"{name} not run: {why}")
            continue
        default_block = config.cache.block_size or platform.supported_block_sizes()[0]
        dtypes = [
            d
            for d in platform.supported_model_dtypes()
            if backend.model_dtypes is None or d in backend.model_dtypes
        ] or [default_dtype]
        # (kind, block size, cache dtype, model dtype, window)
        cases: list[tuple[str, int, str, str, int | None]] = [
            (kind, default_block, "auto", d, None) for d in dtypes for kind in _BATCHES
        ]
        cases += [
            (kind, size, "auto", default_dtype, None)
            for size in platform.supported_block_sizes()
            if size != default_block
            for kind in _BATCHES
        ]
        cases += [
            ("mixed", default_block, c, default_dtype, None)
            for c in platform.supported_cache_dtypes()
            if c != "auto" and (backend.cache_dtypes is None or c in backend.cache_dtypes)
        ]
        if backend.supports_sliding_window:
            cases += [(kind, default_block, "auto", default_dtype, 5) for kind in _BATCHES]
        skipped_blocks = set()
        for kind, size, cache_name, model_dtype, window in cases:
            if backend.block_sizes is not None and size not in backend.block_sizes:
                skipped_blocks.add(size)
                continue
            cache_dtype = cache_dtype_to_torch(cache_name, model_dtype, platform)
            error, cache_problem = _attend(
                backend,
                _BATCHES[kind],
                block_size=size,
                dtype=_torch_dtype(model_dtype),
                cache_dtype=cache_dtype,
                head_size=head_size,
                device=device,
                seed=context.seed,
                window=window,
            )
            where = (
                f"on a {kind} batch at block size {size}, cache dtype {cache_name} "
                f"({cache_dtype}), head size {head_size}, model dtype {model_dtype}"
                + (f", sliding window {window}" if window else "")
            )
            if cache_problem is not None:
                raise CheckFailed(f"the {name} backend: {cache_problem} {where}")
            limit = _TOLERANCE.get(model_dtype, 2e-2)
            if not error <= limit:
                raise CheckFailed(f"the {name} backend is off by {error:.3g} (> {limit:g}) {where}")
        if skipped_blocks:
            context.note(f"{name} does not serve block sizes {sorted(skipped_blocks)}")
        context.note(
            f"{name}: head size {head_size}, model dtypes {', '.join(dtypes)}, "
            f"block sizes {', '.join(str(b) for b in platform.supported_block_sizes())}"
            + (", sliding window 5" if backend.supports_sliding_window else "")
        )
        ran.append(name)
    if not ran:
        raise CheckSkipped("; ".join(context.notes) or "the platform names no attention backend")


# --------------------------------------------------------------------------- T03


@check(
    "T03",
    "Graph capture and replay match eager",
    protects="replayed device graphs that give other outputs than the eager model.",
    kind="runtime",
)
def graphs_match_eager(platform: Platform, context: CheckContext) -> None:
    """Capture every key the dispatcher plans through the platform's wrapper (the
    recording backend on CPU tensors), replay each, and compare with the eager call."""
    import torch

    device = _device(context)
    try:
        has_graphs = platform.has_device_graphs()
    except Exception as exc:
        raise CheckFailed(f"has_device_graphs() raised {error_line(exc)} (see R12)") from exc
    if not has_graphs:
        raise CheckSkipped(f"the {platform.name} platform captures no device graphs")
    wrapper_cls = platform.graph_wrapper_cls()
    assert wrapper_cls is not None
    config = _resolved(
        platform,
        context,
        {"scheduler": {"max_num_seqs": 4, "cuda_graph_sizes": [16]}},
    )
    mode = config.compilation.cudagraph_mode
    if mode is None or mode == CUDAGraphMode.NONE:
        raise CheckSkipped(f"resolution plans no graphs on {platform.name} (cudagraph_mode NONE)")
    graph_backend: Any = None
    if platform.simulated:
        graph_backend = RecordingGraphBackend()

    def eager(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    dispatcher = GraphDispatcher.from_config(config)
    plan = dispatcher.capture_keys()
    planned = [(m, k) for m, keys in plan.items() if m != CUDAGraphMode.NONE for k in keys]
    if not planned:
        raise CheckSkipped("the dispatcher plans no graph")
    # PIECEWISE wrapper inside, FULL outside: each captures under its own mode only.
    model: Any = eager
    for runtime_mode in sorted({m for m, _ in planned}, key=lambda m: m.value):
        model = wrapper_cls(model, config.compilation, runtime_mode, graph_backend)
    buffer = torch.zeros(max(k.num_tokens for _, k in planned), device=device)
    done = capture_graphs(lambda key: model(buffer[: key.num_tokens]), plan)
    missing = sorted(set(planned) - set(done), key=str)
    if missing:
        raise CheckFailed(f"planned graphs were not captured: {missing[:4]}")
    gen = torch.Generator().manual_seed(context.seed)
    for runtime_mode, key in planned:
        data = torch.randn(key.num_tokens, generator=gen).to(device)
        buffer[: key.num_tokens] = data
        with graph_context(runtime_mode, key):
            out = model(buffer[: key.num_tokens])
        if not platform.simulated and device != "cpu":
            platform.synchronize()
        if not torch.equal(out.cpu(), eager(data).cpu()):
            raise CheckFailed(f"the {runtime_mode.name} graph for {key} replayed other values")


# --------------------------------------------------------------------------- T04


@check(
    "T04",
    "A tiny checkpoint generates as on the CPU in fp32",
    protects="an engine that generates other tokens on the platform than the model's own.",
    kind="runtime",
)
def tiny_checkpoint(platform: Platform, context: CheckContext) -> None:
    """Greedy generation of a tiny random checkpoint (``tiny_engine``) on the platform
    equals the CPU float32 result token for token."""
    device = _device(context)
    for module in ("transformers", "tiny_engine"):
        if importlib.util.find_spec(module) is None:
            raise CheckSkipped(f"{module} is not installed")
    if context.resolution_problem is not None:
        raise CheckSkipped(context.resolution_problem)
    from tiny_engine import LLM  # type: ignore[import-not-found,unused-ignore]
    from tiny_engine.make_checkpoint import (  # type: ignore[import-not-found,unused-ignore]
        make_checkpoint,
    )

    prompts = [[1, 5, 9, 14, 3], [7, 7, 2]]
    dtype = "float32" if "float32" in platform.supported_model_dtypes() else None
    model_section: dict[str, Any] = {"dtype": dtype} if dtype else {}
    if platform.simulated:
        # CPU tensors stand in for the device: compiling and capturing for it is not the point.
        model_section["enforce_eager"] = True
    head_size, backend_name = _checkpoint_head_size(platform, context, model_section)
    if backend_name is not None:
        backend = backends_for(platform).get(backend_name)
        why = None if backend is None else _backend_problem(backend, device)
        if why is not None:
            raise CheckSkipped(f"the {backend_name} attention backend cannot run here: {why}")
    _quiet_transformers()
    with tempfile.TemporaryDirectory(prefix="hwplug-conformance-") as tmp:
        path = make_checkpoint(
            tmp,
            layers=1,
            hidden=4 * head_size,
            heads=4,
            kv_heads=2,
            head_dim=head_size,
            intermediate=64,
            vocab=64,
            init_std=0.5,
            seed=1,
        )
        # closed at once: a reference still compiling in the background would take a
        # core from the engine under test and from every check after this one
        with LLM(
            path, config={"model": {"dtype": "float32"}}, platform="cpu", device="cpu"
        ) as reference:
            want = reference.generate(prompts, max_tokens=4, ignore_eos=True)
        try:
            engine = LLM(path, config={"model": model_section}, platform=platform, device=device)
        except ConfigError as exc:
            raise CheckFailed(
                f"a checkpoint of head size {head_size}, which resolves on {platform.name}, "
                f"cannot be served: {error_line(exc)}"
            ) from exc
        with engine:
            got = engine.generate(prompts, max_tokens=4, ignore_eos=True)
    if got != want:
        raise CheckFailed(
            f"generated {got} on {platform.name} (head size {head_size}), but the CPU in "
            f"float32 generates {want}"
        )


def _checkpoint_head_size(
    platform: Platform, context: CheckContext, model_section: dict[str, Any]
) -> tuple[int, str | None]:
    """The first head size of :data:`_HEAD_SIZES` whose tiny model resolves on ``platform``
    (an attention backend serves it), and that backend; skips the check, with each size's
    reason, when none does.
    """
    problems = []
    for size in _HEAD_SIZES:
        model = dict(
            model_section,
            head_size=size,
            hidden_size=4 * size,
            num_attention_heads=4,
            num_kv_heads=2,
            num_layers=1,
            max_model_len=64,
        )
        try:
            resolution = context.resolve(platform, EngineConfig.from_dict({"model": model}))
        except ResolutionBlocked as exc:
            raise CheckSkipped(str(exc)) from None
        except ConfigError as exc:
            problems.append(f"{size}: {error_line(exc)}")
            continue
        return size, resolution.config.attention.backend
    raise CheckSkipped(
        f"no tiny checkpoint resolves on {platform.name} (head sizes tried: {'; '.join(problems)})"
    )


# --------------------------------------------------------------------------- T05

_COLLECTIVES_SCRIPT = """
import json, sys
from datetime import timedelta

import torch

import hwplug

rank, port = int(sys.argv[1]), sys.argv[2]
platform = hwplug.get_platform()
platform.init_distributed(
    rank, 2, init_method=f"tcp://127.0.0.1:{port}", timeout=timedelta(seconds=60)
)
comm = platform.device_communicator()
device = platform.torch_device(0 if platform.device_type == "cpu" else rank)
x = torch.tensor([1.0, 2.0], device=device) * (rank + 1)
out = {"class": type(comm).__name__, "world": [comm.world_size, comm.rank]}
out["all_reduce"] = comm.all_reduce(x.clone()).cpu().tolist()
out["all_gather"] = comm.all_gather(x).cpu().tolist()
y = torch.arange(4.0, device=device) + 10 * rank
out["reduce_scatter"] = comm.reduce_scatter(y).cpu().tolist()
out["broadcast"] = comm.broadcast(torch.tensor([float(rank)], device=device), src=1).cpu().tolist()
comm.barrier()
# a pipeline of two stages (SPEC 15): its groups, and a transfer each way
mesh = platform.init_model_parallel(1, 2)
out["stage"] = [mesh.pp_rank, mesh.is_first_stage, mesh.is_last_stage]
pipe = mesh.pp_communicator
if mesh.is_first_stage:
    pipe.send(torch.tensor([5.0, 6.0], device=device), mesh.next_stage)
    pipe.send_object({"step": 3, "ids": [1, 2]}, mesh.next_stage)
    got = pipe.recv(torch.zeros(2, device=device), mesh.next_stage)
    out["recv_object"] = pipe.recv_object(mesh.next_stage)
else:
    got = pipe.recv(torch.zeros(2, device=device), mesh.previous_stage)
    out["recv_object"] = pipe.recv_object(mesh.previous_stage)
    pipe.send(got + 1, mesh.previous_stage)
    pipe.send_object("ok", mesh.previous_stage)
out["recv"] = got.cpu().tolist()
platform.destroy_distributed()
print(json.dumps(out), flush=True)
"""

_TRANSFERS_WANT = (
    {"stage": [0, True, False], "recv": [6.0, 7.0], "recv_object": "ok"},
    {"stage": [1, False, True], "recv": [5.0, 6.0], "recv_object": {"step": 3, "ids": [1, 2]}},
)
"""What each rank of the two-stage pipeline receives."""

_COLLECTIVES_WANT = {
    "all_reduce": [3.0, 6.0],
    "all_gather": [1.0, 2.0, 2.0, 4.0],
    "broadcast": [1.0],
}


@check(
    "T05",
    "Collectives and transfers run in a world of two",
    protects=(
        "tensor-parallel ranks that cannot sum, gather, scatter or share tensors over the "
        "platform's process group, and pipeline stages that cannot hand their activations "
        "and step metadata on (send/recv, send_object/recv_object)."
    ),
    kind="runtime",
)
def collectives(platform: Platform, context: CheckContext) -> None:
    """Two processes join a process group with ``init_distributed`` (the platform's
    ``dist_backend``) and run every collective of ``device_communicator()`` on the
    platform's device; then ``init_model_parallel(1, 2)`` makes them a pipeline of two
    stages, whose communicator sends a tensor and an object each way. The results must
    be the sums, gathers and transfers they should be."""
    import json
    import socket
    import subprocess
    import sys

    if context.device is None:
        raise CheckSkipped(context.runtime_problem or "no device to run on")
    if platform.simulated:
        raise CheckSkipped(
            f"the {platform.name} platform is simulated (profile {platform.profile!r}): there "
            "is no device to join a process group with"
        )
    if not platform.dist_backend:
        raise CheckFailed(
            f"the {platform.name} platform names no torch.distributed backend (dist_backend)"
        )
    if platform.device_type != "cpu" and len(platform.devices) < 2:
        raise CheckSkipped(
            f"a world of two needs two {platform.name} devices; {len(platform.devices)} visible"
        )
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    env = dict(os.environ, HWPLUG_PLATFORM=platform.name)
    env.pop("HWPLUG_SIMULATE", None)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _COLLECTIVES_SCRIPT, str(rank), port],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in range(2)
    ]
    outputs = []
    try:
        for rank, proc in enumerate(procs):
            out, err = proc.communicate(timeout=180)
            if proc.returncode != 0:
                last = (err.strip().splitlines() or ["(no output)"])[-1]
                raise CheckFailed(f"rank {rank} of a world of two failed: {last}")
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    except subprocess.TimeoutExpired as exc:
        raise CheckFailed("a world of two did not finish its collectives within 180 s") from exc
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    scatter = ([10.0, 12.0], [14.0, 16.0])
    for rank, out in enumerate(outputs):
        if out["world"] != [2, rank]:
            raise CheckFailed(f"rank {rank}'s communicator reports world {out['world']}")
        want = dict(_COLLECTIVES_WANT, reduce_scatter=scatter[rank], **_TRANSFERS_WANT[rank])
        for name, value in want.items():
            if out[name] != value:
                raise CheckFailed(
                    f"{out['class']}.{name} gave {out[name]} on rank {rank}; expected {value}"
                )
    context.note(f"{outputs[0]['class']} over {platform.dist_backend}")
