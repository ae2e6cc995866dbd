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
the whole (compiled) model in the platform's graph wrapper. Where hwplug says
the model may compile in the background (no graphs to capture, one rank:
:func:`hwplug.compilation.compiles_in_background`), the runner serves eagerly
until the compiled model, built and warmed up in a worker thread on inputs of
its own, is ready, and then switches to it between two steps.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hwplug.attention import AttentionMetadata, forward_context, get_backend
from hwplug.compilation import BackgroundCompilation, compile_model, serving
from hwplug.core.config import CUDAGraphMode, EngineConfig
from hwplug.core.distributed import DeviceCommunicator
from hwplug.core.graphs import (
    BatchDescriptor,
    GraphBackend,
    GraphDispatcher,
    GraphWrapper,
    capture_graphs,
    current_graph_context,
    graph_context,
)
from hwplug.core.platform import Platform
from tiny_engine.model import CausalLM
from tiny_engine.scheduler import Step

__all__ = ["ModelRunner", "StepInput"]


@dataclasses.dataclass(frozen=True)
class StepInput:
    """What a rank needs of one scheduled step, as plain (picklable) lists.

    Per sequence, in batch order: the tokens it computes this step, the
    position of the first of them, its KV blocks, and whether the step ends
    its known tokens (its last row is sampled).
    """

    tokens: list[list[int]]
    starts: list[int]
    blocks: list[list[int]]
    sample: list[bool]

    @classmethod
    def from_step(cls, step: Step) -> StepInput:
        tokens, starts, blocks, sample = [], [], [], []
        for seq, n in zip(step.seqs, step.num_new):
            first = seq.num_computed
            tokens.append(seq.tokens[first : first + n])
            starts.append(first)
            blocks.append(list(seq.blocks))
            sample.append(first + n == len(seq.tokens))
        return cls(tokens, starts, blocks, sample)

    @property
    def is_uniform_decode(self) -> bool:
        """Every sequence computes exactly one token (a pure decode batch)."""
        return all(len(t) == 1 for t in self.tokens)


logger = logging.getLogger("tiny_engine")

WARM_UP_TOKENS = 32
"""Tokens of the step the model is compiled on (any size gives the same graph)."""
COMPILE_START_AFTER = 2.0
"""Seconds a background compilation waits for the first step to end before it starts
anyway. Measured on the 250M model in bf16 (2 cores): the first token took 2.7-3.6 s
with the compiler beside it, 0.4-0.5 s alone."""


