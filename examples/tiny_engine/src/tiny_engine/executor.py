"""How an engine's ranks are started and called: ``uni``, ``mp``, ``ray``, ``external_launcher``.

``parallel.distributed_executor_backend`` (resolved by the platform) names
the executor (SPEC 14). The driver calls every rank's :class:`Worker` method
through :meth:`Executor.run` with picklable arguments and gets each rank's
result back in rank order. A rank that raises or dies makes the call raise
``RuntimeError`` naming the rank and its error, and the executor shuts the
other ranks down: no process is left behind.

- ``uni``: one worker in this process (world size 1).
- ``mp``: one spawned process per rank on this host (``torch.multiprocessing``,
  the ``spawn`` start method); the ranks meet over TCP on a free local port.
- ``ray``: one Ray actor per rank in a placement group of bundles
  ``{platform.ray_device_key: 1}`` (``{"CPU": 1}`` where the key is empty);
  ``ray.init()`` joins the cluster of ``RAY_ADDRESS`` when it is set, else
  starts a local one. The ranks meet at rank 0's node.
- ``external_launcher``: this process is one rank of a job a launcher started
  (``torchrun``): rank and world from ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``MASTER_ADDR`` and ``MASTER_PORT``. Every rank runs the same program, with
  the same scheduling and sampling, and returns the same outputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import threading
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any

from hwplug import ConfigError
from hwplug.core.runtime import launcher_environment
from tiny_engine.worker import Worker, WorkerSpec, driver_rank

__all__ = ["EXECUTORS", "Executor", "make_executor", "rank_name"]

EXECUTORS = ("uni", "mp", "ray", "external_launcher")

logger = logging.getLogger("tiny_engine")

_SHUTDOWN_SECONDS = 10.0
"""How long a rank may take to leave before it is terminated, then killed."""


def rank_name(rank: int, spec: WorkerSpec) -> str:
    """How an error names rank ``rank`` of ``spec``'s replica: its tensor-parallel rank,
    and its pipeline stage when there are several."""
    parallel = spec.config.parallel
    tp, pp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
    if pp == 1:
        return f"tensor-parallel rank {rank} of {spec.world_size}"
    return (
        f"rank {rank} of {spec.world_size} (pipeline stage {rank // tp} of {pp}, "
        f"tensor-parallel rank {rank % tp} of {tp})"
    )


class Executor:
    """Calls the ranks' workers; ``local_worker`` is the one in this process, if any."""

    kind = ""
    world_size = 1
    local_worker: Worker | None = None
    driver_rank = 0
    """The rank whose results the driver reads (the last pipeline stage's first)."""

    def run(self, method: str, *args: Any) -> list[Any]:
        """``method(*args)`` on every rank's worker; the results in rank order (only this
        rank's under an external launcher).

        :raises RuntimeError: a rank raised or died (naming the rank); the ranks were
            shut down.
        """
        raise NotImplementedError

    def shutdown(self) -> None:
        """Stop every rank (idempotent)."""

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.shutdown()


class UniExecutor(Executor):
    """One worker, in this process."""

    kind = "uni"

    def __init__(self, spec: WorkerSpec) -> None:
        self.local_worker = Worker(spec)

    def run(self, method: str, *args: Any) -> list[Any]:
        assert self.local_worker is not None
        return [getattr(self.local_worker, method)(*args)]

    def shutdown(self) -> None:
        if self.local_worker is not None:
            self.local_worker.shutdown()


class ExternalLauncherExecutor(UniExecutor):
    """This process is one rank of a job started by ``torchrun`` (or alike)."""

    kind = "external_launcher"

    def __init__(self, spec: WorkerSpec) -> None:
        env = _launcher_environment(spec.world_size, spec.data_parallel_size)
        self.world_size = spec.world_size
        self.replica = env["rank"] // spec.world_size
        """The data-parallel replica this process serves (its ranks are consecutive)."""
        self.rank = env["rank"] % spec.world_size
        """This process's rank within its replica."""
        spec = dataclasses.replace(
            spec,
            rank=env["rank"],
            local_rank=env["local_rank"],
            init_method="env://",
            ranks_on_host=spec.ranks_on_host or env["world"],
        )
        super().__init__(spec)


