"""SPEC 15: pipeline stages and data-parallel replicas in tiny_engine, every executor.

Greedy fp32 generations at pp = 2, tp = 2 x pp = 2, dp = 2 and dp = 2 x tp = 2
equal transformers' (SPEC 13's rule) with ``mp``, ``ray`` and
``external_launcher`` (``torchrun``); a killed stage and a killed replica are
named and no process is left behind.
"""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwplug import ConfigError
from tests.engine.conftest import cpu_config, prompts_of
from tests.engine.reference import Reference, assert_matches
from tests.engine.test_tensor_parallel import _gone, serve_under_torchrun

pytest.importorskip("transformers")
pytest.importorskip("psutil")

PROMPTS = prompts_of([7, 3, 20, 5], vocab=250)
MAX_TOKENS = 6

LAYOUTS = {
    "pp2": {"pipeline_parallel_size": 2},
    "tp2xpp2": {"tensor_parallel_size": 2, "pipeline_parallel_size": 2},
    "dp2": {"data_parallel_size": 2},
    "dp2xtp2": {"data_parallel_size": 2, "tensor_parallel_size": 2},
}
"""The layouts SPEC 15 names, as ``parallel`` sections."""


def _ranks(layout: dict[str, int]) -> int:
    return (
        layout.get("tensor_parallel_size", 1)
        * layout.get("pipeline_parallel_size", 1)
        * layout.get("data_parallel_size", 1)
    )


@pytest.fixture(scope="module")
def qwen2(make_ckpt: Callable[..., Path]) -> Path:
    """3 layers (two stages of 2 and 1), 4 query and 2 key/value heads, biases, a
    vocabulary of 250, tied embeddings (the last stage's head is the first's embedding)."""
    return make_ckpt("qwen2-pp", arch="qwen2", vocab=250, tie=True, layers=3)


@pytest.fixture(scope="module")
def expected(qwen2: Path) -> dict[str, Any]:
    ref = Reference(qwen2)
    return {"ref": ref, "tokens": [ref.generate(p, MAX_TOKENS) for p in PROMPTS]}


def _config(layout: dict[str, int], executor: str, **sections: dict[str, Any]) -> dict[str, Any]:
    return cpu_config(parallel={**layout, "distributed_executor_backend": executor}, **sections)


def _check(expected: dict[str, Any], outputs: list[list[int]]) -> None:
    assert len(outputs) == len(PROMPTS)
    for prompt, ours, theirs in zip(PROMPTS, outputs, expected["tokens"]):
        assert_matches(expected["ref"], prompt, ours, theirs)


def _pids(llm: Any) -> list[int]:
    """Every rank process of every replica."""
    engines = llm.replicas or [llm]
    return [pid for engine in engines for pid in engine.executor.pids]


# -- the parts that need no second process ------------------------------------------------


@settings(deadline=None)  # the first example imports the engine
@given(st.integers(1, 64), st.integers(1, 16))
def test_stages_hold_contiguous_layers_whose_counts_differ_by_at_most_one(
    layers: int, stages: int
) -> None:
    from tiny_engine.model import stage_layers

    if stages > layers:
        return
    spans = [stage_layers(layers, stages, s) for s in range(stages)]
    assert spans[0][0] == 0 and spans[-1][1] == layers
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), spans
    counts = [end - start for start, end in spans]
    assert max(counts) - min(counts) <= 1 and min(counts) >= 1
    # the extra layers go before the last stage, which also computes the head
    assert counts[-1] == min(counts)


def test_the_reference_split_of_odd_layer_counts() -> None:
    from tiny_engine.model import stage_layers

    assert [stage_layers(3, 2, s) for s in range(2)] == [(0, 2), (2, 3)]
    assert [stage_layers(10, 4, s) for s in range(4)] == [(0, 2), (2, 5), (5, 8), (8, 10)]


@settings(deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 50), st.integers(1, 50)), min_size=0, max_size=40),
    st.integers(1, 6),
)
def test_prompts_are_spread_once_each_by_tokens_to_compute(
    work: list[tuple[int, int]], replicas: int
) -> None:
    from tiny_engine.engine import spread

    prompts = [[3] * n for n, _ in work]
    limits = [m for _, m in work]
    shares = spread(prompts, limits, replicas)
    assert len(shares) == replicas
    assert sorted(i for share in shares for i in share) == list(range(len(work)))
    assert all(share == sorted(share) for share in shares)
    loads = [sum(len(prompts[i]) + limits[i] for i in share) for share in shares]
    biggest = max((n + m for n, m in work), default=0)
    # greedy largest-first: no replica is more than one prompt ahead of another
    assert max(loads) - min(loads) <= biggest
    assert shares == spread(prompts, limits, replicas)  # every rank computes the same


