"""Prefix caching, chunked prefill and preemption change no token; counters say they ran."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.conftest import cpu_config, prompts_of

pytest.importorskip("transformers")

MAX_TOKENS = 10


@pytest.fixture(scope="module")
def baseline(llama: Path) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts (two share a 40-token prefix) and their tokens without any of the features."""
    from tiny_engine import LLM

    shared = prompts_of([40], seed=1)[0]
    prompts = [shared + p for p in prompts_of([5, 9], seed=2)] + prompts_of([23, 3, 33], seed=3)
    llm = LLM(
        llama,
        config=cpu_config(
            cache={"enable_prefix_caching": False},
            scheduler={"enable_chunked_prefill": False, "max_num_batched_tokens": 256},
        ),
    )
    return prompts, llm.generate(prompts, max_tokens=MAX_TOKENS, ignore_eos=True)


def test_prefix_caching_reuses_blocks_and_changes_no_token(
    llama: Path, baseline: tuple[list[list[int]], list[list[int]]]
) -> None:
    from tiny_engine import LLM

    prompts, expected = baseline
    llm = LLM(llama, config=cpu_config(cache={"enable_prefix_caching": True}))
    assert llm.generate(prompts[:1], max_tokens=MAX_TOKENS, ignore_eos=True) == expected[:1]
    assert llm.stats["prefix_cache_hits"] == 0
    # The finished prompt's full blocks stay cached for the next call.
    assert llm.generate(prompts, max_tokens=MAX_TOKENS, ignore_eos=True) == expected
    hits = llm.stats["prefix_cache_hits"]
    assert hits >= 2 * (
        40 // llm.stats["block_size"]
    )  # the first prompt again, the second's prefix
    assert llm.generate(prompts, max_tokens=MAX_TOKENS, ignore_eos=True) == expected
    assert llm.stats["prefix_cache_hits"] > hits  # cumulative


@pytest.mark.parametrize("budget", [8, 20])
def test_chunked_prefill_with_small_budgets_changes_no_token(
    llama: Path, baseline: tuple[list[list[int]], list[list[int]]], budget: int
) -> None:
    from tiny_engine import LLM

    prompts, expected = baseline
    config = cpu_config(
        cache={"enable_prefix_caching": False},
        scheduler={
            "enable_chunked_prefill": True,
            "max_num_batched_tokens": budget,
            "max_num_seqs": 4,
        },
    )
    llm = LLM(llama, config=config)
    assert llm.generate(prompts, max_tokens=MAX_TOKENS, ignore_eos=True) == expected
    assert llm.stats["steps"] >= sum(len(p) for p in prompts) // budget


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_preemption_recomputes_and_changes_no_token(
    llama: Path, baseline: tuple[list[list[int]], list[list[int]]], prefix_caching: bool
) -> None:
    from tiny_engine import LLM

    prompts, expected = baseline
    # 5 blocks of 16 tokens: one 64-token sequence fits, two growing ones do not.
    config = cpu_config(
        model={"max_model_len": 64},
        cache={"num_gpu_blocks_override": 5, "enable_prefix_caching": prefix_caching},
        scheduler={"max_num_batched_tokens": 64, "max_num_seqs": 8},
    )
    llm = LLM(llama, config=config)
    assert llm.stats["num_blocks"] == 5
    assert llm.generate(prompts, max_tokens=MAX_TOKENS, ignore_eos=True) == expected
    assert llm.stats["preemptions"] > 0


def test_seeded_sampling_is_deterministic_per_seed(llama: Path) -> None:
    from tiny_engine import LLM

    llm = LLM(llama, config=cpu_config())
    prompts = prompts_of([4, 12, 7])
    first = llm.generate(prompts, max_tokens=12, temperature=0.8, seed=7, ignore_eos=True)
    again = llm.generate(prompts, max_tokens=12, temperature=0.8, seed=7, ignore_eos=True)
    other = llm.generate(prompts, max_tokens=12, temperature=0.8, seed=8, ignore_eos=True)
    swapped = [prompts[0], prompts_of([30], seed=5)[0], prompts[2]]
    mixed = llm.generate(swapped, max_tokens=12, temperature=0.8, seed=7, ignore_eos=True)
    assert first == again
    assert first != other
    assert first != llm.generate(prompts, max_tokens=12, ignore_eos=True)  # not greedy
    # Each prompt has its own generator (seed, position): its neighbours do not matter.
    assert (mixed[0], mixed[2]) == (first[0], first[2])


def test_max_model_len_bounds_every_sequence(llama: Path) -> None:
    from tiny_engine import LLM

    llm = LLM(llama, config=cpu_config(model={"max_model_len": 32}))
    out = llm.generate(prompts_of([20, 30]), max_tokens=50, ignore_eos=True)
    assert [len(o) for o in out] == [12, 2]