def _launcher_environment(world_size: int, replicas: int = 1) -> dict[str, int]:
    """``rank``, ``world`` and ``local_rank`` as the launcher set them, once every variable
    a rank reads is set and in range (hwplug's ``launcher_environment``) and the launcher
    started as many ranks as the engine has.

    :raises ConfigError: a variable unset, not an integer or out of its range (named
        with its value and what is allowed), or ``WORLD_SIZE`` other than
        ``parallel.world_size`` (times ``data_parallel_size``).
    """
    try:
        env = launcher_environment(
            where="for parallel.distributed_executor_backend='external_launcher'"
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None
    world = env.world_size
    if world != world_size * replicas:
        sizes = "tensor_parallel_size x pipeline_parallel_size"
        wanted = f"parallel.world_size is {world_size} ({sizes})"
        if replicas > 1:
            wanted = (
                f"the engine has {world_size * replicas} ranks (parallel.world_size "
                f"{world_size} = {sizes}, times data_parallel_size {replicas})"
            )
        raise ConfigError(
            f"the launcher started WORLD_SIZE={world} ranks, but {wanted}; start as many "
            "ranks as the engine has"
        )
    return {"rank": env.rank, "world": world, "local_rank": env.local_rank}


# -- mp ------------------------------------------------------------------------------------


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _watch_parent(parent: int) -> None:
    """End this process when the driver is gone (so no rank outlives it)."""
    import time

    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(1)


def _mp_main(conn: Connection, spec: WorkerSpec, env: dict[str, str], parent: int) -> None:
    """A spawned rank: build the worker, then serve the driver's calls until told to stop."""
    os.environ.update(env)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    worker: Worker | None = None
    while True:
        try:
            method, args = conn.recv()
        except (EOFError, OSError):  # the driver is gone
            break
        if method == "__exit__":
            break
        try:
            if method == "__init__":
                worker = Worker(spec)
                result: Any = spec.rank
            else:
                assert worker is not None
                result = getattr(worker, method)(*args)
            conn.send(("ok", result))
        except BaseException as exc:  # reported to the driver, which names this rank
            text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            with contextlib.suppress(Exception):
                conn.send(("error", text))
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                break
    if worker is not None:
        with contextlib.suppress(Exception):
            worker.shutdown()


class MultiprocExecutor(Executor):
    """One spawned process per rank on this host."""

    kind = "mp"

    def __init__(self, spec: WorkerSpec) -> None:
        import torch.multiprocessing as mp

        self.world_size = spec.world_size
        self.spec = spec
        self.driver_rank = driver_rank(spec)
        ctx = mp.get_context("spawn")
        init = f"tcp://127.0.0.1:{_free_port()}"
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        self._closed = False
        for rank in range(spec.world_size):
            parent_end, child_end = ctx.Pipe()
            env, local_rank = _rank_environment(spec, rank)
            rank_spec = dataclasses.replace(
                spec, rank=rank, local_rank=local_rank, init_method=init
            )
            proc = ctx.Process(
                target=_mp_main,
                args=(child_end, rank_spec, env, os.getpid()),
                name=f"tiny_engine-rank{rank}",
                daemon=True,
            )
            with _main_module_not_rerun():
                proc.start()
            child_end.close()
            self.conns.append(parent_end)
            self.procs.append(proc)
        self.run("__init__")

    @property
    def pids(self) -> list[int]:
        """The ranks' process ids."""
        return [int(p.pid) for p in self.procs]

    def run(self, method: str, *args: Any) -> list[Any]:
        if self._closed:
            raise RuntimeError("the engine's ranks were shut down; build a new LLM")
        for rank, conn in enumerate(self.conns):
            try:
                conn.send((method, args))
            except (BrokenPipeError, OSError):
                self._fail(rank, self._death(rank))
        results: dict[int, Any] = {}
        pending = dict(enumerate(self.conns))
        sentinels = {self.procs[r].sentinel: r for r in pending}
        while pending:
            ready = wait([*pending.values(), *(s for s, r in sentinels.items() if r in pending)])
            for item in ready:
                rank = next((r for r, c in pending.items() if c is item), None)
                if rank is not None:
                    try:
                        status, value = item.recv()  # type: ignore[union-attr]
                    except (EOFError, OSError):
                        self._fail(rank, self._death(rank))
                    if status == "error":
                        # a rank that died makes the others' collectives fail: name it first
                        dead = [r for r, p in enumerate(self.procs) if r != rank and _dead(p)]
                        if dead:
                            self._fail(dead[0], self._death(dead[0]))
                        self._fail(rank, f"raised {value}")
                    results[rank] = value
                    del pending[rank]
                    continue
                died = sentinels[item]  # type: ignore[index]
                if died in pending and not pending[died].poll():
                    self._fail(died, self._death(died))
        return [results[r] for r in range(self.world_size)]

    def _death(self, rank: int) -> str:
        proc = self.procs[rank]
        proc.join(1.0)
        code = proc.exitcode
        how = f"exit code {code}" if code is None or code >= 0 else f"signal {-code}"
        return f"died ({how}; pid {proc.pid})"

    def _fail(self, rank: int, what: str) -> None:
        self.shutdown()
        raise RuntimeError(
            f"{rank_name(rank, self.spec)} ({self.kind} executor) {what}; "
            "the other ranks were shut down"
        )

    def shutdown(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        for conn in self.conns:
            with contextlib.suppress(Exception):
                conn.send(("__exit__", ()))
        for proc in self.procs:
            proc.join(_SHUTDOWN_SECONDS / 2)
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(_SHUTDOWN_SECONDS / 2)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            with contextlib.suppress(Exception):
                conn.close()


@contextlib.contextmanager
def _main_module_not_rerun() -> Any:
    """Start a spawned rank without running the driver's main script again in it.

    ``spawn`` re-imports the parent's ``__main__`` in each child (by path or by
    module name), which runs an unguarded script's engine construction again. A
    rank needs nothing from the script (its target and arguments come from
    importable modules), so the script is hidden from the preparation data while
    the process starts.
    """
    import sys

    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {
        name: main.__dict__[name] for name in ("__file__", "__spec__") if name in main.__dict__
    }
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _dead(proc: Any) -> bool:
    """Whether ``proc`` has ended (waiting a moment for one that is ending)."""
    proc.join(0.5)
    return not proc.is_alive()


def _child_environment(spec: WorkerSpec) -> dict[str, str]:
    """What a rank process must see: the same platform as the driver."""
    plat = spec.platform
    env = {"HWPLUG_PLATFORM": plat.name}
    if plat.simulated and plat.profile:
        env = {"HWPLUG_SIMULATE": plat.profile}
    return env


def _rank_environment(spec: WorkerSpec, rank: int) -> tuple[dict[str, str], int]:
    """What spawned rank ``rank`` sees, and its local rank there.

    On a real device platform whose visibility variable is known (CUDA, ROCm,
    HPU, XPU, a vendor's), each rank sees only its own device (the variable set
    to that device's physical id, through the driver's own visibility), so its
    local rank is 0; on the CPU and simulated platforms every rank sees the host.
    """
    env = _child_environment(spec)
    plat = spec.platform
    var = plat.device_control_env_var
    if plat.simulated or plat.device_type == "cpu" or not var or spec.device is not None:
        return env, rank
    env[var] = str(plat.device_id_to_physical_device_id(rank))
    return env, 0


# -- ray -----------------------------------------------------------------------------------


class RayExecutor(Executor):
    """One Ray actor per rank, placed by a placement group."""

    kind = "ray"

    def __init__(self, spec: WorkerSpec) -> None:
        self._token_mode = _token_mode_for_a_cluster()  # before Ray reads its settings
        try:
            import ray
        except ImportError:
            raise ConfigError(
                "parallel.distributed_executor_backend='ray' needs Ray: pip install "
                "'tiny-engine[ray]' (or pip install ray)"
            ) from None
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._ray = ray
        self._remove = remove_placement_group
        self.world_size = spec.world_size
        self.spec = spec
        self.driver_rank = driver_rank(spec)
        self._closed = False
        self.actors: list[Any] = []
        self.group: Any = None
        if not ray.is_initialized():
            _join_ray(ray)
        key = spec.platform.ray_device_key or "CPU"
        self.group = placement_group([{key: 1}] * spec.world_size, strategy="PACK")
        try:
            ray.get(self.group.ready(), timeout=120)
        except Exception as exc:
            self.shutdown()
            raise RuntimeError(
                f"Ray could not place {spec.world_size} ranks with {{{key!r}: 1}} each within "
                f"120 s ({exc}); the cluster has {ray.cluster_resources()}"
            ) from exc
        env = _child_environment(spec)
        options: dict[str, Any] = {"num_cpus": 1} if key == "CPU" else {"num_cpus": 0}
        if key != "CPU":
            options["resources"] = {key: 1}
        actor_cls = ray.remote(_RayRank)
        for rank in range(spec.world_size):
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=self.group, placement_group_bundle_index=rank
            )
            self.actors.append(
                actor_cls.options(
                    scheduling_strategy=strategy, runtime_env={"env_vars": env}, **options
                ).remote()
            )
        host, port = self._get([self.actors[0].address.remote()])[0]
        init = f"tcp://{host}:{port}"
        ranks = [
            dataclasses.replace(spec, rank=r, init_method=init) for r in range(self.world_size)
        ]
        self._get([actor.start.remote(s) for actor, s in zip(self.actors, ranks)])

    def run(self, method: str, *args: Any) -> list[Any]:
        if self._closed:
            raise RuntimeError("the engine's ranks were shut down; build a new LLM")
        return self._get([actor.call.remote(method, *args) for actor in self.actors])

    def _get(self, refs: list[Any]) -> list[Any]:
        ray = self._ray
        index = {ref: rank for rank, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except Exception as exc:
                failures = {index[done[0]]: _ray_error(exc)}
                # a rank that died makes the others' collectives fail: wait a moment for
                # the others' outcomes and name a dead rank first
                finished, _ = ray.wait(pending, num_returns=len(pending), timeout=5)
                for ref in finished:
                    try:
                        ray.get(ref)
                    except Exception as other:
                        failures[index[ref]] = _ray_error(other)
                died = [r for r, what in sorted(failures.items()) if what.startswith("died")]
                rank = died[0] if died else min(failures)
                self.shutdown()
                hint = ""
                if self._token_mode and died:
                    hint = (
                        f" (this driver joined RAY_ADDRESS={os.environ.get('RAY_ADDRESS')} "
                        f"with token authentication because this host has a Ray token, as "
                        "ray start would; a cluster started without authentication needs "
                        "RAY_AUTH_MODE=disabled here too)"
                    )
                raise RuntimeError(
                    f"{rank_name(rank, self.spec)} (ray executor) "
                    f"{failures[rank]}; the other ranks were shut down{hint}"
                ) from None
        return ray.get(refs)

    def shutdown(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        ray = self._ray
        for actor in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        if self.group is not None:
            with contextlib.suppress(Exception):
                self._remove(self.group)


RAY_TOKEN_FILE = "~/.ray/auth_token"
"""Where ``ray start`` and a local ``ray.init()`` keep the cluster's token."""


def _ray_token_available() -> bool:
    """Whether this host has a Ray authentication token (Ray's own places for it)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser(RAY_TOKEN_FILE)
    return os.path.isfile(path) and os.path.getsize(path) > 0


def _token_mode_for_a_cluster() -> bool:
    """Join the cluster of ``RAY_ADDRESS`` as ``ray start`` would on this host: with
    token authentication when the host has a Ray token and ``RAY_AUTH_MODE`` is
    unset. Returns whether it set ``RAY_AUTH_MODE=token``.

    ``ray start`` (and a ``ray.init()`` that finds a local cluster) turns token
    authentication on by itself when a token exists (``~/.ray/auth_token``, which
    a local ``ray.init()`` writes), but a driver given an address does so only
    when ``RAY_AUTH_MODE=token`` is set: without it a cluster that ``ray start``
    put in token mode refuses it, Ray retries for 20 s and fails with "Failed to
    connect". Ray reads the mode from the environment when it is imported.
    """
    address = os.environ.get("RAY_ADDRESS")
    if address and "RAY_AUTH_MODE" not in os.environ and _ray_token_available():
        os.environ["RAY_AUTH_MODE"] = "token"
        logger.info("joining the Ray cluster at %s with token authentication", address)
        return True
    return False


def _join_ray(ray: Any) -> None:
    """``ray.init()``: join the cluster of ``RAY_ADDRESS``, else start a local one.

    :raises RuntimeError: the cluster cannot be joined; the message says whether
        token authentication may be the cause.
    """
    address = os.environ.get("RAY_ADDRESS") or None
    try:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    except Exception as exc:
        raise RuntimeError(_ray_connect_error(address, exc)) from exc


def _ray_connect_error(address: str | None, exc: BaseException) -> str:
    """What to say when Ray could not be joined or started."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    where = f"the Ray cluster at RAY_ADDRESS={address}" if address else "a local Ray"
    message = f"could not join {where}: {type(exc).__name__}: {text}"
    auth = "token" in str(exc).lower() or "auth" in type(exc).__name__.lower()
    mode = os.environ.get("RAY_AUTH_MODE")
    if address is not None and (auth or mode is not None or _ray_token_available()):
        message += (
            "; if the cluster uses token authentication (ray start turns it on when "
            f"{RAY_TOKEN_FILE} exists), this driver needs RAY_AUTH_MODE=token (it is "
            f"{mode!r}) and the cluster's token: in {RAY_TOKEN_FILE}, RAY_AUTH_TOKEN_PATH "
            "or RAY_AUTH_TOKEN"
        )
    return message


def _ray_error(exc: BaseException) -> str:
    name = type(exc).__name__
    if "ActorDied" in name or "ActorError" in name or "ActorUnavailable" in name:
        return f"died ({name})"
    cause = getattr(exc, "cause", None)
    if cause is not None:
        text = "".join(traceback.format_exception_only(type(cause), cause)).strip()
        return f"raised {text}"
    return f"raised {name}: {str(exc).splitlines()[0] if str(exc) else ''}"


class _RayRank:
    """A Ray actor holding one rank's worker."""

    def __init__(self) -> None:
        self.worker: Worker | None = None

    def address(self) -> tuple[str, int]:
        import ray

        host = ray.util.get_node_ip_address()
        return host, _free_port(host)

    def start(self, spec: WorkerSpec) -> int:
        self.worker = Worker(spec)
        return spec.rank

    def call(self, method: str, *args: Any) -> Any:
        assert self.worker is not None
        return getattr(self.worker, method)(*args)


def make_executor(kind: str, spec: WorkerSpec) -> Executor:
    """The executor called ``kind``, its ranks started.

    :raises ConfigError: an unknown kind, ``uni`` for several ranks, a launcher's
        environment missing, or Ray not installed.
    """
    if kind == "uni":
        if spec.world_size != 1:
            raise ConfigError(
                f"parallel.distributed_executor_backend='uni' runs one process, but the engine "
                f"has {spec.world_size} ranks (parallel.tensor_parallel_size x "
                "pipeline_parallel_size); use 'mp', 'ray' or 'external_launcher'"
            )
        return UniExecutor(spec)
    if kind == "mp":
        return MultiprocExecutor(spec)
    if kind == "ray":
        return RayExecutor(spec)
    if kind == "external_launcher":
        return ExternalLauncherExecutor(spec)
    raise ConfigError(
        f"parallel.distributed_executor_backend={kind!r} is not an executor tiny_engine "
        f"runs; choose one of: {', '.join(EXECUTORS)}"
    )