class ModelRunner:
    """Prepares inputs, dispatches graphs and runs the model for one engine.

    Build it after the KV cache is in the model's layers: compilation and
    capture trace the model with its final buffers (``compile_model=False``
    gives an eager runner, for the profile run before the cache is sized).
    With ``background`` (the caller has asked
    :func:`~hwplug.compilation.compiles_in_background`), :meth:`warm_up` starts
    the compilation in a worker thread and the runner runs eagerly until it is done.
    """

    def __init__(
        self,
        model: CausalLM,
        config: EngineConfig,
        platform: Platform,
        device: torch.device,
        *,
        compile_model: bool = True,
        background: bool = False,
        pipe: DeviceCommunicator | None = None,
    ) -> None:
        self.model = model
        self.stage = model.stage
        self.pipe = pipe
        """The communicator of this rank's pipeline group (stages send hidden states to the
        next over it; ranks in it are stage numbers); None with one stage."""
        if self.stage.size > 1 and pipe is None:
            raise ValueError(f"{self.stage!r} needs its pipeline group's communicator (pipe=)")
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
        self.hidden_in: torch.Tensor | None = None
        """Where a stage after the first receives the previous stage's hidden states (its
        model's input in place of the token ids)."""
        if not self.stage.is_first:
            hidden = model.spec.hidden_size
            self.hidden_in = torch.zeros(
                self.max_tokens, hidden, dtype=model.hidden_dtype, device=device
            )
        self.positions = buffer(self.max_tokens, dtype=torch.int64)
        self.metadata_buffers = AttentionMetadata(
            query_start_loc=buffer(self.max_num_seqs + 1, dtype=torch.int32),
            seq_lens=buffer(self.max_num_seqs, dtype=torch.int32),
            block_table=buffer(self.max_num_seqs, self.max_blocks, dtype=torch.int32),
            slot_mapping=buffer(self.max_tokens, dtype=torch.int64),
        )
        """Where each step's attention metadata is built (``AttentionMetadata.build(out=...)``):
        every step and every captured graph reads the same memory."""
        self.attention = get_backend(str(config.attention.backend))
        self._pin = device.type == "cuda"

        self.background: BackgroundCompilation[Callable[..., torch.Tensor]] | None = None
        """The compilation running in a worker thread (until the runner adopts its result)."""
        self._compile_later = compile_model and background
        self._finished: BackgroundCompilation[Callable[..., torch.Tensor]] | None = None
        self.compiled: Callable[..., torch.Tensor] = (
            self._compile() if compile_model and not background else model
        )
        self.full_graph: Callable[..., torch.Tensor] | None = None
        full = CUDAGraphMode.FULL in self.dispatcher.runtime_modes
        if wrapper_cls is not None and compile_model and full:
            self.full_graph = wrapper_cls(
                self.compiled, config.compilation, CUDAGraphMode.FULL, backend=self.graph_backend
            )
        self.step_dispatcher: GraphDispatcher | None = None
        """Where the device has no graphs: the dispatcher of the platform's host step
        graphs (uniform decode batches padded to a built size), else None."""
        self.step_graph: GraphWrapper | None = None
        """The platform's host step graphs around the model (built per key in
        :meth:`capture`, or in the background compilation's thread)."""
        step_cls = platform.step_graph_wrapper_cls()
        if compile_model and step_cls is not None and device.type == platform.device_type:
            self.step_dispatcher = platform.step_graph_dispatcher(config)
            if self.step_dispatcher is not None:
                self.step_graph = step_cls(model, config.compilation, CUDAGraphMode.FULL)
        self.captured: list[tuple[CUDAGraphMode, BatchDescriptor]] = []
        self.eager_steps = 0
        """Steps still to run eagerly, without compiled code or graphs (fp8 scale steps)."""

    # -- compilation --------------------------------------------------------------------
    def _compile(self) -> Callable[..., torch.Tensor]:
        compiled: Callable[..., torch.Tensor] = compile_model(
            self.model, self.config, platform=self.platform, graph_backend=self.graph_backend
        )
        return compiled

    # -- inputs -------------------------------------------------------------------------
    def _host(self, values: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        tensor = torch.tensor(values, dtype=dtype)
        return tensor.pin_memory() if self._pin else tensor

    def _private_buffers(self) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Input buffers shaped as the runner's own, for steps run beside the engine's."""

        def like(t: torch.Tensor) -> torch.Tensor:
            return torch.zeros_like(t)

        m = self.metadata_buffers
        metadata = AttentionMetadata(
            like(m.query_start_loc), like(m.seq_lens), like(m.block_table), like(m.slot_mapping)
        )
        first = self.input_ids if self.hidden_in is None else self.hidden_in
        return like(first), like(self.positions), metadata

    def _step_inputs(
        self,
        ids: list[int],
        positions: list[int],
        query_lens: list[int],
        seq_lens: list[int],
        tables: list[list[int]],
        slots: list[int],
        buffers: tuple[torch.Tensor, torch.Tensor, AttentionMetadata] | None = None,
    ) -> tuple[tuple[torch.Tensor, ...], Any]:
        """Write one step's inputs into the buffers (default: the runner's) and prepare
        its attention.

        Returns the model's arguments (views of the buffers) and the prepared
        attention step the model's layers run with (``forward_context``).
        """
        inputs, position_buf, metadata_buffers = buffers or (
            self.input_ids if self.hidden_in is None else self.hidden_in,
            self.positions,
            self.metadata_buffers,
        )
        n, nb = len(ids), self._pin
        if self.hidden_in is None:  # a later stage's input comes from the previous stage
            inputs[:n].copy_(self._host(ids, torch.int64), non_blocking=nb)
        position_buf[:n].copy_(self._host(positions, torch.int64), non_blocking=nb)
        metadata = AttentionMetadata.build(
            query_lens, seq_lens, tables, slots, device=self.device, out=metadata_buffers
        )
        cache = self.model.attention_layers()[0].key_cache
        prepared = self.attention.prepare(
            metadata, num_blocks=int(cache.shape[0]), block_size=int(cache.shape[1])
        )
        args = (
            inputs[:n],
            position_buf[:n],
            metadata.query_start_loc,
            metadata.seq_lens,
            metadata.block_table,
            metadata.slot_mapping,
        )
        return args, prepared

    def _step_graph_key(self, batch: BatchDescriptor) -> tuple[CUDAGraphMode, BatchDescriptor]:
        """The host step graph for ``batch``: FULL and its key once that key is built
        (and the compiled model adopted), else NONE: the compiled model runs it."""
        assert self.step_dispatcher is not None
        assert self.step_graph is not None
        mode, key = self.step_dispatcher.dispatch(batch)
        if mode is CUDAGraphMode.FULL and self.step_graph.is_captured(key):
            return mode, key
        return CUDAGraphMode.NONE, batch

    def _graph_batch(self, padded: int) -> int:
        """Sequences in a FULL graph of ``padded`` tokens (the unused ones are empty)."""
        return min(padded, self.max_num_seqs)

    def prepare(
        self, step: StepInput
    ) -> tuple[CUDAGraphMode, BatchDescriptor, tuple[torch.Tensor, ...], Any, list[int]]:
        """Write ``step``'s inputs into the buffers and prepare its attention.

        Returns the runtime mode, the graph key, the model's arguments, the
        prepared attention step and, per sequence, the row whose logits are
        sampled (-1: a prompt chunk that does not end its prompt).
        """
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_lens: list[int] = []
        lens: list[int] = []
        rows: list[int] = []
        size = self.block_size
        num_tokens = 0
        for new, first, blocks, sample in zip(step.tokens, step.starts, step.blocks, step.sample):
            n = len(new)
            end = first + n
            ids.extend(new)
            positions.extend(range(first, end))
            slots.extend(blocks[p // size] * size + p % size for p in range(first, end))
            num_tokens += n
            query_lens.append(n)
            lens.append(end)
            rows.append(num_tokens - 1 if sample else -1)
        if self.eager_steps:
            mode, key = CUDAGraphMode.NONE, BatchDescriptor(num_tokens)
        else:
            batch_key = BatchDescriptor(num_tokens, step.is_uniform_decode)
            mode, key = self.dispatcher.dispatch(batch_key)
            if mode is CUDAGraphMode.NONE and self.step_dispatcher is not None:
                mode, key = self._step_graph_key(batch_key)
        padded = key.num_tokens if mode is not CUDAGraphMode.NONE else num_tokens
        num_seqs = len(step.tokens)
        batch = self._graph_batch(padded) if mode is CUDAGraphMode.FULL else num_seqs
        pad, extra = padded - num_tokens, batch - num_seqs
        args, prepared = self._step_inputs(
            ids + [0] * pad,
            positions + [0] * pad,
            query_lens + [0] * extra,
            lens + [0] * extra,
            list(step.blocks) + [[]] * extra,
            slots + [-1] * pad,
        )
        return mode, key, args, prepared, rows

    def _dummy_inputs(
        self,
        num_tokens: int,
        batch: int,
        uniform: bool,
        buffers: tuple[torch.Tensor, torch.Tensor, AttentionMetadata] | None = None,
    ) -> tuple[tuple[torch.Tensor, ...], Any]:
        """A batch of ``num_tokens`` tokens in ``batch`` sequences that writes nothing."""
        if uniform:
            lens = [1] * batch
        else:
            lens = [
                num_tokens // batch + (1 if i < num_tokens % batch else 0) for i in range(batch)
            ]
        tables = [[0] * -(-n // self.block_size) for n in lens]
        zeros = [0] * num_tokens
        return self._step_inputs(zeros, zeros, lens, lens, tables, [-1] * num_tokens, buffers)

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
        if self.background is not None and self.background.done:
            self._adopt(self.background)
        if self.eager_steps:
            self.eager_steps -= 1
            return self.model(*args)
        if mode is CUDAGraphMode.NONE:
            return self.compiled(*args)
        with graph_context(mode, key):
            if mode is CUDAGraphMode.FULL:
                graph = self.full_graph if self.full_graph is not None else self.step_graph
                if graph is not None:
                    return graph(*args)
            return self.compiled(*args)

    def execute(self, step: StepInput | Step) -> tuple[torch.Tensor | None, list[int]]:
        """Run ``step``; returns float32 logits of the sampled rows and, per sequence,
        its row in them (-1: nothing to sample).

        A pipeline stage after the first receives its input (the previous stage's
        hidden states, as many rows as the step's padded tokens) before it runs; a
        stage before the last sends its output to the next and returns no logits.
        """
        if isinstance(step, Step):
            step = StepInput.from_step(step)
        mode, key, args, prepared, rows = self.prepare(step)
        stage, pipe = self.stage, self.pipe
        # the step's real tokens travel, not the padding: stages may pad differently
        # (a host step graph one of them could not build), and padded rows are ignored
        num_tokens = sum(len(t) for t in step.tokens)
        if pipe is not None and not stage.is_first:
            pipe.recv(args[0][:num_tokens], stage.index - 1)
        # a compiler's trace in another thread would intercept the modules' calls
        with serving():
            with forward_context(prepared):
                hidden = self.forward(mode, key, args)
            order: list[int] = []
            k = 0
            for r in rows:
                order.append(k if r >= 0 else -1)
                k += r >= 0
            if pipe is not None and not stage.is_last:
                pipe.send(hidden[:num_tokens].contiguous(), stage.index + 1)
                return None, order
            wanted = [r for r in rows if r >= 0]
            if len(wanted) == hidden.shape[0] and wanted == list(range(len(wanted))):
                sampled = hidden  # every row, in order (a decode step): no gather
            else:
                index = torch.tensor(wanted, dtype=torch.int64, device=self.device)
                sampled = hidden.index_select(0, index)
            logits = self.model.logits(sampled)
        if self.background is not None:
            self.background.start()  # held until the first step is done (see warm_up)
        return logits, order

    # -- profiling, compilation and capture -------------------------------------------------
    def profile_run(self, num_tokens: int) -> None:
        """An eager forward of ``num_tokens`` dummy tokens (the largest step) that
        writes nothing to the cache."""
        n = self.largest_step(num_tokens)
        args, prepared = self._dummy_inputs(n, self._dummy_batch(n), uniform=False)
        with serving(), forward_context(prepared):
            self.model(*args)

    def warm_up(self) -> None:
        """Compile now rather than in the first step, on a small step: its sizes are
        marked unbacked, so the one graph serves every step size, and tracing costs
        no forward of the largest step. A background runner makes its compilation's
        worker thread here and returns at once; the compilation starts when the first
        step is done (or :data:`COMPILE_START_AFTER` seconds from now, whichever comes
        first), so that the first token has the cores to itself."""
        if self._compile_later:
            self._compile_later = False
            self.background = BackgroundCompilation(
                self._build_in_background, name="model", start_after=COMPILE_START_AFTER
            )
            return
        if self.compiled is self.model:
            return
        self._warm(self.compiled)

    def _warm(
        self,
        compiled: Callable[..., torch.Tensor],
        buffers: tuple[torch.Tensor, torch.Tensor, AttentionMetadata] | None = None,
    ) -> None:
        n = self.largest_step(WARM_UP_TOKENS)
        args, prepared = self._dummy_inputs(n, self._dummy_batch(n), False, buffers)
        for t in args:
            # One graph for every size, 1 included (no 0/1 specialisation).
            torch._dynamo.decorators.mark_unbacked(t, 0)
        with forward_context(prepared):
            compiled(*args)

    def _build_in_background(self) -> Callable[..., torch.Tensor]:
        """The compiled model, traced and warmed up on buffers of its own (the engine's
        steps use the runner's meanwhile), then the host step graphs, built on those
        buffers too; runs in the compilation's worker thread."""
        buffers = self._private_buffers()
        compiled = self._compile()
        self._warm(compiled, buffers)
        self._capture_step_graphs(buffers)
        return compiled

    def _capture_step_graphs(
        self, buffers: tuple[torch.Tensor, torch.Tensor, AttentionMetadata] | None = None
    ) -> list[tuple[CUDAGraphMode, BatchDescriptor]]:
        """Build the platform's host step graphs (none without them), on ``buffers``
        (default: the runner's own). A key whose build fails is logged and left out:
        its batches run on the compiled model."""
        if self.step_dispatcher is None or self.step_graph is None:
            return []
        graph = self.step_graph

        def run(key: BatchDescriptor) -> None:
            args, prepared = self._dummy_inputs(key.num_tokens, key.num_tokens, True, buffers)
            with forward_context(prepared):
                try:
                    graph(*args)
                except Exception as error:
                    # (a cancellation is a BaseException: it goes through)
                    logger.warning(
                        "no host step graph for %s: %s: %s", key, type(error).__name__, error
                    )

        built = capture_graphs(run, self.step_dispatcher.capture_keys(), pause_gc=False)
        self.captured.extend(built)
        return built

    def _adopt(self, done: BackgroundCompilation[Callable[..., torch.Tensor]]) -> None:
        """Switch to a finished background compilation's model (an eager runner stays
        eager when it failed: the compilation has logged why)."""
        self.background, self._finished = None, done
        if done.result is not None:
            self.compiled = done.result

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Wait for a background compilation (at most ``timeout`` seconds) and switch to
        its model; True when the runner runs its compiled model or has nothing to wait
        for (an eager level, or a failed compilation: see :meth:`compilation_state`)."""
        pending = self.background
        if pending is None:
            return True
        pending.start()  # whoever waits for it wants it now, not after the first step
        if not pending.wait(timeout):
            return False
        self._adopt(pending)
        return True

    def cancel_compilation(self) -> None:
        """Stop a background compilation whose result will not be used (the engine is
        closing) and join its thread; the runner stays as it is (eager, or compiled)."""
        pending = self.background
        if pending is not None:
            pending.cancel()
            self.background, self._finished = None, pending

    def compilation_state(self) -> dict[str, Any]:
        """How compilation stands: ``step_graphs`` (the decode sizes that run as the
        platform's host step graphs), ``compiled`` (steps run compiled code),
        ``compiling_in_background`` (a worker thread is still at it), and for a
        background compilation that has finished, ``background_compile_seconds`` and
        ``compile_error`` (None, or why it failed and the runner stayed eager)."""
        pending, finished = self.background, self._finished
        if pending is not None and pending.done:
            finished = pending
        graphs = self.step_graph
        return {
            "step_graphs": []
            if graphs is None
            else sorted(key.num_tokens for key in graphs.captured_keys),
            "compiled": self.compiled is not self.model
            or (finished is not None and finished.result is not None),
            "compiling_in_background": pending is not None and not pending.done,
            "background_compile_seconds": None if finished is None else finished.seconds,
            "compile_error": None
            if finished is None or finished.error is None
            else f"{type(finished.error).__name__}: {finished.error}",
        }

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
        args, prepared = self._dummy_inputs(n, batch, uniform=key.uniform_decode)
        with forward_context(prepared):
            if mode is CUDAGraphMode.FULL and self.full_graph is not None:
                self.full_graph(*args)
            else:
                self.compiled(*args)

    def capture(self) -> list[tuple[CUDAGraphMode, BatchDescriptor]]:
        """Capture every graph the dispatcher can ask for: device graphs, or the
        platform's host step graphs where the device has none (a background runner
        builds those in its compilation's thread instead)."""
        plan = self.dispatcher.capture_keys()
        if not any(plan.values()):
            if self.background is None and not self._compile_later:
                return self._capture_step_graphs()
            return []
        warmups = int(self.config.compilation.cudagraph_num_of_warmups or 0)
        self.captured = capture_graphs(self._dummy_step, plan, num_warmups=warmups)
        return self.captured


def _recording_backend() -> GraphBackend:
    """hwplug's CPU test double for device graphs."""
    from hwplug.testing import RecordingGraphBackend

    backend: GraphBackend = RecordingGraphBackend()
    return backend
