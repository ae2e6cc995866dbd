"""benchmarks/bench_peers.py's pure parts: workloads, figures, variants, the GGUF layout.

No peer venv is needed; the GGUF round trip needs the ``gguf`` package (not one of
hwplug's dependencies) and is skipped without it."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_peers.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_peers", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_peers"] = module
    spec.loader.exec_module(module)
    return module


bp = _load()

TINY = {"layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "intermediate": 48, "vocab": 64}


# bench_peers.MODELS' keys -> LlamaConfig's
CONFIG_KEYS = {
    "layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "intermediate": "intermediate_size",
    "vocab": "vocab_size",
}


def _config(spec: dict[str, int]) -> transformers.LlamaConfig:
    kwargs = {CONFIG_KEYS[key]: value for key, value in spec.items()}
    return transformers.LlamaConfig(tie_word_embeddings=False, **kwargs)


# -- workloads ---------------------------------------------------------------------------------
def test_single_is_one_prompt_of_128_tokens_and_128_new() -> None:
    w = bp.workload("single", 8192, 0)
    assert [len(p) for p in w["prompts"]] == [128]
    assert w["max_tokens"] == [128]
    assert all(3 <= t < 8192 for t in w["prompts"][0])


def test_a_scaled_single_stays_one_prompt_and_the_others_keep_their_counts() -> None:
    single = bp.workload("single", 8192, 0, scale=0.25)
    assert [len(p) for p in single["prompts"]] == [32] and single["max_tokens"] == [32]
    fixed = bp.workload("fixed", 8192, 0, scale=0.25)
    assert [len(p) for p in fixed["prompts"]] == [32] * 4 and fixed["max_tokens"] == [32] * 4
    assert len(bp.workload("mix", 8192, 0, scale=0.01)["prompts"]) == 2


def test_variants_of_a_workload_have_its_shapes_not_its_tokens() -> None:
    timed, other = bp.workload("single", 8192, 0), bp.workload("single", 8192, 1)
    assert [len(p) for p in other["prompts"]] == [128] and other["prompts"] != timed["prompts"]


def test_single_is_a_default_workload_and_unknown_ones_are_refused() -> None:
    assert bp.WORKLOADS == ("fixed", "mix", "single")
    with pytest.raises(ValueError, match="single"):
        bp.workload("burst", 8192, 0)
    with pytest.raises(SystemExit):
        bp.main(["--workloads", "burst", "--engines", "transformers"])


# -- figures -----------------------------------------------------------------------------------
def test_decode_latency_is_the_decode_time_over_the_largest_count_less_one() -> None:
    assert bp.decode_ms_per_token(10.0, 2.0, [128]) == pytest.approx(8000 / 127)
    assert bp.decode_ms_per_token(5.0, 1.0, [16, 81, 40]) == pytest.approx(4000 / 80)
    assert bp.decode_ms_per_token(1.0, 0.5, [1, 1]) is None
    assert bp.decode_ms_per_token(1.0, 1.2, [32]) is None  # a prefill run slower than the run


@pytest.mark.parametrize("spec", [TINY, bp.MODELS["bench"], bp.MODELS["llama250m"]])
def test_the_parameter_count_is_the_checkpoint_s(spec: dict[str, int]) -> None:
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(_config(spec))
    assert bp.param_count(spec) == sum(p.numel() for p in model.parameters())


def test_a_decode_step_streams_every_weight_but_the_unread_embedding_rows() -> None:
    spec = bp.MODELS["bench"]
    rows = (spec["vocab"] - 1) * spec["hidden"]
    assert bp.weight_bytes_per_token(spec, "fp32") == (bp.param_count(spec) - rows) * 4
    assert bp.weight_bytes_per_token(spec, "bf16") == (bp.param_count(spec) - rows) * 2
    # bench: 4 layers of 2.95M weights, a 4.19M embedding and as large a head; one row read
    assert bp.param_count(spec) == 20_189_696
    assert bp.weight_bytes_per_token(spec, "fp32") == 4 * (20_189_696 - 8191 * 512)


def test_the_stream_read_is_a_positive_rate_and_leaves_torch_s_threads() -> None:
    threads = torch.get_num_threads()
    assert bp.stream_read_gb_per_s(1, size=8 << 20, repeats=2) > 0
    assert torch.get_num_threads() == threads


# -- variants and ratios -------------------------------------------------------------------
def test_the_faster_variant_is_kept() -> None:
    assert bp.best_variant({"vllm": 10.0, "vllm-guide": 12.5}) == "vllm-guide"
    assert bp.best_variant({"llamacpp": 30.0, "llamacpp-fa": 20.0}) == "llamacpp"
    assert bp.best_variant({"llamacpp": 20.0, "llamacpp-fa": 20.0}) == "llamacpp"
    assert bp.best_variant({}) is None


def test_tiny_engine_s_ratios_are_to_transformers_and_each_peer_s_best_variant() -> None:
    e2e = {
        "transformers": 100.0,
        "tiny_engine": 200.0,
        "vllm": 80.0,
        "vllm-guide": 160.0,
        "llamacpp": 250.0,
        "llamacpp-fa": 125.0,
    }
    assert bp.variant_report(e2e) == {
        "vllm": {"best": "vllm-guide", "e2e_tokens_per_s": {"vllm": 80.0, "vllm-guide": 160.0}},
        "llamacpp": {
            "best": "llamacpp",
            "e2e_tokens_per_s": {"llamacpp": 250.0, "llamacpp-fa": 125.0},
        },
    }
    assert bp.tiny_engine_ratios(e2e) == {
        "transformers": 2.0,
        "vllm": 1.25,
        "vllm_variant": "vllm-guide",
        "llamacpp": 0.8,
        "llamacpp_variant": "llamacpp",
    }
    # a skipped variant: the other one is the best; a peer that did not run: no ratio
    assert bp.tiny_engine_ratios({"tiny_engine": 200.0, "vllm": 80.0}) == {
        "vllm": 2.5,
        "vllm_variant": "vllm",
    }
    assert bp.tiny_engine_ratios({"transformers": 1.0, "vllm": 2.0}) == {}


def test_each_variant_runs_in_its_peer_s_venv() -> None:
    for engines in bp.VARIANTS.values():
        assert all(engine in bp.ENGINES and engine in bp.WORKERS for engine in engines)
        assert len({bp.VENVS[engine] for engine in engines}) == 1
    peers = Path("/peers")
    assert bp.engine_python("llamacpp-fa", peers) == peers / "llamacpp" / "bin" / "python"
    assert bp.engine_python("vllm-guide", peers) == peers / "vllm" / "bin" / "python"
    assert bp.engine_python("tiny_engine", peers) == Path(sys.executable)


def test_cpu_lists_are_ranges() -> None:
    assert bp.cpu_list([1, 0]) == "0-1"
    assert bp.cpu_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert bp.cpu_list([3]) == "3"


def test_the_guide_s_environment_binds_the_cores_and_preloads_intel_s_openmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bp, "TCMALLOC_DIRS", (str(tmp_path / "none"),))
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    cores = sorted(os.sched_getaffinity(0))
    assert bp.guide_env(tmp_path, None) == {"VLLM_CPU_OMP_THREADS_BIND": bp.cpu_list(cores)}
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    env = bp.guide_env(tmp_path, 1)
    assert env == {
        "VLLM_CPU_OMP_THREADS_BIND": str(cores[0]),
        "LD_PRELOAD": str(tmp_path / "lib" / "libiomp5.so"),
    }
    tc = tmp_path / "tc"
    tc.mkdir()
    (tc / "libtcmalloc_minimal.so.4").write_bytes(b"")
    monkeypatch.setattr(bp, "TCMALLOC_DIRS", (str(tc),))
    monkeypatch.setenv("LD_PRELOAD", "/x/liby.so")
    assert bp.guide_env(tmp_path, None)["LD_PRELOAD"] == ":".join(
        [str(tc / "libtcmalloc_minimal.so.4"), str(tmp_path / "lib" / "libiomp5.so"), "/x/liby.so"]
    )


# -- the GGUF layout -----------------------------------------------------------------------
@pytest.mark.parametrize("heads", [1, 2, 4])
def test_permuting_q_or_k_and_back_is_the_identity(heads: int) -> None:
    weight = torch.randn(heads * 8, 12)
    permuted = bp.permute_qk(weight, heads)
    assert not torch.equal(permuted, weight)
    assert torch.equal(bp.unpermute_qk(permuted, heads), weight)
    assert torch.equal(bp.permute_qk(bp.unpermute_qk(weight, heads), heads), weight)
    # numpy (the converter's arrays) alike
    assert (bp.permute_qk(weight.numpy(), heads) == permuted.numpy()).all()


def test_a_head_s_halves_become_adjacent_pairs() -> None:
    rows = torch.arange(8).repeat(2)  # two heads of 8 rows: 0..7, 0..7
    assert bp.permute_qk(rows, 2).tolist() == [0, 4, 1, 5, 2, 6, 3, 7] * 2


def _rope_hf(x: torch.Tensor, heads: int, pos: int, theta: float = 10000.0) -> torch.Tensor:
    """transformers' rotary embedding (rotate_half) of one position's q or k."""
    x = x.view(heads, -1)
    half = x.shape[1] // 2
    angle = pos / theta ** (torch.arange(half, dtype=torch.float64) * 2 / x.shape[1])
    cos, sin = torch.cat([angle.cos()] * 2), torch.cat([angle.sin()] * 2)
    rotated = torch.cat([-x[:, half:], x[:, :half]], dim=1)
    return (x * cos + rotated * sin).reshape(-1)


def _rope_llamacpp(x: torch.Tensor, heads: int, pos: int, theta: float = 10000.0) -> torch.Tensor:
    """llama.cpp's ``llama`` rope (LLAMA_ROPE_TYPE_NORM): adjacent pairs rotated."""
    x = x.view(heads, -1, 2)
    angle = pos / theta ** (torch.arange(x.shape[1], dtype=torch.float64) * 2 / (2 * x.shape[1]))
    cos, sin = angle.cos(), angle.sin()
    a, b = x[..., 0], x[..., 1]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).reshape(-1)


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (2, 2)])
def test_permuted_q_and_k_under_llamacpp_s_rope_give_transformers_attention_scores(
    heads: int, kv_heads: int
) -> None:
    torch.manual_seed(0)
    head_dim, hidden = 16, 24
    wq = torch.randn(heads * head_dim, hidden, dtype=torch.float64)
    wk = torch.randn(kv_heads * head_dim, hidden, dtype=torch.float64)
    config = {"num_attention_heads": heads, "num_key_value_heads": kv_heads}
    gq = bp.gguf_tensor("model.layers.0.self_attn.q_proj.weight", wq, config)
    gk = bp.gguf_tensor("model.layers.0.self_attn.k_proj.weight", wk, config)
    x, y = torch.randn(hidden, dtype=torch.float64), torch.randn(hidden, dtype=torch.float64)
    for pq, pk in ((5, 2), (17, 17), (300, 0)):
        hf_q, hf_k = _rope_hf(wq @ x, heads, pq), _rope_hf(wk @ y, kv_heads, pk)
        ll_q, ll_k = _rope_llamacpp(gq @ x, heads, pq), _rope_llamacpp(gk @ y, kv_heads, pk)
        # the rotated vectors themselves are the permuted ones ...
        assert torch.allclose(ll_q, bp.permute_qk(hf_q, heads))
        assert torch.allclose(ll_k, bp.permute_qk(hf_k, kv_heads))
        # ... so every query head's score against its key/value head is transformers'
        group = heads // kv_heads
        for h in range(heads):
            kv = h // group
            hf = hf_q.view(heads, -1)[h] @ hf_k.view(kv_heads, -1)[kv]
            ll = ll_q.view(heads, -1)[h] @ ll_k.view(kv_heads, -1)[kv]
            assert torch.allclose(hf, ll)
    # without the permutation the scores differ: it is needed
    plain = _rope_llamacpp(wq @ x, heads, 5) @ _rope_llamacpp(wq @ x, heads, 2)
    assert not torch.allclose(plain, _rope_hf(wq @ x, heads, 5) @ _rope_hf(wq @ x, heads, 2))