def test_more_stages_than_layers_is_a_config_error(qwen2: Path) -> None:
    from tiny_engine import LLM

    with pytest.raises(ConfigError, match=r"pipeline_parallel_size=4 is more stages than .* 3"):
        LLM(qwen2, config=_config({"pipeline_parallel_size": 4}, "mp"))


def test_uni_with_stages_is_a_config_error(qwen2: Path) -> None:
    from tiny_engine import LLM

    with pytest.raises(ConfigError, match="tensor_parallel_size x pipeline_parallel_size"):
        LLM(qwen2, config=_config(LAYOUTS["pp2"], "uni"))


def test_uni_replicas_run_in_this_process_and_equal_one_replica(
    qwen2: Path, expected: dict[str, Any]
) -> None:
    import torch
    from tiny_engine import LLM

    threads = torch.get_num_threads()
    with LLM(qwen2, config=_config(LAYOUTS["dp2"], "uni")) as llm:
        outputs = llm.generate(PROMPTS, max_tokens=MAX_TOKENS, ignore_eos=True)
        sampled = llm.generate(PROMPTS, max_tokens=4, temperature=1.0, seed=7)
        stats = llm.stats
    _check(expected, outputs)
    assert torch.get_num_threads() == threads, "the replicas' share of the cores was given back"
    with LLM(qwen2, config=_config({}, "uni")) as one:
        assert sampled == one.generate(PROMPTS, max_tokens=4, temperature=1.0, seed=7)
    assert stats["data_parallel_size"] == 2 and stats["pipeline_parallel_size"] == 1
    assert len(stats["replicas"]) == 2
    per_replica = [r["generated_tokens"] for r in stats["replicas"]]
    assert all(n > 0 for n in per_replica), "both replicas served prompts"
    assert stats["generated_tokens"] == sum(per_replica)


# -- mp ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_mp_layouts_generate_transformers_tokens(
    qwen2: Path, expected: dict[str, Any], layout: str
) -> None:
    from tiny_engine import LLM

    parallel = LAYOUTS[layout]
    with LLM(qwen2, config=_config(parallel, "mp")) as llm:
        outputs = llm.generate(PROMPTS, max_tokens=MAX_TOKENS, ignore_eos=True)
        stats = llm.stats
        pids = _pids(llm)
    _check(expected, outputs)
    assert len(pids) == _ranks(parallel)
    if layout in ("pp2", "tp2xpp2"):
        # each stage's KV cache holds its own layers only: 2 + 1 of the 3
        stages = stats["stages"]
        assert [s["layers"] for s in stages] == [[0, 2], [2, 3]]
        assert [s["kv_cache_layers"] for s in stages] == [2, 1]
        assert stages[0]["kv_cache_bytes"] == 2 * stages[1]["kv_cache_bytes"]
    assert stats["pipeline_parallel_size"] == parallel.get("pipeline_parallel_size", 1)
    assert stats["data_parallel_size"] == parallel.get("data_parallel_size", 1)
    assert _gone(pids), "ranks outlived the engine"


@pytest.mark.slow
def test_compiled_stages_generate_transformers_tokens(
    qwen2: Path, expected: dict[str, Any]
) -> None:
    from tiny_engine import LLM

    config = _config(LAYOUTS["pp2"], "mp", model={"enforce_eager": False})
    with LLM(qwen2, config=config) as llm:
        outputs = llm.generate(PROMPTS, max_tokens=MAX_TOKENS, ignore_eos=True)
        assert llm.stats["compiled"] is True
    _check(expected, outputs)


