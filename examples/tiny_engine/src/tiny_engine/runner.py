"""Running one scheduled step on the device: inputs, graph dispatch, forward, logits.

The runner owns the persistent input buffers (token ids, positions, slots and
the attention metadata), sized once for the largest step, so that every step
and every captured graph reads the same memory: a step writes its inputs
there, pads them to the graph key the :class:`~hwplug.core.graphs.GraphDispatcher`
chose, and runs the model eagerly, compiled, or by replaying a captured graph.

Compilation follows ``compilation.level``: 0 runs eagerly; 1 and 2 wrap the
model in ``torch.compile`` with the resolved backend (``init_backend()``); 3
uses hwplug's piecewise backend, which splits the graph at the attention op
and wraps each compiled piece in the platform's graph wrapper. FULL graphs wrap
the whole (compiled) model in the platform's graph wrapper.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hwplug.compilation import PiecewiseBackend
from hwplug.core.config import CUDAGraphMode, EngineConfig
from hwplug.core.graphs import (
    BatchDescriptor,
    GraphBackend,
    GraphDispatcher,
    capture_graphs,
    current_graph_context,
    graph_context,
)
from hwplug.core.platform import Platform
from tiny_engine.model import CausalLM
from tiny_engine.scheduler import Step

__all__ = ["ModelRunner"]

logger = logging.getLogger("tiny_engine")


class ModelRunner:
    """Prepares inputs, dispatches graphs and runs the model for one engine.

    Build it after the KV cache is in the model's layers: compilation and
    capture trace the model with its final buffers (``compile_model=False``
    gives an eager runner, for the profile run before the cache is sized).
    """

    def __init__(
        self,
        model: CausalLM,
        config: EngineConfig,
        platform: Platform,
        device: torch.device,
        *,
        compile_model: bool = True,
    ) -> None:
        self.model = model
        self.config = config
        self.platform = platform
        self.device = device
        sched = config.scheduler
        self.max_num_seqs = sched.max_num_seqs
        self.block_size = int(config.cache.block_size or 16)
        self.max_model_len = config.model.max_model_len
        self.max_blocks = -(-self.max_model_len // self.block_size)

        self.graph_backend: GraphBackend | None = None
        """The backend graph wrappers use: None (the platform's own), or hwplug's
        recording backend when a simulated platform's configuration runs on CPU tensors."""
        wrapper_cls = platform.graph_wrapper_cls()
        if wrapper_cls is not None and device.type != platform.device_type:
            self.graph_backend = _recording_backend()
        self.dispatcher = GraphDispatcher.from_config(config)
        self.max_tokens = max(sched.max_num_batched_tokens, self.dispatcher.max_capture_size)

        def buffer(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.input_ids = buffer(self.max_tokens, dtype=torch.int64)
        self.positions = buffer(self.max_tokens, dtype=torch.int64)
        self.slot_mapping = buffer(self.max_tokens, dtype=torch.int64)
        self.query_start_loc = buffer(self.max_num_seqs + 1, dtype=torch.int32)
        self.seq_lens = buffer(self.max_num_seqs, dtype=torch.int32)
        self.block_table = buffer(self.max_num_seqs, self.max_blocks, dtype=torch.int32)
        self._pin = device.type == "cuda"

        self.compiled: Callable[..., torch.Tensor] = self._compile() if compile_model else model
        self.full_graph: Callable[..., torch.Tensor] | None = None
        full = CUDAGraphMode.FULL in self.dispatcher.runtime_modes
        if wrapper_cls is not None and compile_model and full:
            self.full_graph = wrapper_cls(
                self.compiled, config.compilation, CUDAGraphMode.FULL, backend=self.graph_backend
            )
        self.captured: list[tuple[CUDAGraphMode, BatchDescriptor]] = []
        self.eager_steps = 0
        """Steps still to run eagerly, without compiled code or graphs (fp8 scale steps)."""

    # -- compilation --------------------------------------------------------------------
    def _compile(self) -> Callable[..., torch.Tensor]:
        comp = self.config.compilation
        level = int(comp.level or 0)
        if level == 0:
            return self.model
        backend: Any
        if level == 3:
            # hwplug's piecewise backend, for this engine's platform and graph backend.
            backend = PiecewiseBackend(
                comp, self.config, platform=self.platform, graph_backend=self.graph_backend
            )
        else:
            backend = comp.init_backend(self.config)
        options = None
        if backend == "inductor" and comp.inductor_compile_config:
            # Levels 1-2 hand Inductor a name: its options travel with torch.compile.
            options = dict(comp.inductor_compile_config)
        compiled = torch.compile(
            self.model, backend=backend, fullgraph=True, dynamic=True, options=options
        )
        return compiled

    # -- inputs -------------------------------------------------------------------------
    def _host(
        self, values: Sequence[int] | Sequence[list[int]], dtype: torch.dtype
    ) -> torch.Tensor:
        tensor = torch.tensor(values, dtype=dtype)
        return tensor.pin_memory() if self._pin else tensor

    def _args(self, num_tokens: int, batch: int) -> tuple[torch.Tensor, ...]:
        return (
            self.input_ids[:num_tokens],
            self.positions[:num_tokens],
            self.query_start_loc[: batch + 1],
            self.seq_lens[:batch],
            self.block_table[:batch],
            self.slot_mapping[:num_tokens],
        )

    def _graph_batch(self, padded: int) -> int:
        """Sequences in a FULL graph of ``padded`` tokens (the unused ones are empty)."""
        return min(padded, self.max_num_seqs)

    def prepare(
        self, step: Step
    ) -> tuple[CUDAGraphMode, BatchDescriptor, tuple[torch.Tensor, ...], list[int]]:
        """Write ``step``'s inputs into the buffers.

        Returns the runtime mode, the graph key, the model's arguments and, per
        sequence, the row whose logits are sampled (-1: a prompt chunk that
        does not end its prompt).
        """
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        starts = [0]
        lens: list[int] = []
        rows: list[int] = []
        size = self.block_size
        rows_of_blocks: list[list[int]] = []
        for seq, n in zip(step.seqs, step.num_new):
            first = seq.num_computed
            end = first + n
            ids.extend(seq.tokens[first:end])
            positions.extend(range(first, end))
            blocks = seq.blocks
            slots.extend(blocks[p // size] * size + p % size for p in range(first, end))
            starts.append(starts[-1] + n)
            lens.append(end)
            rows_of_blocks.append(blocks + [0] * (self.max_blocks - len(blocks)))
            rows.append(starts[-1] - 1 if end == len(seq.tokens) else -1)
        num_tokens = starts[-1]
        if self.eager_steps:
            mode, key = CUDAGraphMode.NONE, BatchDescriptor(num_tokens)
        else:
            mode, key = self.dispatcher.dispatch(
                BatchDescriptor(num_tokens, step.is_uniform_decode)
            )
        padded = key.num_tokens if mode is not CUDAGraphMode.NONE else num_tokens
        num_seqs = len(step.seqs)
        batch = self._graph_batch(padded) if mode is CUDAGraphMode.FULL else num_seqs
        pad, extra, nb = padded - num_tokens, batch - num_seqs, self._pin
        self.input_ids[:padded].copy_(self._host(ids + [0] * pad, torch.int64), non_blocking=nb)
        self.positions[:padded].copy_(
            self._host(positions + [0] * pad, torch.int64), non_blocking=nb
        )
        self.slot_mapping[:padded].copy_(
            self._host(slots + [-1] * pad, torch.int64), non_blocking=nb
        )
        self.query_start_loc[: batch + 1].copy_(
            self._host(starts + [num_tokens] * extra, torch.int32), non_blocking=nb
        )
        self.seq_lens[:batch].copy_(self._host(lens + [0] * extra, torch.int32), non_blocking=nb)
        table = self._host(rows_of_blocks, torch.int32)
        self.block_table[:num_seqs].copy_(table, non_blocking=nb)
        return mode, key, self._args(padded, batch), rows

    def _dummy_inputs(self, num_tokens: int, batch: int, uniform: bool) -> tuple[torch.Tensor, ...]:
        """A batch of ``num_tokens`` tokens in ``batch`` sequences that writes nothing."""
        if uniform:
            lens = [1] * batch
        else:
            lens = [
                num_tokens // batch + (1 if i < num_tokens % batch else 0) for i in range(batch)
            ]
        starts = [0]
        for q in lens:
            starts.append(starts[-1] + q)
        self.input_ids[:num_tokens].zero_()
        self.positions[:num_tokens].zero_()
        self.slot_mapping[:num_tokens].fill_(-1)
        self.query_start_loc[: batch + 1].copy_(torch.tensor(starts, dtype=torch.int32))
        self.seq_lens[:batch].copy_(torch.tensor(lens, dtype=torch.int32))
        self.block_table[:batch].zero_()
        return self._args(num_tokens, batch)

    def _dummy_batch(self, num_tokens: int) -> int:
        """Fewest sequences that hold ``num_tokens`` tokens within ``max_model_len`` each
        (``num_tokens`` is at most :meth:`largest_step`)."""
        return min(self.max_num_seqs, -(-num_tokens // self.max_model_len))

    def largest_step(self, num_tokens: int) -> int:
        """The most tokens of a real step, up to ``num_tokens``: the scheduler runs at
        most ``max_num_seqs`` sequences of at most ``max_model_len`` tokens each."""
        return min(num_tokens, self.max_tokens, self.max_num_seqs * self.max_model_len)

    # -- running ------------------------------------------------------------------------
    def forward(
        self, mode: CUDAGraphMode, key: BatchDescriptor, args: tuple[torch.Tensor, ...]
    ) -> torch.Tensor:
        """Hidden states of prepared inputs, ``[padded tokens, hidden]``."""
        if self.eager_steps:
            self.eager_steps -= 1
            return self.model(*args)
        if mode is CUDAGraphMode.NONE:
            return self.compiled(*args)
        with graph_context(mode, key):
            if mode is CUDAGraphMode.FULL and self.full_graph is not None:
                return self.full_graph(*args)
            return self.compiled(*args)

    def execute(self, step: Step) -> tuple[torch.Tensor, list[int]]:
        """Run ``step``; returns float32 logits of the sampled rows and, per sequence,
        its row in them (-1: nothing to sample)."""
        mode, key, args, rows = self.prepare(step)
        hidden = self.forward(mode, key, args)
        wanted = [r for r in rows if r >= 0]
        index = torch.tensor(wanted, dtype=torch.int64, device=self.device)
        logits = self.model.logits(hidden.index_select(0, index))
        order: list[int] = []
        k = 0
        for r in rows:
            order.append(k if r >= 0 else -1)
            k += r >= 0
        return logits, order

    # -- profiling, compilation and capture -------------------------------------------------
    def profile_run(self, num_tokens: int) -> None:
        """An eager forward of ``num_tokens`` dummy tokens (the largest step) that
        writes nothing to the cache."""
        n = self.largest_step(num_tokens)
        self.model(*self._dummy_inputs(n, self._dummy_batch(n), uniform=False))

    def warm_up(self) -> None:
        """Compile now rather than in the first step: one graph for every step size."""
        if self.compiled is self.model:
            return
        n = self.largest_step(self.max_tokens)
        args = self._dummy_inputs(n, self._dummy_batch(n), uniform=False)
        for t in args:
            # One graph for every size, 1 included (no 0/1 specialisation).
            torch._dynamo.decorators.mark_unbacked(t, 0)
        self.compiled(*args)

    def _dummy_step(self, key: BatchDescriptor) -> None:
        """Run a forward shaped like graph key ``key`` (called by ``capture_graphs``)."""
        n = key.num_tokens
        mode = current_graph_context().runtime_mode
        if mode is CUDAGraphMode.FULL:
            batch = self._graph_batch(n)
        elif key.uniform_decode:
            batch = n
        else:
            batch = self._dummy_batch(n)
        args = self._dummy_inputs(n, batch, uniform=key.uniform_decode)
        if mode is CUDAGraphMode.FULL and self.full_graph is not None:
            self.full_graph(*args)
        else:
            self.compiled(*args)

    def capture(self) -> list[tuple[CUDAGraphMode, BatchDescriptor]]:
        """Capture every graph the dispatcher can ask for (none without device graphs)."""
        plan = self.dispatcher.capture_keys()
        if not any(plan.values()):
            return []
        warmups = int(self.config.compilation.cudagraph_num_of_warmups or 0)
        self.captured = capture_graphs(self._dummy_step, plan, num_warmups=warmups)
        return self.captured


def _recording_backend() -> GraphBackend:
    """hwplug's CPU test double for device graphs."""
    from hwplug.testing import RecordingGraphBackend

    backend: GraphBackend = RecordingGraphBackend()
    return backend
