"""tiny_engine decoding on the CPU platform's host step graphs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tiny_engine import LLM

from hwplug.kernels import op_door
from hwplug.platforms.cpu import STEP_GRAPHS_ENV
from tests.engine.conftest import prompts_of

pytest.importorskip("transformers")


@pytest.mark.parametrize("background", ["0", "1"])
def test_the_engine_decodes_on_step_graphs_with_eager_tokens(
    llama: Path, background: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = prompts_of([5, 17, 9])
    base = {"model": {"dtype": "float32"}, "cache": {"kv_cache_memory_bytes": 8 << 20}}
    eager_config = {**base, "model": {"dtype": "float32", "enforce_eager": True}}
    with LLM(llama, config=eager_config, platform="cpu") as eager:
        expected = eager.generate(prompts, max_tokens=6, ignore_eos=True)
    monkeypatch.setenv(STEP_GRAPHS_ENV, "1")
    monkeypatch.setenv("HWPLUG_BACKGROUND_COMPILE", background)
    config = {**base, "compilation": {"compile_sizes": [2, 1]}}
    with LLM(llama, config=config, platform="cpu") as llm:
        assert llm.wait_compiled(timeout=600)
        assert llm.stats["step_graphs"] == [1, 2]
        backend = llm.runner.step_graph.backend
        calls: list[int] = []
        original = backend.call

        def counting(graph: Any, args: Any, kwargs: Any) -> Any:
            calls.append(graph.key.num_tokens)
            return original(graph, args, kwargs)

        monkeypatch.setattr(backend, "call", counting)
        door = op_door.bound_attention_door()
        before = door.counts()["served"] if door is not None else 0
        got = llm.generate(prompts, max_tokens=6, ignore_eos=True)
        single = llm.generate(prompts[:1], max_tokens=6, ignore_eos=True)
        served = (door.counts()["served"] if door is not None else 0) - before
    assert got == expected and single == expected[:1]
    if op_door.active():
        # the decode steps' attention ran from the attention ops' C++ door (the first call
        # of each layer in the process was checked in Python, at warm-up)
        assert door is not None and served > 0
    # three sequences decode as one batch of 3 (no graph: above 2), the single one on size 1
    assert calls and set(calls) == {1}