def test_the_name_map_covers_every_tensor_of_a_tiny_checkpoint() -> None:
    model = transformers.LlamaForCausalLM(_config(TINY))
    names = {name: bp.gguf_tensor_name(name) for name in model.state_dict()}
    expected = {"token_embd.weight", "output_norm.weight", "output.weight"}
    for i in range(TINY["layers"]):
        for part in (
            "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
            "ffn_norm", "ffn_gate", "ffn_up", "ffn_down",
        ):  # fmt: skip
            expected.add(f"blk.{i}.{part}.weight")
    assert set(names.values()) == expected and len(names) == len(expected)
    config = json.loads(model.config.to_json_string())
    for name, weight in model.state_dict().items():
        out = bp.gguf_tensor(name, weight, config)
        assert out.shape == weight.shape
        assert torch.equal(out, weight) == ("q_proj" not in name and "k_proj" not in name)
    with pytest.raises(ValueError, match="no GGUF name"):
        bp.gguf_tensor_name("model.layers.0.self_attn.q_norm.weight")


def test_the_rope_base_is_read_from_either_place_and_scaled_ropes_refused() -> None:
    assert bp.rope_theta({"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}}) == (
        500000.0
    )
    assert bp.rope_theta({"rope_theta": 20000}) == 20000.0
    assert bp.rope_theta({}) == 10000.0
    with pytest.raises(ValueError, match="llama3"):
        bp.rope_theta({"rope_parameters": {"rope_theta": 5e5, "rope_type": "llama3"}})


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_gguf_file_has_llama_s_keys_and_permuted_tensors(tmp_path: Path, dtype: str) -> None:
    gguf = pytest.importorskip(
        "gguf", reason="the gguf package is only in the llamacpp venv (make bench-peers)"
    )
    pytest.importorskip("safetensors")
    import numpy as np

    model = transformers.LlamaForCausalLM(_config(TINY))
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    out = tmp_path / "model.gguf"
    bp.write_gguf(tmp_path / "hf", out, dtype)
    reader = gguf.GGUFReader(out)
    fields = {name: field.contents() for name, field in reader.fields.items()}
    assert fields["general.architecture"] == "llama"
    assert fields["tokenizer.ggml.model"] == "none"
    assert fields["llama.vocab_size"] == TINY["vocab"]
    assert fields["llama.attention.head_count_kv"] == TINY["kv_heads"]
    assert fields["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == len(model.state_dict())
    q = tensors["blk.0.attn_q.weight"]
    data = np.asarray(q.data)
    if dtype == "bf16":
        assert q.tensor_type == gguf.GGMLQuantizationType.BF16
        data = gguf.quants.dequantize(data, q.tensor_type)
    want = bp.permute_qk(model.state_dict()["model.layers.0.self_attn.q_proj.weight"], 4)
    if dtype == "bf16":
        want = want.to(torch.bfloat16).float()
    assert np.array_equal(data.reshape(want.shape), want.numpy())
    assert tensors["output_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32


# -- the driver's report -------------------------------------------------------------------
def test_the_report_has_latency_bandwidth_variants_and_tiny_engine_s_ratios(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    speed = {"transformers": 100.0, "tiny_engine": 200.0, "vllm": 50.0, "vllm-guide": 80.0}
    speed |= {"llamacpp": 250.0, "llamacpp-fa": 160.0}

    def fake_spawn(engine, python, args, hf, model, extra):
        workloads = {}
        for name in args.workloads:
            w = bp.workload(name, bp.MODELS[model]["vocab"], 0, args.scale)
            tokens = sum(w["max_tokens"])
            e2e = tokens / speed[engine]
            workloads[name] = {
                "e2e_seconds": e2e,
                "prefill_seconds": e2e / 4,
                "e2e_tokens_per_s": speed[engine],
                "decode_tokens_per_s": 2 * speed[engine],
                "decode_ms_per_token": bp.decode_ms_per_token(e2e, e2e / 4, w["max_tokens"]),
                "outputs": [[1] * n for n in w["max_tokens"]],
            }
        stats = {"startup_seconds": 1.0, "load_seconds": 0.5, "full_speed_seconds": 1.0}
        return {"info": {}, "peak_rss_mib": 100.0, "workloads": workloads, **stats}

    def fake_prepare(engine, python, hf, dtype):
        return ({}, "not installed") if engine == "ctranslate2" else ({}, None)

    monkeypatch.setattr(bp, "spawn", fake_spawn)
    monkeypatch.setattr(bp, "prepare", fake_prepare)
    monkeypatch.setattr(bp, "ensure_checkpoint", lambda cache, model: tmp_path)
    monkeypatch.setattr(bp, "stream_read_gb_per_s", lambda threads: 12.5)
    out = tmp_path / "peers.json"
    assert bp.main(["--models", "bench", "--rounds", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["stream_read_gb_per_s"] == 12.5
    result = report["models"]["bench"]
    assert result["engines"]["ctranslate2"] == {"skipped": "not installed"}
    single = result["engines"]["llamacpp"]["workloads"]["single"]
    weights = bp.weight_bytes_per_token(bp.MODELS["bench"], "fp32")
    assert single["weight_bytes_per_token"] == weights
    assert single["weights_gb_per_s"]["median"] == round(500.0 * weights / 1e9, 2)
    assert single["decode_ms_per_token"]["median"] == pytest.approx(128 / 250 * 0.75 / 127 * 1000)
    assert single["identical_to_transformers"] == 1.0
    assert "weights_gb_per_s" not in result["engines"]["llamacpp"]["workloads"]["fixed"]
    for name in bp.WORKLOADS:
        assert result["variants"][name]["vllm"]["best"] == "vllm-guide"
        assert result["variants"][name]["llamacpp"]["e2e_tokens_per_s"] == {
            "llamacpp": 250.0,
            "llamacpp-fa": 160.0,
        }
        assert result["tiny_engine_ratio"][name] == {
            "transformers": 2.0,
            "vllm": 2.5,
            "vllm_variant": "vllm-guide",
            "llamacpp": 0.8,
            "llamacpp_variant": "llamacpp",
        }
        assert result["ratio"][name]["tiny_engine"] == 2.0


def test_a_peer_whose_install_failed_or_is_missing_is_skipped_with_the_reason(
    tmp_path: Path,
) -> None:
    python = bp.engine_python("llamacpp", tmp_path)
    _, reason = bp.prepare("llamacpp", python, tmp_path / "hf", "fp32")
    assert reason == f"no venv at {tmp_path / 'llamacpp'} (make bench-peers creates it)"
    (tmp_path / "llamacpp").mkdir()
    (tmp_path / "llamacpp" / "SKIPPED").write_text("pip install llama-cpp-python failed: x\n")
    for engine in ("llamacpp", "llamacpp-fa"):
        python = bp.engine_python(engine, tmp_path)
        assert bp.prepare(engine, python, tmp_path / "hf", "bf16") == (
            {},
            "pip install llama-cpp-python failed: x",
        )


@pytest.mark.parametrize("rows", [1, 16])
def test_bench_linear_row_reports_each_path_beside_the_streaming_read(rows: int) -> None:
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_linear_row.py"
    done = subprocess.run(
        [sys.executable, str(script), "--hidden", "64", "--intermediate", "96", "--layers", "1",
         "--rounds", "1", "--stream-bytes", str(1 << 20), "--rows", str(rows)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["stream_read_gb_per_s"] > 0
    for dtype in ("bf16", "fp32"):
        rates, flops = report[dtype]["gb_per_s"], report[dtype]["gflops"]
        assert report[dtype]["rows"] == rows
        assert {"onednn", "torch"} <= set(rates) and all(r > 0 for r in rates.values())
        assert set(flops) == set(rates) and all(f > 0 for f in flops.values())
        assert report[dtype]["over_torch"]["torch"] == 1.0


def test_bench_linear_row_refuses_no_rows() -> None:
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_linear_row.py"
    done = subprocess.run(
        [sys.executable, str(script), "--rows", "0"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "--rows must be at least 1, got 0" in done.stderr


def test_a_worker_that_finishes_gives_its_status_and_output() -> None:
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    assert bp.run_bounded([sys.executable, "-c", code], dict(os.environ), 60) == (
        3,
        "out\n",
        "err\n",
    )


def test_a_worker_past_its_timeout_is_stopped_with_every_process_it_started(
    tmp_path: Path,
) -> None:
    import psutil

    # the worker starts a process of its own (as vLLM starts its engine core), then hangs
    pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(600)"
    )
    assert bp.run_bounded([sys.executable, "-c", code], dict(os.environ), 3) is None
    child = int(pid_file.read_text())
    gone = not psutil.pid_exists(child)
    if not gone:  # (killed, maybe not yet reaped by its new parent)
        gone = psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert gone, "the worker's own process outlived the timeout"


def test_a_timed_out_peer_is_reported_and_the_run_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bp, "run_bounded", lambda cmd, env, timeout: None)
    args = type("Args", (), {"workloads": ["single"], "dtype": "fp32", "scale": 1.0,
                             "threads": None, "timeout": 7.0})()  # fmt: skip
    got = bp.spawn("llamacpp", Path(sys.executable), args, Path("/nowhere"), "bench", {})
    assert got == {"error": "worker stopped after --timeout 7 s without finishing"}
