"""SPEC 13's robustness of the engine: failed calls, threads, seeds, budgets, bad checkpoints.

Each test pins one defect found by an adversarial pass over tiny_engine (issue
#19); each fails against the engine before its fix.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.engine.conftest import cpu_config, prompts_of

pytest.importorskip("transformers")

PROMPTS = prompts_of([5, 20, 37])


def _fresh_tokens(path: Path, config: dict[str, Any], **kwargs: Any) -> list[list[int]]:
    from tiny_engine import LLM

    return LLM(path, config=config).generate(PROMPTS, max_tokens=6, ignore_eos=True, **kwargs)


# -- a generate() that raises ------------------------------------------------------------


class Boom(Exception):
    """The fault injected into a step."""


def _fail_at_step(llm: Any, step: int, error: BaseException) -> Callable[[], None]:
    """Make the runner raise ``error`` at its ``step``-th step; returns the undo."""
    original = llm.runner.execute
    calls = {"n": 0}

    def execute(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == step:
            raise error
        return original(*args, **kwargs)

    llm.runner.execute = execute

    def undo() -> None:
        llm.runner.execute = original

    return undo


@pytest.mark.parametrize("error", [Boom("kernel failed"), KeyboardInterrupt()])
@pytest.mark.parametrize("failing_step", [1, 3])
def test_a_call_that_raises_gives_back_every_block_and_the_next_call_is_right(
    llama: Path, error: BaseException, failing_step: int
) -> None:
    from tiny_engine import LLM

    # chunked prefill with a small budget: the reported endless loop
    config = cpu_config(
        scheduler={"max_num_batched_tokens": 16, "max_num_seqs": 4, "enable_chunked_prefill": True}
    )
    llm = LLM(llama, config=config)
    stats_before = llm.stats
    undo = _fail_at_step(llm, failing_step, error)
    with pytest.raises(type(error)):
        llm.generate(PROMPTS, max_tokens=6, ignore_eos=True)
    undo()
    assert llm.pool.num_free == llm.pool.num_blocks, "blocks of the failed call are still held"
    for key in ("prompt_tokens", "generated_tokens", "prefix_cache_hits", "preemptions"):
        assert llm.stats[key] == stats_before[key], key
    assert llm.generate(PROMPTS, max_tokens=6, ignore_eos=True) == _fresh_tokens(llama, config)
    assert llm.pool.num_free == llm.pool.num_blocks


def test_sequences_that_fit_the_cache_only_one_at_a_time_run_one_after_another(
    llama: Path,
) -> None:
    """Three blocks of 16 hold one sequence of 47 tokens: the others wait, in chunks."""
    from tiny_engine import LLM

    config = cpu_config(
        model={"max_model_len": 48},
        cache={"num_gpu_blocks_override": 3},
        scheduler={"max_num_batched_tokens": 16, "max_num_seqs": 4, "enable_chunked_prefill": True},
    )
    llm = LLM(llama, config=config)
    result: dict[str, BaseException] = {}

    def call() -> None:
        try:
            llm.generate(prompts_of([47, 47, 47, 47]), max_tokens=1, ignore_eos=True)
        except BaseException as exc:
            result["error"] = exc

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive(), "generate() did not return: the scheduler looped"
    assert "error" not in result, result.get("error")
    assert llm.pool.num_free == llm.pool.num_blocks


def test_a_scheduler_that_cannot_start_a_sequence_names_the_kv_budget() -> None:
    from tiny_engine.blocks import BlockPool
    from tiny_engine.scheduler import Scheduler, Sequence

    pool = BlockPool(4, 4, hash_fn=None)
    held = pool.allocate(3)  # held by something else: one block left
    assert held is not None
    scheduler = Scheduler(pool, max_num_seqs=4, max_num_batched_tokens=6, chunked_prefill=True)
    scheduler.add(Sequence(0, list(range(30)), 30, 1))
    with pytest.raises(RuntimeError, match=r"needs 2 blocks of 4 tokens and 1 of the cache's 4"):
        scheduler.schedule()


# -- threads -------------------------------------------------------------------------------


def test_generate_calls_from_threads_are_serialised(llama: Path) -> None:
    from tiny_engine import LLM

    config = cpu_config()
    llm = LLM(llama, config=config)
    groups = [prompts_of([5 + i, 30 - i], seed=i) for i in range(4)]
    alone = [llm.generate(g, max_tokens=6, ignore_eos=True) for g in groups]
    results: dict[int, list[list[int]]] = {}
    barrier = threading.Barrier(len(groups))

    def call(i: int) -> None:
        barrier.wait()
        results[i] = llm.generate(groups[i], max_tokens=6, ignore_eos=True)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(groups))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert [results[i] for i in range(len(groups))] == alone
    assert llm.pool.num_free == llm.pool.num_blocks


# -- seeds and temperatures ----------------------------------------------------------------


@pytest.fixture(scope="module")
def sampler(llama: Path) -> Any:
    from tiny_engine import LLM

    return LLM(llama, config=cpu_config())


@pytest.mark.parametrize("seed", [None, 0, -7, 2**63, 2**200, -(2**100), time.time_ns()])
def test_any_int_seed_or_none_samples(sampler: Any, seed: int | None) -> None:
    out = sampler.generate(PROMPTS, max_tokens=5, temperature=0.8, seed=seed, ignore_eos=True)
    assert [len(o) for o in out] == [5, 5, 5]
    if seed is not None:
        again = sampler.generate(PROMPTS, max_tokens=5, temperature=0.8, seed=seed, ignore_eos=True)
        assert again == out


def test_a_seed_gives_the_same_tokens_whatever_else_is_in_the_batch(sampler: Any) -> None:
    kwargs = {"max_tokens": 6, "temperature": 1.0, "seed": 2**70, "ignore_eos": True}
    alone = sampler.generate(PROMPTS[:1], **kwargs)
    batched = sampler.generate(PROMPTS, **kwargs)
    assert batched[0] == alone[0]


def test_unseeded_calls_draw_fresh_entropy(sampler: Any) -> None:
    runs = {
        json.dumps(sampler.generate(PROMPTS, max_tokens=8, temperature=2.0, ignore_eos=True))
        for _ in range(3)
    }
    assert len(runs) > 1


def test_one_max_tokens_per_prompt(sampler: Any) -> None:
    each = sampler.generate(PROMPTS, max_tokens=[2, 5, 3], ignore_eos=True)
    assert [len(o) for o in each] == [2, 5, 3]
    longest = sampler.generate(PROMPTS, max_tokens=5, ignore_eos=True)
    assert [o[: len(e)] for o, e in zip(longest, each)] == each


@pytest.mark.parametrize("limits", [[2, 5], [2, 5, 0], [2, True, 3], "abc", 0])
def test_max_tokens_per_prompt_must_match_the_prompts(sampler: Any, limits: Any) -> None:
    with pytest.raises(ValueError, match=r"^max_tokens must be a positive integer"):
        sampler.generate(PROMPTS, max_tokens=limits)


@pytest.mark.parametrize("seed", ["a", 1.5, b"1", [1], True])
def test_a_seed_of_another_type_is_an_error_naming_seed(sampler: Any, seed: Any) -> None:
    with pytest.raises(ValueError, match=r"^seed must be an int or None"):
        sampler.generate(PROMPTS, max_tokens=2, temperature=0.5, seed=seed)


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), -1e-9, "0.5", None, True])
def test_a_temperature_that_is_not_finite_and_non_negative_is_refused(
    sampler: Any, temperature: Any
) -> None:
    with pytest.raises(ValueError, match=r"^temperature must be a finite number >= 0"):
        sampler.generate(PROMPTS, max_tokens=2, temperature=temperature)


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 9.9e-6])
def test_a_temperature_below_1e_5_is_greedy(sampler: Any, temperature: float) -> None:
    greedy = sampler.generate(PROMPTS, max_tokens=6, ignore_eos=True)
    assert (
        sampler.generate(PROMPTS, max_tokens=6, temperature=temperature, seed=1, ignore_eos=True)
        == greedy
    )


def test_a_temperature_just_above_1e_5_samples_without_error(sampler: Any) -> None:
    out = sampler.generate(PROMPTS, max_tokens=6, temperature=1.1e-5, seed=3, ignore_eos=True)
    assert [len(o) for o in out] == [6, 6, 6]


# -- numpy inputs --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint16])
def test_numpy_integer_tokens_limits_and_seeds_give_the_tokens_python_ints_give(
    sampler: Any, dtype: Any
) -> None:
    given = [[dtype(t) for t in p] for p in PROMPTS]
    greedy = sampler.generate(PROMPTS, max_tokens=5, ignore_eos=True)
    assert sampler.generate(given, max_tokens=dtype(5), ignore_eos=True) == greedy
    each = sampler.generate(given, max_tokens=[dtype(2), dtype(5), dtype(3)], ignore_eos=True)
    assert [len(o) for o in each] == [2, 5, 3]
    kwargs = {"max_tokens": 5, "temperature": 0.5, "ignore_eos": True}
    sampled = sampler.generate(PROMPTS, seed=7, **kwargs)
    assert sampler.generate(given, seed=dtype(7), **kwargs) == sampled


def test_numpy_arrays_are_prompts_as_lists_are(sampler: Any) -> None:
    rows = [np.array(p, dtype=np.int64) for p in PROMPTS]
    limits = np.array([2, 5, 3])
    assert sampler.generate(rows, max_tokens=limits, ignore_eos=True) == sampler.generate(
        PROMPTS, max_tokens=[2, 5, 3], ignore_eos=True
    )
    same_length = prompts_of([6, 6])
    assert sampler.generate(
        np.array(same_length, dtype=np.int32), max_tokens=4, ignore_eos=True
    ) == sampler.generate(same_length, max_tokens=4, ignore_eos=True)


@pytest.mark.parametrize(
    ("token", "type_name"),
    [
        (True, "bool"),
        (3.0, "float"),
        ("5", "str"),
        (None, "NoneType"),
        (np.float64(5.0), "numpy.float64"),
        (np.float32(5.0), "numpy.float32"),
        (np.bool_(True), f"numpy.{type(np.bool_(True)).__qualname__}"),
        (np.array([5]), "numpy.ndarray"),
    ],
)
def test_a_token_that_is_not_an_integer_is_refused_naming_its_type_and_place(
    sampler: Any, token: Any, type_name: str
) -> None:
    prompts = [PROMPTS[0], [4, 5, token]]
    expected = (
        f"prompt 1, position 2: token {token!r} is a {type_name}, not an integer; "
        "token ids are ints (or numpy integers) 0 .. 255"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        sampler.generate(prompts, max_tokens=2)


@pytest.mark.parametrize(
    ("token", "shown"), [(256, 256), (-1, -1), (np.int64(256), 256), (np.int32(-3), -3)]
)
def test_an_integer_outside_the_vocabulary_is_refused_naming_the_range(
    sampler: Any, token: Any, shown: int
) -> None:
    expected = f"prompt 1, position 2: token {shown} is not a token id of this model (0 .. 255)"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        sampler.generate([PROMPTS[0], [4, 5, token]], max_tokens=2)


@pytest.mark.parametrize("limit", [np.int64(0), np.float64(5.0), np.bool_(True)])
def test_a_numpy_max_tokens_that_is_not_a_positive_integer_is_refused(
    sampler: Any, limit: Any
) -> None:
    with pytest.raises(ValueError, match=r"^max_tokens must be a positive integer"):
        sampler.generate(PROMPTS, max_tokens=limit)


@pytest.mark.parametrize("seed", [np.float64(1.0), np.bool_(False)])
def test_a_numpy_seed_that_is_not_an_integer_is_refused(sampler: Any, seed: Any) -> None:
    with pytest.raises(ValueError, match=r"^seed must be an int or None, got numpy\."):
        sampler.generate(PROMPTS, max_tokens=2, temperature=0.5, seed=seed)


def test_numpy_temperatures_sample_as_python_numbers_do(sampler: Any) -> None:
    kwargs = {"max_tokens": 5, "seed": 3, "ignore_eos": True}
    assert sampler.generate(PROMPTS, temperature=np.float32(0.5), **kwargs) == sampler.generate(
        PROMPTS, temperature=0.5, **kwargs
    )
    assert sampler.generate(PROMPTS, temperature=np.int64(0), **kwargs) == sampler.generate(
        PROMPTS, temperature=0, **kwargs
    )


# -- budgets -------------------------------------------------------------------------------


@pytest.mark.parametrize("max_num_seqs", [1, 2])
def test_an_engine_whose_sequences_cannot_fill_the_token_budget_builds_and_runs(
    llama: Path, max_num_seqs: int
) -> None:
    """max_num_seqs x max_model_len < max_num_batched_tokens: the profile step is
    the largest real one, not a sequence longer than max_model_len."""
    from tiny_engine import LLM

    config = cpu_config(
        model={"max_model_len": 64},
        scheduler={"max_num_seqs": max_num_seqs, "max_num_batched_tokens": 4096},
    )
    llm = LLM(llama, config=config)
    out = llm.generate(prompts_of([10, 40, 3]), max_tokens=5, ignore_eos=True)
    assert [len(o) for o in out] == [5, 5, 5]


def test_a_compiled_engine_whose_sequences_cannot_fill_the_token_budget_builds(
    llama: Path,
) -> None:
    from tiny_engine import LLM

    config = cpu_config(
        model={"max_model_len": 32}, scheduler={"max_num_seqs": 1, "max_num_batched_tokens": 512}
    )
    del config["model"]["enforce_eager"]
    llm = LLM(llama, config=config)
    assert llm.stats["compilation_level"] == 2
    assert len(llm.generate(prompts_of([7]), max_tokens=3, ignore_eos=True)[0]) == 3


# -- malformed checkpoints -------------------------------------------------------------------


@pytest.fixture
def broken(llama: Path, tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], Path]]:
    """``broken(changes)``: a copy of the llama checkpoint with config.json changed."""

    def make(changes: dict[str, Any]) -> Path:
        target = tmp_path / f"ckpt{len(list(tmp_path.iterdir()))}"
        shutil.copytree(llama, target)
        config = json.loads((target / "config.json").read_text())
        config.pop("rope_parameters", None)
        config.update(changes)
        (target / "config.json").write_text(json.dumps(config))
        return target

    return make


MALFORMED = [
    ({"rope_scaling": [1, 2]}, "rope_scaling must be an object"),
    ({"rope_parameters": "default"}, "rope_parameters must be an object"),
    ({"rms_norm_eps": "1e-6"}, "rms_norm_eps must be a number"),
    ({"rms_norm_eps": -1}, "rms_norm_eps must be a positive finite number"),
    ({"rope_theta": "10000"}, "rope_theta must be a number"),
    (
        {"rope_scaling": {"rope_type": "llama3", "factor": "8"}},
        "rope_scaling.factor must be a number",
    ),
    ({"rope_scaling": {"rope_type": "linear"}}, "rope_scaling.factor is needed"),
    (
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8,
                "original_max_position_embeddings": "x",
            }
        },
        "rope_scaling.original_max_position_embeddings must be a positive integer",
    ),
    ({"head_dim": "16"}, "head_dim must be a positive integer"),
    ({"head_dim": 15}, "head_dim=15 must be even"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
    ({"attention_bias": 1}, "attention_bias must be true or false"),
    ({"sliding_window": "4096"}, "sliding_window must be a positive integer"),
    ({"layer_types": "full_attention"}, "layer_types must list one string per layer"),
    ({"dtype": 32}, "dtype must be a string"),
    ({"architectures": "LlamaForCausalLM"}, None),  # a bare string is read as a list of one
]


@pytest.mark.parametrize(("changes", "message"), MALFORMED)
def test_malformed_config_values_are_checkpoint_errors_naming_file_and_field(
    broken: Callable[[dict[str, Any]], Path], changes: dict[str, Any], message: str | None
) -> None:
    from tiny_engine import CheckpointError, read_checkpoint

    path = broken(changes)
    if message is None:
        assert read_checkpoint(path).architecture == "LlamaForCausalLM"
        return
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(path)
    assert str(path / "config.json") in str(info.value)
    assert message in str(info.value)


@pytest.mark.parametrize("value", [3, None, ["model.safetensors"], "../model.safetensors", ""])
def test_a_weight_map_entry_that_is_not_a_shard_name_is_a_checkpoint_error(
    llama: Path, tmp_path: Path, value: Any
) -> None:
    from tiny_engine import LLM, CheckpointError

    target = tmp_path / "sharded"
    shutil.copytree(llama, target)
    index = {"metadata": {}, "weight_map": {"lm_head.weight": value}}
    (target / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"model\.safetensors\.index\.json: weight_map\["):
        LLM(target, config=cpu_config())


def test_a_non_float_weight_is_a_checkpoint_error(llama: Path, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file
    from tiny_engine import LLM, CheckpointError

    target = tmp_path / "ints"
    shutil.copytree(llama, target)
    tensors = load_file(target / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"].to(torch.int64)
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"'model\.norm\.weight' is torch\.int64"):
        LLM(target, config=cpu_config())


def test_a_tensor_whose_shape_contradicts_config_json_names_the_shard(
    llama: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file
    from tiny_engine import LLM, CheckpointError

    target = tmp_path / "narrow"
    shutil.copytree(llama, target)
    tensors = load_file(target / "model.safetensors")
    weight = tensors["model.layers.0.mlp.down_proj.weight"]
    tensors["model.layers.0.mlp.down_proj.weight"] = weight[:, :-1].contiguous()
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as info:
        LLM(target, config=cpu_config())
    message = str(info.value)
    assert str(target / "model.safetensors") in message
    assert "'model.layers.0.mlp.down_proj.weight' has shape" in message
    assert "config.json implies" in message


@pytest.mark.parametrize(("changes", "message"), MALFORMED[:4])
def test_the_cli_turns_a_malformed_config_into_one_line_and_status_2(
    broken: Callable[[dict[str, Any]], Path],
    changes: dict[str, Any],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tiny_engine.cli import main

    path = broken(changes)
    assert main(["--model", str(path), "--max-tokens", "2", "--prompt-ids", "[[3,4]]"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert message in err and "Traceback" not in err


# -- the command line ------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["1x3000000000", "2x256", "999999999999x4"])
def test_random_prompts_are_checked_before_they_are_made(
    llama: Path, spec: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tiny_engine.cli import main

    args = ["--model", str(llama), "--set", "model.dtype=float32", "--set"]
    args += ["model.enforce_eager=true", "--max-tokens", "2", "--random-prompts", spec]
    start = time.perf_counter()
    assert main(args) == 2
    assert time.perf_counter() - start < 60
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--random-prompts" in err
    assert "max_model_len" in err or "at most" in err
