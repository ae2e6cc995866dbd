"""One rank of an engine: its part of the model, its KV cache, its runner.

The driver (:class:`tiny_engine.LLM`) schedules and samples; a :class:`Worker`
holds what lives on a device. With one device the worker runs in the
driver's process (executor ``uni``); with tensor parallelism there is one per
rank, in spawned processes (``mp``), Ray actors (``ray``) or the processes a
launcher such as ``torchrun`` started (``external_launcher``). Every rank
runs the same calls in the same order, so their collectives meet; each
method's arguments and results are picklable.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch

import hwplug
from hwplug.compilation import compiles_in_background
from hwplug.core import distributed
from hwplug.core.config import EngineConfig
from hwplug.core.dtypes import is_fp8_cache
from hwplug.core.kv_cache import (
    STR_DTYPE_TO_TORCH_DTYPE,
    cache_dtype_to_torch,
    needs_memory_profile,
)
from hwplug.core.platform import Platform
from tiny_engine.checkpoint import iter_weights, read_checkpoint
from tiny_engine.model import CausalLM, Sharding, Stage, load_weights
from tiny_engine.runner import ModelRunner, StepInput

__all__ = ["Worker", "WorkerSpec", "driver_rank"]

logger = logging.getLogger("tiny_engine")
"""The rank's start-up phases, at INFO (see :mod:`tiny_engine.engine`)."""

TP_GROUP = "tp"
"""The name the tensor-parallel communicator is registered under (hwplug's collective ops)."""


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What a rank needs to build itself (picklable)."""

    checkpoint: Path
    config: EngineConfig
    platform: Platform
    attention_backend: str
    device: str | None = None
    """A torch device for the tensors; None: the platform's device of the local rank."""
    rank: int = 0
    """This rank in the process group it joins (in the whole launched world when
    ``data_parallel_size`` replicas share it)."""
    world_size: int = 1
    """The ranks of one replica: tensor x pipeline parallel size."""
    local_rank: int = 0
    init_method: str = "env://"
    """Where the ranks meet (``tcp://host:port``, or ``env://`` under a launcher)."""
    data_parallel_size: int = 1
    """Replicas in this rank's process group: more than one only when one launcher
    (torchrun) started every replica's ranks; executors that start each replica
    themselves give every replica a world of its own."""
    ranks_on_host: int = 0
    """Ranks of every replica that share this host's cores (0: ``world_size``)."""


