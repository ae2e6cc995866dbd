"""``python -m tiny_engine`` and ``python -m tiny_engine.make_checkpoint``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.conftest import ENGINE_SRC

pytest.importorskip("transformers")


def run(*args: str, module: str = "tiny_engine") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ENGINE_SRC), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


FAST = ["--set", "model.dtype=float32", "--set", "model.enforce_eager=true"]
FAST += ["--set", "cache.kv_cache_memory_bytes=8388608"]


def test_generates_json_with_outputs_and_stats(llama: Path) -> None:
    result = run(
        "--model",
        str(llama),
        *FAST,
        "--max-tokens",
        "3",
        "--random-prompts",
        "2x5",
        "--ignore-eos",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert [len(o) for o in out["outputs"]] == [3, 3]
    stats = out["stats"]
    assert stats["platform"] == "cpu" and stats["generated_tokens"] == 6
    for key in (
        "attention_backend",
        "cudagraph_mode",
        "block_size",
        "cache_dtype",
        "num_blocks",
        "prefix_cache_hits",
        "preemptions",
        "prompt_tokens",
    ):
        assert key in stats


def test_prompt_ids_give_the_library_tokens(llama: Path) -> None:
    from tiny_engine import LLM

    from tests.engine.conftest import cpu_config

    result = run(
        "--model",
        str(llama),
        *FAST,
        "--max-tokens",
        "4",
        "--prompt-ids",
        "[[5, 6, 7], [8]]",
        "--ignore-eos",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    expected = LLM(llama, config=cpu_config()).generate(
        [[5, 6, 7], [8]], max_tokens=4, ignore_eos=True
    )
    assert json.loads(result.stdout)["outputs"] == expected


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompt-ids", "[[]]"], "prompt 0 is empty"),
        (["--prompt-ids", "[[1, 2, 999]]"], "not a token id"),
        (["--prompt-ids", "not json"], "not valid JSON"),
        (["--random-prompts", "2x300"], "max_model_len=256"),
        (["--random-prompts", "2by3"], "COUNTxLEN"),
        (["--random-prompts", "1x3", "--set", "cache.block_size=17"], "cache.block_size"),
        (["--random-prompts", "1x3", "--set", "nonsense"], "section.field=value"),
        (["--random-prompts", "1x3", "--set", "model.num_layers=5"], "contradicts"),
        (["--random-prompts", "1x3", "--platform", "nosuch"], "nosuch"),
        (["--random-prompts", "1x3", "--set", "attention.backend=triton"], "triton"),
        (["--random-prompts", "1x3", "--max-tokens", "0"], "--max-tokens"),
    ],
)
def test_bad_input_is_status_2_with_one_line(
    llama: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tiny_engine.cli import main

    assert main(["--model", str(llama), *FAST, "--max-tokens", "2", *args]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert message in lines[0]


def test_bad_input_in_a_real_process_is_one_line(llama: Path) -> None:
    result = run("--model", str(llama), *FAST, "--max-tokens", "2", "--prompt-ids", "[[]]")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: prompt 0 is empty; every prompt needs at least one token"
    ]


def test_missing_or_unsupported_checkpoints_are_status_2(tmp_path: Path) -> None:
    missing = run("--model", str(tmp_path / "none"), "--max-tokens", "2", "--random-prompts", "1x2")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    odd = run("--model", str(tmp_path), "--max-tokens", "2", "--random-prompts", "1x2")
    assert odd.returncode == 2 and "unsupported architecture" in odd.stderr
    assert len(odd.stderr.strip().splitlines()) == 1


def test_make_checkpoint_writes_a_sharded_checkpoint(tmp_path: Path) -> None:
    result = run(
        str(tmp_path / "ck"),
        "--arch",
        "qwen3",
        "--layers",
        "1",
        "--hidden",
        "32",
        "--heads",
        "2",
        "--kv-heads",
        "1",
        "--vocab",
        "64",
        "--shard-size",
        "10KB",
        module="tiny_engine.make_checkpoint",
    )
    assert result.returncode == 0, result.stderr
    files = {p.name for p in (tmp_path / "ck").iterdir()}
    assert {"config.json", "model.safetensors.index.json"} <= files
    assert json.loads((tmp_path / "ck" / "config.json").read_text())["architectures"] == [
        "Qwen3ForCausalLM"
    ]


def test_start_up_phases_are_logged_for_the_status_line(
    llama: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from tiny_engine import LLM

    from tests.engine.conftest import cpu_config

    with caplog.at_level(logging.INFO, logger="tiny_engine"):
        LLM(llama, config=cpu_config()).close()
    messages = [r.getMessage() for r in caplog.records if r.name == "tiny_engine"]
    assert any(m.startswith("starting 1 rank (uni executor)") for m in messages)
    assert any(m.startswith("loading ") for m in messages)
    # the CPU's KV budget is a dedicated space: no profile run of the largest step
    assert not any("profiling" in m for m in messages)
    assert any(m.startswith("allocating") for m in messages)
    assert any(m.startswith("ready in") for m in messages)


def test_piped_output_has_no_status_line(llama: Path) -> None:
    result = run("--model", str(llama), "--max-tokens", "2", "--random-prompts", "1x3", "--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
