"""``LLM``: a checkpoint served on the platform hwplug resolves.

Construction walks the whole life of an engine on hwplug:

1. read the checkpoint's ``config.json`` and fill the model section of the
   engine config from it (a contradicting user value is a ``ConfigError``);
2. ``hwplug.resolve`` the config for the platform (names, profiles, or the
   detected one): block size, dtypes, compilation level, graph mode, attention
   backend and KV-cache budget come back decided and explained;
3. build the model in the resolved dtype on the platform's device, its
   attention layers on the resolved backend, and load the weights;
4. where the KV-cache budget depends on the memory in use
   (``hwplug.core.kv_cache.needs_memory_profile``: devices, not the CPU's
   dedicated KV space), run a profile step of the largest batch; measure the
   memory in use with the platform's runtime services, and size the KV cache
   with ``hwplug.core.kv_cache.num_blocks``;
5. allocate one key and one value cache per layer in the resolved cache
   dtype, compile as ``compilation.level`` says (traced once, on a small
   step: one graph serves every size), then capture the graphs the
   ``GraphDispatcher`` can ask for.

``generate`` then schedules continuously (:mod:`tiny_engine.scheduler`) and
samples greedily or with a seeded temperature.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

import hwplug
from hwplug import ConfigError
from hwplug.core.config import EngineConfig
from hwplug.core.kv_cache import (
    STR_DTYPE_TO_TORCH_DTYPE,
    cache_dtype_to_torch,
    hash_function,
    needs_memory_profile,
    num_blocks,
)
from hwplug.core.platform import Platform
from tiny_engine.attention import resolved_backend
from tiny_engine.blocks import BlockPool
from tiny_engine.checkpoint import read_checkpoint
from tiny_engine.executor import Executor, make_executor
from tiny_engine.model import CausalLM, pipeline_problem, sharding_problem
from tiny_engine.runner import ModelRunner, StepInput
from tiny_engine.scheduler import Scheduler
from tiny_engine.scheduler import Sequence as Seq
from tiny_engine.settings import (
    GREEDY_BELOW,
    check_prompts,
    check_seed,
    check_temperature,
    engine_config_for,
    sequence_seed,
)
from tiny_engine.worker import WorkerSpec

__all__ = ["LLM", "engine_config_for", "sequence_seed", "spread"]

logger = logging.getLogger("tiny_engine")
"""Start-up phases are logged at INFO (the CLI shows them as a status line on a terminal)."""


def spread(
    prompts: Sequence[Sequence[int]], limits: Sequence[int], replicas: int
) -> list[list[int]]:
    """The prompt indices each of ``replicas`` replicas serves, in prompt order: by tokens
    still to compute (prompt plus ``max_tokens``), the largest first, each to the
    replica with the fewest so far (the first of equals): deterministic, so every rank
    of a launcher's job computes the same shares."""
    load = [0] * replicas
    shares: list[list[int]] = [[] for _ in range(replicas)]
    order = sorted(range(len(prompts)), key=lambda i: (-(len(prompts[i]) + limits[i]), i))
    for i in order:
        k = min(range(replicas), key=lambda r: (load[r], r))
        load[k] += len(prompts[i]) + limits[i]
        shares[k].append(i)
    return [sorted(share) for share in shares]


