"""SPEC 14: tensor parallelism in tiny_engine over the platform's collectives, every executor.

Greedy fp32 generations at N = 2 and 4 ranks equal transformers' (SPEC 13's
rule) with ``mp`` (spawned processes), ``ray`` (actors of a local Ray) and
``external_launcher`` (``torchrun``); a rank that raises or dies is named and
no process is left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.engine.conftest import ENGINE_SRC, cpu_config, prompts_of
from tests.engine.reference import Reference, assert_matches

pytest.importorskip("transformers")
psutil = pytest.importorskip("psutil")

pytestmark = pytest.mark.slow

PROMPTS = prompts_of([7, 3, 20], vocab=250)
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def qwen2(make_ckpt: Callable[..., Path]) -> Path:
    """4 query heads, 2 key/value heads (replicated at 4 ranks), biases, a vocabulary of
    250 (padded at 4 ranks), tied embeddings."""
    return make_ckpt("qwen2-tp", arch="qwen2", vocab=250, tie=True)


@pytest.fixture(scope="module")
def expected(qwen2: Path) -> dict[str, Any]:
    ref = Reference(qwen2)
    return {"ref": ref, "tokens": [ref.generate(p, MAX_TOKENS) for p in PROMPTS]}


def _config(size: int, executor: str, **sections: dict[str, Any]) -> dict[str, Any]:
    parallel = {"tensor_parallel_size": size, "distributed_executor_backend": executor}
    return cpu_config(parallel=parallel, **sections)


def _check(expected: dict[str, Any], outputs: list[list[int]]) -> None:
    for prompt, ours, theirs in zip(PROMPTS, outputs, expected["tokens"]):
        assert_matches(expected["ref"], prompt, ours, theirs)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _gone(pids: list[int], within: float = 20.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if psutil.pid_exists(pid) and _running(pid)]
        if not alive:
            return True
        time.sleep(0.2)
    return False


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize(("size", "eager"), [(2, True), (4, True), (2, False)])
def test_mp_ranks_generate_transformers_tokens(
    qwen2: Path, expected: dict[str, Any], size: int, eager: bool
) -> None:
    from tiny_engine import LLM

    config = _config(size, "mp", model={"enforce_eager": eager})
    with LLM(qwen2, config=config) as llm:
        outputs = llm.generate(PROMPTS, max_tokens=MAX_TOKENS, ignore_eos=True)
        stats = llm.stats
        pids = list(llm.executor.pids)  # type: ignore[union-attr]
    _check(expected, outputs)
    assert stats["tensor_parallel_size"] == size and stats["executor"] == "mp"
    assert _gone(pids), "ranks outlived the engine"


def test_an_unset_executor_with_several_ranks_is_mp(qwen2: Path) -> None:
    from tiny_engine import LLM

    config = cpu_config(parallel={"tensor_parallel_size": 2})
    with LLM(qwen2, config=config) as llm:
        assert llm.stats["executor"] == "mp"
        change = [c for c in llm.resolution.changes if "executor" in c.path]
        assert change and change[0].source == "platform:cpu"


def test_a_rank_that_dies_is_named_and_the_others_are_shut_down(qwen2: Path) -> None:
    from tiny_engine import LLM

    llm = LLM(qwen2, config=_config(2, "mp"))
    pids = list(llm.executor.pids)  # type: ignore[union-attr]
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(RuntimeError) as info:
        llm.generate(PROMPTS, max_tokens=2, ignore_eos=True)
    message = str(info.value)
    assert "tensor-parallel rank 1 of 2 (mp executor) died" in message
    assert "signal 9" in message and "the other ranks were shut down" in message
    assert _gone(pids)
    with pytest.raises(RuntimeError, match="shut down"):
        llm.generate(PROMPTS, max_tokens=2, ignore_eos=True)
    llm.close()


def test_a_rank_that_raises_is_named(qwen2: Path) -> None:
    from tiny_engine import LLM

    llm = LLM(qwen2, config=_config(2, "mp"))
    pids = list(llm.executor.pids)  # type: ignore[union-attr]
    with pytest.raises(RuntimeError) as info:
        llm.executor.run("no_such_method")  # type: ignore[union-attr]
    assert re.search(
        r"tensor-parallel rank [01] of 2 \(mp executor\) raised AttributeError", str(info.value)
    )
    assert "no_such_method" in str(info.value)
    assert _gone(pids)
    llm.close()


DRIVER = textwrap.dedent(
    """
    import json, sys, time
    from tiny_engine import LLM

    llm = LLM(sys.argv[1], config=json.loads(sys.argv[2]))
    print(json.dumps(llm.executor.pids), flush=True)
    time.sleep(600)
    """
)


def test_ranks_do_not_outlive_a_killed_driver(qwen2: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ENGINE_SRC), env.get("PYTHONPATH")]))
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(qwen2), json.dumps(_config(2, "mp"))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = driver.stdout.readline()  # type: ignore[union-attr]
        assert line, driver.stderr.read()  # type: ignore[union-attr]
        pids = json.loads(line)
        assert all(_running(pid) for pid in pids)
        driver.kill()
        driver.wait(30)
        assert _gone(pids), "ranks outlived their killed driver"
    finally:
        if driver.poll() is None:
            driver.kill()


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    os.environ.pop("RAY_ADDRESS", None)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.parametrize("size", [2, 4])
def test_ray_ranks_generate_transformers_tokens(
    qwen2: Path, expected: dict[str, Any], local_ray: Any, size: int
) -> None:
    from tiny_engine import LLM

    with LLM(qwen2, config=_config(size, "ray")) as llm:
        outputs = llm.generate(PROMPTS, max_tokens=MAX_TOKENS, ignore_eos=True)
        assert llm.stats["executor"] == "ray"
    _check(expected, outputs)


def test_a_ray_rank_that_dies_is_named(qwen2: Path, local_ray: Any) -> None:
    from tiny_engine import LLM

    llm = LLM(qwen2, config=_config(2, "ray"))
    pids = llm.executor.run("process_id")  # type: ignore[union-attr]
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(RuntimeError, match=r"tensor-parallel rank 1 of 2 \(ray executor\) died"):
        llm.generate(PROMPTS, max_tokens=2, ignore_eos=True)
    assert _gone(pids)
    llm.close()


def test_the_docs_ray_cluster_recipe_works_when_the_host_has_a_ray_token(
    qwen2: Path, expected: dict[str, Any], tmp_path: Path
) -> None:
    # docs/distributed.md: `ray start --head`, then the CLI with RAY_ADDRESS. With a token
    # in ~/.ray/auth_token (a local ray.init() writes one), `ray start` turns token
    # authentication on, and a driver given an address sent no token: "Failed to connect"
    pytest.importorskip("ray")
    ray_cli = Path(sys.executable).with_name("ray")
    if not ray_cli.exists():
        pytest.skip("the ray command is not installed")
    env = dict(os.environ, HOME=str(tmp_path / "home"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ENGINE_SRC), env.get("PYTHONPATH")]))
    for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(name, None)
    (tmp_path / "home" / ".ray").mkdir(parents=True)
    (tmp_path / "home" / ".ray" / "auth_token").write_text("a" * 32)
    port = _free_port()
    head = [str(ray_cli), "start", "--head", "--port", str(port), "--num-cpus", "2"]
    head += ["--include-dashboard=false", "--disable-usage-stats"]
    # not the default temp dir, so no other test finds the cluster; short, for Ray's sockets
    ray_temp = tempfile.mkdtemp(prefix="hwplug-ray-", dir="/tmp")
    head += ["--temp-dir", ray_temp]
    started = subprocess.run(head, env=env, capture_output=True, text=True, timeout=180)
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        command = [sys.executable, "-m", "tiny_engine", "--model", str(qwen2), "--json"]
        command += ["--set", "parallel.tensor_parallel_size=2"]
        command += ["--set", "parallel.distributed_executor_backend=ray"]
        command += ["--set", "model.dtype=float32", "--set", "model.enforce_eager=true"]
        command += ["--max-tokens", str(MAX_TOKENS), "--ignore-eos"]
        command += ["--prompt-ids", json.dumps(PROMPTS)]
        result = subprocess.run(
            command,
            env=dict(env, RAY_ADDRESS=f"127.0.0.1:{port}"),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        _check(expected, json.loads(result.stdout)["outputs"])
        # a driver told to send no token: the error names the cause and the fix
        result = subprocess.run(
            command,
            env=dict(env, RAY_ADDRESS=f"127.0.0.1:{port}", RAY_AUTH_MODE="disabled"),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode != 0
        last = result.stderr.strip().splitlines()[-1]
        assert "token authentication" in last and "RAY_AUTH_MODE=token" in last, last
    finally:
        # Only this cluster's processes (their command lines name its temp dir): `ray stop`
        # would stop every Ray cluster of the machine, the module's `local_ray` one too.
        _stop_processes_naming(ray_temp)
        shutil.rmtree(ray_temp, ignore_errors=True)


def _stop_processes_naming(text: str, timeout: float = 30.0) -> None:
    """Terminate (then kill) every process whose command line contains ``text``."""
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if any(text in part for part in process.info["cmdline"] or ()):
                process.terminate()
                found.append(process)
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(found, timeout=timeout)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()


RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from tiny_engine import LLM

    path, config, prompts, out = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
    with LLM(path, config=config) as llm:
        outputs = llm.generate(prompts, max_tokens=int(sys.argv[5]), ignore_eos=True)
        sampled = llm.generate(prompts, max_tokens=4, temperature=1.0)
    with open(os.path.join(out, f"rank{os.environ['RANK']}.json"), "w") as f:
        json.dump({"outputs": outputs, "sampled": sampled, "executor": llm.stats["executor"]}, f)
    """
)


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _torchrun(
    *args: str, ranks: int = 2, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env_extra or {}))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ENGINE_SRC), env.get("PYTHONPATH")]))
    torchrun = Path(sys.executable).with_name("torchrun")
    command = (
        [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    )
    return subprocess.run(
        [*command, "--nproc-per-node", str(ranks), "--master-port", str(_free_port()), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize("size", [2, 4])
def test_torchrun_ranks_each_return_transformers_tokens(
    qwen2: Path, expected: dict[str, Any], tmp_path: Path, size: int
) -> None:
    ranks = serve_under_torchrun(
        qwen2, _config(size, "external_launcher"), PROMPTS, MAX_TOKENS, size, tmp_path
    )
    assert all(rank == ranks[0] for rank in ranks), "every rank returns the same outputs"
    assert ranks[0]["executor"] == "external_launcher"
    _check(expected, ranks[0]["outputs"])


def serve_under_torchrun(
    checkpoint: Path,
    config: dict[str, Any],
    prompts: list[list[int]],
    max_tokens: int,
    ranks: int,
    tmp_path: Path,
) -> list[dict[str, Any]]:
    """:data:`RANK_SCRIPT` under torchrun with ``ranks`` processes; each rank's report
    (``outputs``, ``sampled``, ``executor``), in rank order."""
    script = tmp_path / "serve.py"
    script.write_text(RANK_SCRIPT)
    result = _torchrun(
        str(script),
        str(checkpoint),
        json.dumps(config),
        json.dumps(prompts),
        str(tmp_path),
        str(max_tokens),
        ranks=ranks,
    )
    assert result.returncode == 0, result.stderr[-8000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(ranks)]


def test_the_cli_runs_under_torchrun(qwen2: Path, expected: dict[str, Any]) -> None:
    prompts = json.dumps(PROMPTS)
    result = _torchrun(
        "-m",
        "tiny_engine",
        "--model",
        str(qwen2),
        "--set",
        "parallel.tensor_parallel_size=2",
        "--set",
        "parallel.distributed_executor_backend=external_launcher",
        "--set",
        "model.dtype=float32",
        "--max-tokens",
        str(MAX_TOKENS),
        "--prompt-ids",
        prompts,
        "--ignore-eos",
        "--json",
    )
    assert result.returncode == 0, result.stderr[-8000:]
    reports = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(reports) == 1, "rank 0 alone prints"
    assert reports[0]["stats"]["tensor_parallel_size"] == 2
    _check(expected, reports[0]["outputs"])


# -- configurations that cannot run ---------------------------------------------------------


def test_a_size_that_does_not_divide_the_heads_is_a_config_error(qwen2: Path) -> None:
    from tiny_engine import LLM

    from hwplug import ConfigError

    with pytest.raises(ConfigError, match="tensor_parallel_size=3 does not divide"):
        LLM(qwen2, config=_config(3, "mp"))


def test_uni_with_several_ranks_is_a_config_error(qwen2: Path) -> None:
    from tiny_engine import LLM

    from hwplug import ConfigError

    with pytest.raises(ConfigError, match="'uni' runs one process"):
        LLM(qwen2, config=_config(2, "uni"))


def test_external_launcher_without_a_launcher_names_the_variables(
    qwen2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tiny_engine import LLM

    from hwplug import ConfigError

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="torchrun") as info:
        LLM(qwen2, config=_config(2, "external_launcher"))
    assert "RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT" in str(info.value)


_LAUNCHED = {
    "RANK": "0",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "0",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}
"""What torchrun sets for rank 0 of 2; each case below spoils one variable."""

_ALLOWED = {
    "MASTER_PORT": "a TCP port, an integer 1 .. 65535",
    "RANK": "an integer 0 .. 1, below WORLD_SIZE=2",
    "LOCAL_RANK": "a non-negative integer",
    "WORLD_SIZE": "a positive integer",
}


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("MASTER_PORT", "notaport", "is not an integer"),
        ("MASTER_PORT", "29500.0", "is not an integer"),
        ("MASTER_PORT", "0", "is out of range"),
        ("MASTER_PORT", "65536", "is out of range"),
        ("RANK", "first", "is not an integer"),
        ("RANK", "-1", "is out of range"),
        ("RANK", "2", "is out of range"),
        ("LOCAL_RANK", "gpu0", "is not an integer"),
        ("LOCAL_RANK", "-1", "is out of range"),
        ("WORLD_SIZE", "two", "is not an integer"),
        ("WORLD_SIZE", "0", "is out of range"),
    ],
)
def test_a_bad_launcher_variable_is_a_config_error_naming_it_its_value_and_the_range(
    qwen2: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str, problem: str
) -> None:
    from tiny_engine import LLM

    from hwplug import ConfigError

    for key, set_to in {**_LAUNCHED, name: value}.items():
        monkeypatch.setenv(key, set_to)
    with pytest.raises(ConfigError) as info:
        LLM(qwen2, config=_config(2, "external_launcher"))
    assert str(info.value) == (
        f"{name}={value!r} {problem}; {name} must be {_ALLOWED[name]} (set by the launcher "
        "for parallel.distributed_executor_backend='external_launcher')"
    )


def test_a_launcher_world_other_than_the_engines_is_a_config_error(
    qwen2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tiny_engine import LLM

    from hwplug import ConfigError

    for key, value in {**_LAUNCHED, "WORLD_SIZE": "4", "RANK": "3"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match=r"^the launcher started WORLD_SIZE=4 ranks, but "):
        LLM(qwen2, config=_config(2, "external_launcher"))


def test_spawned_ranks_of_a_device_platform_each_see_their_own_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dataclasses

    from tiny_engine.executor import _rank_environment
    from tiny_engine.worker import WorkerSpec

    from hwplug.core.config import EngineConfig
    from hwplug.platforms.cpu import CpuPlatform
    from hwplug.platforms.cuda import CudaPlatform

    real_gpu = CudaPlatform.simulate("h100:4")
    real_gpu.simulated = False  # as if detected: the executor only reads its rules
    spec = WorkerSpec(Path("/ckpt"), EngineConfig(), real_gpu, "triton", world_size=4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    env, local = _rank_environment(spec, 2)
    assert env["CUDA_VISIBLE_DEVICES"] == "6" and env["HWPLUG_PLATFORM"] == "cuda"
    assert local == 0
    cpu = CpuPlatform.simulate("cpu-generic")
    cpu.simulated = False
    env, local = _rank_environment(dataclasses.replace(spec, platform=cpu), 2)
    assert "CUDA_VISIBLE_DEVICES" not in env and local == 2
