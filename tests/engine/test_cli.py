"""``python -m tiny_engine`` and ``python -m tiny_engine.make_checkpoint``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
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
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tiny_engine"):
        LLM(llama, config={"model": {"dtype": "float32"}}).close()  # the CPU's level 2
    messages = [r.getMessage() for r in caplog.records if r.name == "tiny_engine"]
    assert "compiling the model (level 2) in the background" in messages


def test_piped_output_has_no_status_line(llama: Path) -> None:
    result = run("--model", str(llama), "--max-tokens", "2", "--random-prompts", "1x3", "--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


CHECK_EARLY = """
import json, sys
from tiny_engine.cli import main

status = main(json.loads(sys.argv[1]))
print(json.dumps({"status": status, "torch": "torch" in sys.modules}))
"""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompt-ids", "[[9999]]"], "token 9999 is not a token id of this model (0 .. 255)"),
        (["--prompt-ids", json.dumps([list(range(1, 200)) * 2])], "model.max_model_len=256"),
        (["--prompt-ids", "[[1, 2]]", "--max-tokens", "0"], "--max-tokens"),
        (["--random-prompts", "2x300"], "max_model_len=256"),
        (["--prompt-ids", "[[1, 2, 3, 4]]", "--set", "model.max_model_len=4"], "at most 3"),
        (["--prompt-ids", "[[1]]", "--set", "cache.block_size=17"], "cache.block_size"),
        (["--prompt-ids", "[[1]]", "--set", "model.num_layers=5"], "contradicts"),
        (["--prompt-ids", "[[1]]", "--platform", "nosuch"], "nosuch"),
        (["--prompt-ids", "[[1]]", "--temperature", "-1"], "temperature"),
    ],
)
def test_what_the_checkpoint_config_can_tell_is_checked_before_torch_loads(
    llama: Path, args: list[str], message: str
) -> None:
    # these were refused only once the model had loaded, 7-12 s later
    argv = ["--model", str(llama), "--max-tokens", "2", *args]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ENGINE_SRC), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", CHECK_EARLY, json.dumps(argv)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert json.loads(result.stdout) == {"status": 2, "torch": False}, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


@pytest.mark.parametrize(
    "code",
    [
        "from tiny_engine.cli import main; main(['--help'])",
        "from tiny_engine.make_checkpoint import main; main(['--help'])",
    ],
)
def test_help_imports_no_torch(code: str) -> None:
    # `--help` took 5 s: the package imported the engine, and the engine torch
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ENGINE_SRC), env.get("PYTHONPATH")]))
    script = f"import sys\ntry:\n    {code}\nexcept SystemExit:\n    pass\n"
    script += "print('torch' in sys.modules, 'transformers' in sys.modules, file=sys.stderr)"
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout
    assert result.stderr.strip() == "False False"


def test_a_closed_output_pipe_ends_the_command_quietly_with_status_141(llama: Path) -> None:
    # `... | head -1` printed "error: [Errno 32] Broken pipe" and exited 2
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line is written
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ENGINE_SRC), env.get("PYTHONPATH")]))
    args = ["--model", str(llama), *FAST, "--max-tokens", "2", "--random-prompts", "2x3"]
    try:
        result = subprocess.run(
            [sys.executable, "-m", "tiny_engine", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )
    finally:
        os.close(write_end)
    assert result.returncode == 141, result.stderr
    assert result.stderr == ""


def test_a_triton_backend_on_cpu_tensors_without_the_interpreter_is_a_usage_error(
    make_ckpt: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # it said so, but as "error: ..." with status 1 once the model had loaded
    pytest.importorskip("triton")
    small = make_ckpt("small-h32", arch="llama", layers=1, heads=2, kv_heads=1)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    result = run(
        "--model",
        str(small),
        "--platform",
        "h100",
        "--device",
        "cpu",
        "--set",
        "model.dtype=float32",
        "--max-tokens",
        "2",
        "--random-prompts",
        "1x3",
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "TRITON_INTERPRET=1" in lines[0], result.stderr


def _on_a_terminal(args: list[str]) -> tuple[int, str, str]:
    """Run the command with stderr on a pseudo-terminal: status, stdout, what the
    terminal showed."""
    import pty

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ENGINE_SRC), env.get("PYTHONPATH")]))
    env.pop("RANK", None)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tiny_engine", *args],
        stdout=subprocess.PIPE,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    shown = bytearray()
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the terminal's other end closed
            break
        if not data:
            break
        shown += data
    os.close(master)
    assert proc.stdout is not None
    out = proc.stdout.read().decode()
    return proc.wait(timeout=300), out, shown.decode(errors="replace")


def test_a_terminal_shows_each_start_up_phase_with_graph_counts(llama: Path) -> None:
    # a simulated H100's run printed nothing for 28 s (67 graphs captured)
    args = ["--model", str(llama), "--platform", "h100", "--device", "cpu"]
    args += ["--set", "model.dtype=float32", "--set", "compilation.use_inductor=false"]
    args += ["--set", "scheduler.max_num_seqs=2", "--set", "scheduler.cuda_graph_sizes=[2]"]
    args += ["--set", "model.max_model_len=64", "--set", "cache.num_gpu_blocks_override=16"]
    status, out, shown = _on_a_terminal([*args, "--max-tokens", "2", "--prompt-ids", "[[5]]"])
    assert status == 0, shown
    assert out.startswith("prompt 0 (1 tokens) -> ")
    for phase in (
        "importing torch",
        "starting 1 rank (uni executor)",
        "loading ",
        "allocating ",
        "compiling the model (level 3) and warming it up",
        "capturing 2 graphs (2 PIECEWISE)",
        "capturing graph 1 of 2 (PIECEWISE, 2 tokens)",
        "capturing graph 2 of 2 (PIECEWISE, 1 tokens)",
        "ready in ",
    ):
        assert phase in shown, phase
    status, out, shown = _on_a_terminal(
        [*args, "--max-tokens", "2", "--prompt-ids", "[[5]]", "--json"]
    )
    assert status == 0 and json.loads(out)["outputs"]
    assert shown == "", "--json: nothing but the JSON"