class LLM:
    """A Llama/Qwen2/Qwen3 checkpoint served on hwplug.

    :param model: a local Hugging Face checkpoint directory.
    :param config: an ``EngineConfig`` or a dict of sections; its model
        section is filled from the checkpoint.
    :param platform: a platform name or profile (``"h100"``), a ``Platform``,
        or None for the current platform.
    :param device: where tensors live; by default the platform's device. A
        simulated platform runs its resolved configuration on ``"cpu"`` this way
        (a testing aid: graphs are then captured with a CPU graph backend).
    :raises hwplug.ConfigError: the configuration cannot run here.
    :raises tiny_engine.CheckpointError: the checkpoint cannot be served.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        config: EngineConfig | Mapping[str, Any] | None = None,
        platform: str | Platform | None = None,
        device: str | torch.device | None = None,
        _replica: tuple[int, int] | None = None,
    ) -> None:
        self.spec = read_checkpoint(model)
        self.resolution = hwplug.resolve(engine_config_for(self.spec, config), platform=platform)
        self.config: EngineConfig = self.resolution.config
        self.platform: Platform = self.resolution.platform
        self.device = self._device(device)
        # Device calls only where the platform really drives the device the tensors live on.
        self._live = not self.platform.simulated and self.device.type == self.platform.device_type
        self.dtype = STR_DTYPE_TO_TORCH_DTYPE[self.config.model.dtype]
        self.cache_dtype = cache_dtype_to_torch(
            self.config.cache.cache_dtype, self.config.model.dtype, self.platform
        )
        self.attention_backend = resolved_backend(self.config, self.platform, self.device)
        parallel = self.config.parallel
        self.tensor_parallel_size = parallel.tensor_parallel_size
        self.pipeline_parallel_size = parallel.pipeline_parallel_size
        self.data_parallel_size = parallel.data_parallel_size
        problem = sharding_problem(self.spec, self.tensor_parallel_size) or pipeline_problem(
            self.spec, self.pipeline_parallel_size
        )
        if problem is not None:
            raise ConfigError(f"{problem} ({self.spec.path / 'config.json'})")
        self.executor_kind = parallel.distributed_executor_backend or (
            "uni" if parallel.world_size == 1 else "mp"
        )
        self._replica = _replica
        self.replicas: list[LLM] = []
        """The data-parallel replicas this engine drives (each an engine of one replica,
        started by the same executor kind), when ``data_parallel_size`` > 1 and the
        executor starts them (not under an external launcher, where this process is one
        rank of one replica); empty otherwise."""
        self._stats: dict[str, Any] = {
            "prefix_cache_hits": 0,
            "preemptions": 0,
            "prompt_tokens": 0,
            "generated_tokens": 0,
            "steps": 0,
            "generate_seconds": 0.0,
        }
        self._lock = threading.Lock()
        """Serialises ``generate`` calls: the runner's buffers and the pool are shared."""
        self.executor: Executor | None = None
        try:
            if self.data_parallel_size > 1 and self.executor_kind != "external_launcher":
                self._build_replicas(device)
                return
            with hwplug.use_platform(self.platform), torch.inference_mode():
                self._build(device)
        except BaseException:
            self.close()
            raise

    # -- construction -------------------------------------------------------------------
    def _device(self, device: str | torch.device | None) -> torch.device:
        if device is not None:
            try:
                return torch.device(device)
            except (RuntimeError, TypeError) as exc:
                raise ConfigError(f"LLM(device={device!r}) is not a torch device: {exc}") from exc
        plat = self.platform
        if plat.simulated and plat.device_type != "cpu":
            raise ConfigError(
                f"the {plat.name} platform is simulated (profile {plat.profile!r}); there is "
                "no device to run on: pass device='cpu' to run its resolved configuration "
                "on CPU tensors, or run on the real hardware"
            )
        return plat.torch_device(0)

    def _build_replicas(self, device: str | torch.device | None) -> None:
        """Start ``data_parallel_size`` engines of one replica each (SPEC 15)."""
        replicas = self.data_parallel_size
        parallel = dataclasses.replace(self.config.parallel, data_parallel_size=1)
        one = dataclasses.replace(self.config, parallel=parallel)
        for k in range(replicas):
            logger.info("starting data-parallel replica %d of %d", k, replicas)
            try:
                replica = LLM(
                    self.spec.path,
                    config=one,
                    platform=self.platform,
                    device=device,
                    _replica=(k, replicas),
                )
            except (ConfigError, RuntimeError) as exc:
                raise type(exc)(
                    f"data-parallel replica {k} of {replicas} could not start: {exc}"
                ) from exc
            self.replicas.append(replica)
        first = self.replicas[0]
        self.memory = dict(first.memory)
        self.budget_blocks = first.budget_blocks
        self.num_blocks = first.num_blocks
        self.graphs_captured = first.graphs_captured
        self.compile_seconds = max(r.compile_seconds for r in self.replicas)

    def _build(self, device: str | torch.device | None) -> None:
        cfg, plat = self.config, self.platform
        world = cfg.parallel.world_size
        replicas = cfg.parallel.data_parallel_size
        if self._replica is not None:
            replicas = self._replica[1]
        spec = WorkerSpec(
            checkpoint=self.spec.path,
            config=cfg,
            platform=plat,
            attention_backend=self.attention_backend,
            device=None if device is None else str(self.device),
            world_size=world,
            data_parallel_size=cfg.parallel.data_parallel_size,
            ranks_on_host=world * replicas,
        )
        logger.info(
            "starting %d rank%s (%s executor)", world, "s" if world > 1 else "", self.executor_kind
        )
        self.executor = make_executor(self.executor_kind, spec)
        profiles = self._live and needs_memory_profile(cfg, plat)
        logger.info(
            "loading %s%s",
            self.spec.path.name,
            " and profiling its largest step" if profiles else "",
        )
        self.memory: dict[str, int] = self.executor.run("load")[0]
        used = max(self.memory.values())
        block_size = int(cfg.cache.block_size or 16)
        budget_blocks = num_blocks(cfg, plat, used_bytes=used)
        per_sequence = math.ceil(cfg.model.max_model_len / block_size)
        if budget_blocks < per_sequence:
            raise ConfigError(
                f"the KV cache has {budget_blocks} blocks of {block_size} tokens, but one "
                f"sequence of model.max_model_len={cfg.model.max_model_len} tokens needs "
                f"{per_sequence}; raise cache.num_gpu_blocks_override (or the KV-cache "
                "memory) or lower model.max_model_len"
            )
        # More blocks than every admissible sequence at full length could use are never touched.
        blocks = min(budget_blocks, cfg.scheduler.max_num_seqs * per_sequence)
        self.budget_blocks = budget_blocks
        self.num_blocks = blocks
        algo = cfg.cache.prefix_caching_hash_algo
        self.pool = BlockPool(
            blocks,
            block_size,
            hash_fn=hash_function(algo) if cfg.cache.enable_prefix_caching else None,
        )
        logger.info("allocating %d KV blocks of %d tokens", blocks, block_size)
        built = self.executor.run("init_cache", blocks, block_size)[0]
        if built.get("compiling_in_background"):
            logger.info("ready, running eagerly while the model compiles in the background")
        else:
            logger.info(
                "ready in %.1f s of compilation, warm-up and capture (%d graphs)",
                float(built["compile_seconds"]),
                int(built["graphs_captured"]),
            )
        self.graphs_captured = int(built["graphs_captured"])
        self.compile_seconds = float(built["compile_seconds"])
        worker = self.executor.local_worker
        self._weights_seen = worker.weights_fingerprint() if worker is not None else ()

    def _in_process(self, what: str) -> Any:
        """This process's worker's ``what`` (``model``, ``runner``).

        :raises RuntimeError: the ranks run in other processes, or the engine is closed.
        """
        worker = self.executor.local_worker if self.executor is not None else None
        value = getattr(worker, what, None)
        if value is None:
            raise RuntimeError(
                f"the {what} lives in the ranks' processes ({self.executor_kind} executor), "
                "not in this one (or the engine was closed)"
            )
        return value

    @property
    def model(self) -> CausalLM:
        """The model, when it lives in this process (executors ``uni`` and
        ``external_launcher``: this rank's part)."""
        model: CausalLM = self._in_process("model")
        return model

    @property
    def runner(self) -> ModelRunner:
        """The model runner, when it lives in this process (see :attr:`model`)."""
        runner: ModelRunner = self._in_process("runner")
        return runner

    @property
    def captured(self) -> list[Any]:
        """The graphs this process captured (its rank's)."""
        worker = self.executor.local_worker if self.executor is not None else None
        return list(worker.captured) if worker is not None else []

    @property
    def prints_results(self) -> bool:
        """Whether this process should report results: always, except on the ranks other
        than 0 of a job an external launcher started (every rank has the same results)."""
        executor = self.executor
        if executor is None:
            return True
        return getattr(executor, "rank", 0) == 0 and getattr(executor, "replica", 0) == 0

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Wait (at most ``timeout`` seconds) until the model runs compiled.

        Where hwplug lets the model compile in the background
        (:func:`hwplug.compilation.compiles_in_background`: one rank, no device
        graphs), the engine serves eagerly from its first step and switches to the
        compiled model once a worker thread has built it. Returns True once nothing
        is left compiling (``stats["compiled"]`` says whether it succeeded).

        :raises RuntimeError: the engine is closed.
        """
        if self.replicas:
            return all([r.wait_compiled(timeout) for r in self.replicas])
        if self.executor is None:
            raise RuntimeError("the engine is closed")
        return all(self.executor.run("wait_compiled", timeout))

    def close(self) -> None:
        """Stop the ranks (other processes, Ray actors) of every replica and leave the
        process group. Idempotent; the engine cannot generate afterwards."""
        executor, self.executor = self.executor, None
        replicas, self.replicas = list(getattr(self, "replicas", [])), []
        for replica in reversed(replicas):  # last started, first stopped
            with contextlib.suppress(Exception):
                replica.close()
        if executor is not None:
            executor.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # -- weights and the prefix cache -------------------------------------------------------
    def _weights_fingerprint(self) -> tuple[tuple[int, int], ...]:
        """Where each parameter lives and its version counter: what ``load_state_dict``,
        ``param.copy_`` and other in-place updates of the parameters change (only for a
        model in this process)."""
        worker = self.executor.local_worker if self.executor is not None else None
        return worker.weights_fingerprint() if worker is not None else ()

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix block (their keys and values were computed with the
        weights of the time); returns how many were dropped.

        ``generate`` does this by itself when a parameter was replaced or updated in
        place (``load_state_dict``, ``param.copy_``); writes through ``param.data``
        bump no version counter, so call it after those.
        """
        if self.replicas:
            return sum(r.reset_prefix_cache() for r in self.replicas)
        with self._lock:
            return self.pool.reset_prefix_cache()

    # -- generation -------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_tokens: int | Sequence[int],
        temperature: float = 0.0,
        seed: int | None = None,
        ignore_eos: bool = False,
    ) -> list[list[int]]:
        """Generate up to ``max_tokens`` tokens for each prompt (lists of token ids).

        ``max_tokens`` is one limit for all, or one per prompt (a serving mix).
        Token ids, limits and ``seed`` may be numpy integers; a prompt may be a
        1-D integer array and ``prompts`` a 2-D one.

        Greedy at ``temperature`` below 1e-5; otherwise sampled from the softmax
        of the logits divided by ``temperature``, each prompt with its own
        generator seeded from ``seed`` (any int; None: fresh entropy) and its
        position, so a seed gives the same tokens however the batch is
        scheduled. A sequence stops after an end-of-sequence token (included in
        its output) unless ``ignore_eos``, or at ``model.max_model_len`` tokens.

        Calls from several threads run one after another. A call that raises
        (a kernel error, ``KeyboardInterrupt``) gives every block its sequences
        held back to the pool and leaves the counters as they were.

        :raises ValueError: an empty prompt, a token that is no integer or is outside
            the vocabulary, a prompt too long for ``model.max_model_len``, a bad
            ``max_tokens``, ``temperature`` or ``seed``.
        :raises RuntimeError: the KV cache or the step budget is too small for
            a sequence to make progress.
        """
        prompts, limits = check_prompts(
            prompts,
            max_tokens,
            vocab_size=self.spec.vocab_size,
            max_model_len=self.config.model.max_model_len,
        )
        temperature = check_temperature(temperature)
        seed = check_seed(seed)
        if temperature < GREEDY_BELOW:
            temperature = 0.0
        if self.replicas:
            return self._generate_on_replicas(prompts, limits, temperature, seed, ignore_eos)
        if self.data_parallel_size > 1:  # one replica of a launcher's job
            return self._generate_as_one_replica(prompts, limits, temperature, seed, ignore_eos)
        with self._lock:
            return self._generate_here(prompts, limits, temperature, seed, ignore_eos)

    def _generate_here(
        self,
        prompts: Sequence[Sequence[int]],
        limits: list[int],
        temperature: float,
        seed: int | None,
        ignore_eos: bool,
        indices: Sequence[int] | None = None,
    ) -> list[list[int]]:
        """Generate on this engine's own ranks (the caller holds the lock)."""
        weights = self._weights_fingerprint()
        if weights != self._weights_seen:
            self.pool.reset_prefix_cache()
            self._weights_seen = weights
        return self._generate(prompts, limits, temperature, seed, ignore_eos, indices)

    def _generate_share(
        self,
        prompts: Sequence[Sequence[int]],
        limits: list[int],
        temperature: float,
        base: int,
        ignore_eos: bool,
        share: list[int],
    ) -> list[list[int]]:
        """Generate the prompts whose indices (in the whole call) are ``share`` on this
        engine's own ranks, each seeded by its index in the whole call."""
        with self._lock:
            return self._generate_here(
                [prompts[i] for i in share],
                [limits[i] for i in share],
                temperature,
                base,
                ignore_eos,
                share,
            )

    def _generate_on_replicas(
        self,
        prompts: Sequence[Sequence[int]],
        limits: list[int],
        temperature: float,
        seed: int | None,
        ignore_eos: bool,
    ) -> list[list[int]]:
        """Spread the prompts over the replicas, run them side by side, and return the
        outputs in prompt order; a replica that fails closes them all and is named."""
        base = seed if seed is not None else secrets.randbits(63)
        shares = spread(prompts, limits, len(self.replicas))
        outputs: list[list[int]] = [[] for _ in prompts]
        failures: dict[int, BaseException] = {}

        def run(k: int, share: list[int]) -> None:
            try:
                got = self.replicas[k]._generate_share(
                    prompts, limits, temperature, base, ignore_eos, share
                )
            except BaseException as exc:  # named below, once every replica has ended
                failures[k] = exc
                return
            for i, tokens in zip(share, got):
                outputs[i] = tokens

        with self._lock:
            if not self.replicas:
                raise RuntimeError("this LLM was closed; build a new one")
            start = time.perf_counter()
            threads = [
                threading.Thread(target=run, args=(k, share), name=f"tiny_engine-replica{k}")
                for k, share in enumerate(shares)
                if share
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            self._stats["generate_seconds"] += time.perf_counter() - start
            if failures:
                dead = [k for k, e in failures.items() if "died" in str(e)]
                k = dead[0] if dead else min(failures)
                error = failures[k]
                if not isinstance(error, Exception):
                    raise error  # KeyboardInterrupt and alike go through as they are
                if isinstance(error, RuntimeError):
                    self.close()
                    raise RuntimeError(
                        f"data-parallel replica {k} of {self.data_parallel_size}: {error}; "
                        "the other replicas were shut down"
                    ) from error
                raise error
        return outputs

    def _generate_as_one_replica(
        self,
        prompts: Sequence[Sequence[int]],
        limits: list[int],
        temperature: float,
        seed: int | None,
        ignore_eos: bool,
    ) -> list[list[int]]:
        """Under a launcher that started every replica's ranks: generate this replica's
        share of the prompts, then gather every replica's outputs on every rank."""
        executor = self.executor
        if executor is None:
            raise RuntimeError("this LLM was closed; build a new one")
        worker = self._local_worker()
        base = seed if seed is not None else secrets.randbits(63)
        base = worker.broadcast_int(base)  # every replica seeds from the first one's
        share = spread(prompts, limits, self.data_parallel_size)[getattr(executor, "replica", 0)]
        got = self._generate_share(prompts, limits, temperature, base, ignore_eos, share)
        outputs: list[list[int]] = worker.gather_outputs(dict(zip(share, got)), len(prompts))
        return outputs

    def _generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_tokens: list[int],
        temperature: float,
        seed: int | None,
        ignore_eos: bool,
        indices: Sequence[int] | None = None,
    ) -> list[list[int]]:
        scheduler = Scheduler(
            self.pool,
            max_num_seqs=self.config.scheduler.max_num_seqs,
            max_num_batched_tokens=self.config.scheduler.max_num_batched_tokens,
            chunked_prefill=bool(self.config.scheduler.enable_chunked_prefill),
        )
        base = seed if seed is not None else secrets.randbits(63)
        launched = self.executor_kind == "external_launcher"
        if launched and temperature > 0 and seed is None:
            # every rank samples for itself: they must all draw from rank 0's seed
            base = self._local_worker().broadcast_int(sequence_seed(base, -1))
        # under a launcher, stages before the last have no logits: they take the tokens
        # the last stage sampled
        shared = launched and self.pipeline_parallel_size > 1
        seqs = []
        for i, prompt in enumerate(prompts):
            generator = None
            if temperature > 0:
                # seeded by the prompt's place in the whole call (a replica's share too)
                index = indices[i] if indices is not None else i
                generator = torch.Generator().manual_seed(sequence_seed(base, index))
            seq = Seq(i, list(prompt), len(prompt), max_tokens[i], generator=generator)
            seqs.append(seq)
            scheduler.add(seq)
        eos = frozenset() if ignore_eos else frozenset(self.spec.eos_token_ids)
        max_len = self.config.model.max_model_len
        hits_before = self.pool.hits
        steps = 0
        start = time.perf_counter()
        try:
            with hwplug.use_platform(self.platform), torch.inference_mode():
                while scheduler.has_work:
                    step = scheduler.schedule()
                    if not step.seqs:
                        continue  # everything that ran was preempted: schedule again
                    logits, rows = self._execute(step)
                    scheduler.finish_step(step)
                    sampled = [s for s, r in zip(step.seqs, rows) if r >= 0]
                    drawn = None if logits is None else self._sample(logits, sampled, temperature)
                    if shared:
                        drawn = self._local_worker().share_sampled(drawn, len(sampled))
                    assert drawn is not None
                    tokens = iter(drawn)
                    for seq, row in zip(step.seqs, rows):
                        if row < 0:
                            continue
                        token = next(tokens)
                        seq.tokens.append(token)
                        if (
                            token in eos
                            or seq.num_generated >= seq.max_tokens
                            or len(seq.tokens) >= max_len
                        ):
                            scheduler.finish(seq)
                    steps += 1
                if self._live:
                    self.platform.synchronize()
        except BaseException:
            # Whatever stopped the call, its sequences hold no block afterwards.
            scheduler.abort()
            self.pool.hits = hits_before
            raise
        stats = self._stats
        stats["steps"] += steps
        stats["generate_seconds"] += time.perf_counter() - start
        stats["prefix_cache_hits"] += self.pool.hits - hits_before
        stats["preemptions"] += scheduler.preemptions
        stats["prompt_tokens"] += sum(len(p) for p in prompts)
        stats["generated_tokens"] += sum(s.num_generated for s in seqs)
        return [s.output for s in seqs]

    def _local_worker(self) -> Any:
        worker = self.executor.local_worker if self.executor is not None else None
        if worker is None:
            raise RuntimeError("this LLM was closed; build a new one")
        return worker

    def _execute(self, step: Any) -> tuple[torch.Tensor | None, list[int]]:
        """Run ``step`` on every rank; the last stage's first rank's logits (or this
        rank's: None on a stage before the last) and rows."""
        if self.executor is None:
            raise RuntimeError("this LLM was closed; build a new one")
        if self.executor.local_worker is not None:
            return self.executor.local_worker.execute(StepInput.from_step(step))
        results = self.executor.run("execute_on_driver", StepInput.from_step(step))
        logits, rows = results[self.executor.driver_rank]
        return logits, rows

    @staticmethod
    def _sample(logits: torch.Tensor, seqs: list[Seq], temperature: float) -> list[int]:
        if temperature == 0:
            # max's indices: the first largest (NaN counting as largest), as argmax's, in a
            # third to a half of argmax's time on CPUs (30 against 90 us for 16 x 8192 logits)
            return [int(t) for t in logits.max(dim=-1).indices.tolist()]
        # float64: logits divided by a temperature near 1e-5 stay finite
        probs = torch.softmax(logits.double() / temperature, dim=-1).cpu()
        out = []
        for row, seq in zip(probs, seqs):
            gen = seq.generator
            assert isinstance(gen, torch.Generator)
            out.append(int(torch.multinomial(row, 1, generator=gen).item()))
        return out

    # -- reporting ------------------------------------------------------------------------------
    def _compilation_state(self) -> dict[str, Any]:
        if self.replicas:
            return self.replicas[0]._compilation_state()
        if self.executor is None:
            return {}
        state: dict[str, Any] = self.executor.run("compilation_state")[0]
        return state

    @property
    def stats(self) -> dict[str, Any]:
        """What runs and how it went: platform, backend, graphs, cache, cumulative counters."""
        cfg, plat = self.config, self.platform
        counters = dict(self._stats)
        replicas = [r.stats for r in self.replicas]
        if replicas:
            # the replicas ran side by side: the call's time is the longest, not the sum
            for name in counters:
                if name != "generate_seconds":
                    counters[name] = sum(r[name] for r in replicas)
        seconds = counters["generate_seconds"]
        out: dict[str, Any] = {"platform": plat.name}
        if plat.simulated:
            out["profile"] = plat.profile
        out.update(
            {
                "device": str(self.device),
                "model": self.spec.architecture,
                "dtype": cfg.model.dtype,
                "attention_backend": self.attention_backend,
                "compilation_level": int(cfg.compilation.level or 0),
                "cudagraph_mode": str(cfg.compilation.cudagraph_mode),
                "graphs_captured": self.graphs_captured,
                **self._compilation_state(),
                "block_size": cfg.cache.block_size,
                "cache_dtype": cfg.cache.cache_dtype,
                "num_blocks": self.num_blocks,
                "kv_cache_budget_blocks": self.budget_blocks,
                "prefix_caching": bool(cfg.cache.enable_prefix_caching),
                "chunked_prefill": bool(cfg.scheduler.enable_chunked_prefill),
                "memory_in_use_bytes": max(self.memory.values()),
                "tensor_parallel_size": self.tensor_parallel_size,
                "pipeline_parallel_size": self.pipeline_parallel_size,
                "data_parallel_size": self.data_parallel_size,
                "executor": self.executor_kind,
                **counters,
                "prompt_tokens_per_s": counters["prompt_tokens"] / seconds if seconds else 0.0,
                "generated_tokens_per_s": (
                    counters["generated_tokens"] / seconds if seconds else 0.0
                ),
            }
        )
        if replicas:
            out["replicas"] = replicas
        elif self.executor is not None:
            # what each stage holds (its first tensor rank's; under a launcher, this rank's)
            ranks = self.executor.run("stage_info")
            out["stages"] = [r for r in ranks if r["tensor_rank"] == 0]
        return out