@pytest.mark.slow
def test_a_killed_stage_is_named_and_no_rank_remains(qwen2: Path) -> None:
    from tiny_engine import LLM

    llm = LLM(qwen2, config=_config(LAYOUTS["tp2xpp2"], "mp"))
    pids = _pids(llm)
    os.kill(pids[2], signal.SIGKILL)  # stage 1, tensor rank 0
    with pytest.raises(RuntimeError) as info:
        llm.generate(PROMPTS, max_tokens=2, ignore_eos=True)
    message = str(info.value)
    assert (
        "rank 2 of 4 (pipeline stage 1 of 2, tensor-parallel rank 0 of 2) (mp executor) died"
        in message
    ), message
    assert "signal 9" in message and "the other ranks were shut down" in message
    assert _gone(pids)
    llm.close()


@pytest.mark.slow
def test_a_killed_replica_is_named_and_no_rank_of_any_replica_remains(qwen2: Path) -> None:
    from tiny_engine import LLM

    llm = LLM(qwen2, config=_config(LAYOUTS["dp2"], "mp"))
    pids = _pids(llm)
    os.kill(pids[1], signal.SIGKILL)  # replica 1's only rank
    with pytest.raises(RuntimeError) as info:
        llm.generate(PROMPTS, max_tokens=2, ignore_eos=True)
    message = str(info.value)
    assert message.startswith("data-parallel replica 1 of 2: tensor-parallel rank 0 of 1"), message
    assert "died" in message and "the other replicas were shut down" in message
    assert _gone(pids), "a replica's ranks outlived the failure"
    with pytest.raises(RuntimeError, match="closed"):
        llm.generate(PROMPTS, max_tokens=2, ignore_eos=True)


# -- ray ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    os.environ.pop("RAY_ADDRESS", None)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_ray_layouts_generate_transformers_tokens(
    qwen2: Path, expected: dict[str, Any], local_ray: Any, layout: str
) -> None:
    from tiny_engine import LLM

    with LLM(qwen2, config=_config(LAYOUTS[layout], "ray")) as llm:
        outputs = llm.generate(PROMPTS, max_tokens=MAX_TOKENS, ignore_eos=True)
        assert llm.stats["executor"] == "ray"
    _check(expected, outputs)


@pytest.mark.slow
def test_a_killed_ray_stage_is_named(qwen2: Path, local_ray: Any) -> None:
    from tiny_engine import LLM

    llm = LLM(qwen2, config=_config(LAYOUTS["pp2"], "ray"))
    pids = llm.executor.run("process_id")  # type: ignore[union-attr]
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(
        RuntimeError, match=r"rank 1 of 2 \(pipeline stage 1 of 2, .*\(ray executor\) died"
    ):
        llm.generate(PROMPTS, max_tokens=2, ignore_eos=True)
    assert _gone(pids)
    llm.close()


@pytest.mark.slow
def test_a_killed_ray_replica_is_named_and_every_replica_is_shut_down(
    qwen2: Path, local_ray: Any
) -> None:
    from tiny_engine import LLM

    llm = LLM(qwen2, config=_config(LAYOUTS["dp2"], "ray"))
    pids = [pid for r in llm.replicas for pid in r.executor.run("process_id")]
    os.kill(pids[0], signal.SIGKILL)  # replica 0's only rank
    with pytest.raises(RuntimeError) as info:
        llm.generate(PROMPTS, max_tokens=2, ignore_eos=True)
    message = str(info.value)
    assert message.startswith("data-parallel replica 0 of 2: tensor-parallel rank 0 of 1 (ray"), (
        message
    )
    assert "died" in message and "the other replicas were shut down" in message
    assert _gone(pids)


# -- torchrun ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_torchrun_layouts_each_rank_returns_transformers_tokens(
    qwen2: Path, expected: dict[str, Any], tmp_path: Path, layout: str
) -> None:
    parallel = LAYOUTS[layout]
    config = _config(parallel, "external_launcher")
    outputs = serve_under_torchrun(qwen2, config, PROMPTS, MAX_TOKENS, _ranks(parallel), tmp_path)
    assert all(rank == outputs[0] for rank in outputs), "every rank returns the same outputs"
    _check(expected, outputs[0]["outputs"])


def test_a_launcher_world_other_than_every_replicas_ranks_is_named(
    qwen2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tiny_engine import LLM

    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29999")
    config = _config(LAYOUTS["dp2xtp2"], "external_launcher")
    with pytest.raises(ConfigError) as info:
        LLM(qwen2, config=config)
    message = str(info.value)
    assert "WORLD_SIZE=2" in message and "the engine has 4 ranks" in message
    assert "data_parallel_size 2" in message