def _share_the_cpus(ranks: int) -> None:
    """Ranks on one host's CPUs each take their share of its cores (unless
    ``OMP_NUM_THREADS`` says otherwise): more threads than cores make every rank
    spin against the others, and a collective waits for the slowest."""
    import os

    if os.environ.get("OMP_NUM_THREADS"):
        return
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    torch.set_num_threads(max(1, cores // ranks))


def driver_rank(spec: WorkerSpec) -> int:
    """The replica rank whose logits the driver samples: the last pipeline stage's
    first rank."""
    parallel = spec.config.parallel
    return (parallel.pipeline_parallel_size - 1) * parallel.tensor_parallel_size


class Worker:
    """One rank: builds its part of the model, profiles it, holds its cache, runs steps."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.platform = spec.platform
        self.config = spec.config
        self.model_spec = read_checkpoint(spec.checkpoint)
        self.rank, self.world_size = spec.rank, spec.world_size
        plat = self.platform
        if spec.device is not None:
            self.device = torch.device(spec.device)
        else:
            self.device = plat.torch_device(0 if plat.device_type == "cpu" else spec.local_rank)
        self.live = not plat.simulated and self.device.type == plat.device_type
        parallel = self.config.parallel
        self.tp_size = parallel.tensor_parallel_size
        self.pp_size = parallel.pipeline_parallel_size
        sharing = spec.ranks_on_host or spec.world_size
        self._threads_before: int | None = None
        """torch's thread count before this rank took its share (restored at shutdown:
        replicas of the ``uni`` executor run in the caller's process)."""
        if sharing > 1 and self.device.type == "cpu":
            self._threads_before = torch.get_num_threads()
            _share_the_cpus(sharing)
        launched = spec.world_size * spec.data_parallel_size
        self.mesh: distributed.ModelParallelGroups | None = None
        """This rank's tensor- and pipeline-parallel groups (None with one rank)."""
        if launched > 1:
            group = plat.init_distributed(
                spec.rank,
                launched,
                local_rank=spec.local_rank,
                init_method=spec.init_method,
            )
            self.mesh = plat.init_model_parallel(
                self.tp_size, self.pp_size, data_parallel_size=spec.data_parallel_size
            )
            self.world_communicator = plat.device_communicator(group)
            """Every rank the launcher started (every replica's, under torchrun)."""
            self.communicator = self.mesh.replica_communicator or self.world_communicator
            """This replica's ranks."""
            distributed.register_communicator(TP_GROUP, self.mesh.tp_communicator)
            self.rank = self.mesh.rank
        elif self.live:
            plat.set_device(spec.local_rank)
        self.tp_rank = self.mesh.tp_rank if self.mesh is not None else 0
        self.pp_rank = self.mesh.pp_rank if self.mesh is not None else 0
        self.driver_rank = driver_rank(spec)
        """The replica rank whose logits the driver samples: the last stage's first."""
        self.dtype = STR_DTYPE_TO_TORCH_DTYPE[self.config.model.dtype]
        self.cache_dtype = cache_dtype_to_torch(
            self.config.cache.cache_dtype, self.config.model.dtype, plat
        )
        self.model: CausalLM | None = None
        self.runner: ModelRunner | None = None
        self.memory: dict[str, int] = {}
        self.captured: list[Any] = []
        self.compile_seconds = 0.0

    # -- building -------------------------------------------------------------------------
    def load(self) -> dict[str, int]:
        """Build this rank's part of the model, load its weights and, where the KV-cache
        budget depends on the memory in use (``needs_memory_profile``), profile the
        largest step on a one-block cache; returns the memory in use (the most over the
        ranks)."""
        cfg, spec, plat = self.config, self.model_spec, self.platform
        with hwplug.use_platform(plat), torch.inference_mode():
            if self.live:
                plat.seed_everything(0)
            shard = Sharding(spec, self.tp_rank, self.tp_size, TP_GROUP)
            stage = Stage(spec, self.pp_rank, self.pp_size)
            default_dtype = torch.get_default_dtype()
            torch.set_default_dtype(self.dtype)
            try:
                # Normal tensors, not inference tensors: a user's later in-place update of a
                # weight works outside inference_mode too, and bumps its version counter.
                with torch.inference_mode(False), torch.no_grad(), torch.device(self.device):
                    self.model = CausalLM(
                        spec,
                        self.spec.attention_backend,
                        cfg.model.max_model_len,
                        shard,
                        linear_backend=plat.linear_backend,
                        stage=stage,
                    )
                    load_weights(self.model, iter_weights(spec.path))
            finally:
                torch.set_default_dtype(default_dtype)
            self.model.eval().requires_grad_(False)
            self.memory["after_load"] = self._memory_in_use()
            if self.live and needs_memory_profile(cfg, plat):
                block_size = int(cfg.cache.block_size or 16)
                self.allocate_cache(1, block_size)
                runner = ModelRunner(
                    self.model, cfg, plat, self.device, compile_model=False, pipe=self._pipe()
                )
                runner.profile_run(cfg.scheduler.max_num_batched_tokens)
                self.memory["after_profile"] = self._memory_in_use()
        return self._most_over_ranks(self.memory)

    def allocate_cache(self, blocks: int, block_size: int) -> None:
        """One key and one value cache per layer, ``[blocks, block_size, kv heads of this
        rank, head size]`` in the resolved cache dtype.

        Left uninitialised (``torch.empty``): attention reads only the positions a
        sequence has written (every backend masks the rest, whatever they hold), and
        on a CPU the pages of blocks never used are never touched, so they take no
        resident memory."""
        assert self.model is not None
        heads = self.model.shard.num_kv_heads
        shape = (blocks, block_size, heads, self.model_spec.head_dim)
        for layer in self.model.attention_layers():
            layer.key_cache = torch.empty(shape, dtype=self.cache_dtype, device=self.device)
            layer.value_cache = torch.empty(shape, dtype=self.cache_dtype, device=self.device)

    def init_cache(self, blocks: int, block_size: int) -> dict[str, Any]:
        """Allocate the KV cache, compile and capture; returns what was captured."""
        assert self.model is not None
        cfg, plat = self.config, self.platform
        with hwplug.use_platform(plat), torch.inference_mode():
            self.allocate_cache(blocks, block_size)
            start = time.perf_counter()
            scales = is_fp8_cache(cfg.cache.cache_dtype) and cfg.cache.calculate_kv_scales
            # The fp8 scale step flips a flag the model's code reads: compile before it.
            background = not scales and compiles_in_background(cfg, world_size=self.world_size)
            self.runner = ModelRunner(
                self.model, cfg, plat, self.device, background=background, pipe=self._pipe()
            )
            level = int(cfg.compilation.level or 0)
            if background:
                logger.info("compiling the model (level %d) in the background", level)
            elif level:
                logger.info("compiling the model (level %d) and warming it up", level)
            self.runner.warm_up()
            self.captured = self.runner.capture()
            self.compile_seconds = time.perf_counter() - start
            if scales:
                # Scales come from the first real step, run eagerly; graphs read the buffers.
                for layer in self.model.attention_layers():
                    layer.calculate_scales = True
                self.runner.eager_steps = 1
            if self.live:
                plat.synchronize()
        return {
            "graphs_captured": len(self.captured),
            "compile_seconds": self.compile_seconds,
            "compiling_in_background": background,
        }

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Wait for a background compilation (see :meth:`ModelRunner.wait_compiled`)."""
        assert self.runner is not None
        return self.runner.wait_compiled(timeout)

    def compilation_state(self) -> dict[str, Any]:
        """See :meth:`ModelRunner.compilation_state`."""
        assert self.runner is not None
        return self.runner.compilation_state()

    # -- running --------------------------------------------------------------------------
    def execute(self, step: StepInput) -> tuple[torch.Tensor | None, list[int]]:
        """Run one step; returns the float32 logits of the rows to sample (every rank of
        the last pipeline stage has the whole vocabulary; the other stages None) and,
        per sequence, its row in them (-1: none)."""
        assert self.runner is not None
        with hwplug.use_platform(self.platform), torch.inference_mode():
            return self.runner.execute(step)

    def execute_on_driver(self, step: StepInput) -> tuple[torch.Tensor | None, list[int]]:
        """:meth:`execute` for a driver in another process: the logits of
        :attr:`driver_rank` (the last stage's first rank), on the CPU."""
        logits, rows = self.execute(step)
        mine = self.rank == self.driver_rank and logits is not None
        return (logits.cpu() if mine else None), rows  # type: ignore[union-attr]

    def share_sampled(self, tokens: list[int] | None, count: int) -> list[int]:
        """The ``count`` tokens :attr:`driver_rank` sampled, on every rank of the replica
        (under a launcher the stages before the last have no logits to sample)."""
        if self.world_size == 1 or self.pp_size == 1:
            assert tokens is not None
            return tokens
        t = torch.zeros(count, dtype=torch.int64, device=self.device)
        if self.rank == self.driver_rank:
            assert tokens is not None
            assert len(tokens) == count
            t.copy_(torch.tensor(tokens, dtype=torch.int64))
        return [int(v) for v in self.communicator.broadcast(t, src=self.driver_rank).tolist()]

    def gather_outputs(self, mine: dict[int, list[int]], count: int) -> list[list[int]]:
        """Every replica's outputs, on every rank the launcher started: ``mine`` maps this
        replica's prompt indices (of ``count`` prompts) to their tokens. Each replica's
        first rank contributes; the others add zeros."""
        if self.mesh is None or self.mesh.dp_size == 1:
            return [mine[i] for i in range(count)]
        contributes = self.rank == 0
        lengths = torch.zeros(count, dtype=torch.int64, device=self.device)
        if contributes:
            for i, tokens in mine.items():
                lengths[i] = len(tokens)
        lengths = self.world_communicator.all_reduce(lengths)
        longest = max(1, int(lengths.max()))
        table = torch.zeros(count, longest, dtype=torch.int64, device=self.device)
        if contributes:
            for i, tokens in mine.items():
                table[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
        table = self.world_communicator.all_reduce(table).cpu()
        return [table[i, : int(n)].tolist() for i, n in enumerate(lengths.tolist())]

    def weights_fingerprint(self) -> tuple[tuple[int, int], ...]:
        """Where each parameter lives and its version counter (what in-place updates and
        ``load_state_dict`` change)."""
        assert self.model is not None
        return tuple((p.data_ptr(), p._version) for p in self.model.parameters())

    def broadcast_int(self, value: int) -> int:
        """Rank 0's ``value`` on every rank (a seed every rank must share)."""
        if self.mesh is None:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        return int(self.world_communicator.broadcast(t, src=0).item())

    def stage_info(self) -> dict[str, Any]:
        """This rank's place and what it holds: its pipeline stage and tensor rank, the
        decoder layers ``[start, end)``, and the layers and bytes of its KV cache."""
        assert self.model is not None
        stage = self.model.stage
        layers = self.model.attention_layers()
        cache = sum(
            t.numel() * t.element_size() for a in layers for t in (a.key_cache, a.value_cache)
        )
        return {
            "stage": stage.index,
            "tensor_rank": self.tp_rank,
            "layers": [stage.start, stage.end],
            "kv_cache_layers": len(layers),
            "kv_cache_bytes": cache,
        }

    def ping(self) -> int:
        """This rank (a liveness check)."""
        return self.rank

    def process_id(self) -> int:
        """The id of the process this rank runs in."""
        import os

        return os.getpid()

    def shutdown(self) -> None:
        """Cancel a background compilation (its result will not be used; its thread is
        joined, so none is left running at the interpreter's exit), then leave the
        process group."""
        if self.runner is not None:
            self.runner.cancel_compilation()
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None
        if self.mesh is not None:
            distributed.register_communicator(TP_GROUP, None)
            self.platform.destroy_distributed()

    # -- helpers ----------------------------------------------------------------------------
    def _pipe(self) -> distributed.DeviceCommunicator | None:
        """The pipeline group's communicator, with more than one stage."""
        return self.mesh.pp_communicator if self.mesh is not None and self.pp_size > 1 else None

    def _memory_in_use(self) -> int:
        """The most bytes this process has held on the device (0 where it is not real)."""
        if not self.live:
            return 0
        self.platform.synchronize()
        return int(self.platform.peak_memory_usage(0))

    def _most_over_ranks(self, memory: dict[str, int]) -> dict[str, int]:
        if self.world_size == 1:
            return dict(memory)
        names = sorted(memory)
        t = torch.tensor([memory[n] for n in names], dtype=torch.float64, device=self.device)
        gathered = self.communicator.all_gather(t.reshape(1, -1), dim=0)
        most = gathered.max(dim=0).values.tolist()
        return {n: math.ceil(v) for n, v in zip(names, most)}
