"""examples/acme_npu: a real vendor package, built, installed and discovered."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plugins.distributions import REPO, clean_env, run_python

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def acme_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the example with its own pyproject.toml and install it into a throwaway folder."""
    target = tmp_path_factory.mktemp("acme-site")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(REPO / "examples" / "acme_npu"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert list(target.glob("acme_npu-*.dist-info"))
    return target


PROBE = """
import json, warnings
warnings.simplefilter("ignore")
import hwplug
from hwplug.plugins import manager
try:
    pm = manager.get_plugin_manager()
    res = hwplug.resolve()
    print(json.dumps({
        "platform": res.platform.name,
        "simulated": res.platform.simulated,
        "device": res.platform.describe_device(),
        "distribution": pm.distribution_of("acme_npu"),
        "block_size": res.config.cache.block_size,
        "changes": [c.to_dict() for c in res.changes],
    }))
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
"""


def probe(site: Path, **env: str) -> dict:
    result = run_python(PROBE, paths=[site], env=clean_env(**env))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_present_npu_outranks_the_builtins(acme_site: Path) -> None:
    out = probe(acme_site, ACME_NPU_DEVICES="0,1")
    assert out["platform"] == "npu"
    assert out["simulated"] is False
    assert out["distribution"] == "acme-npu"
    assert out["block_size"] == 32
    sources = {c["path"]: c["source"] for c in out["changes"]}
    assert sources["cache.block_size"] == "platform:npu"
    assert sources["scheduler.max_num_seqs"] == "platform:npu"


def test_absent_npu_leaves_cpu(acme_site: Path) -> None:
    assert probe(acme_site)["platform"] == "cpu"


def test_npu_profiles_simulate_without_hardware(acme_site: Path) -> None:
    out = probe(acme_site, HWPLUG_SIMULATE="acme-n1")
    assert out["platform"] == "npu" and out["simulated"] is True
    assert "ACME N1" in out["device"]


def test_npu_cache_rules(acme_site: Path) -> None:
    code = """
    import hwplug
    from hwplug.core.config import EngineConfig, CacheConfig
    cfg = EngineConfig(cache=CacheConfig(cache_dtype="fp8"))
    print(hwplug.resolve(cfg, platform="acme-n2").config.cache.cache_dtype)
    try:
        hwplug.resolve(cfg, platform="acme-n1")
    except hwplug.ConfigError as exc:
        print("ConfigError:", exc)
    """
    result = run_python(code, paths=[acme_site], env=clean_env())
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.strip().splitlines()
    assert first == "fp8"
    assert second == (
        "ConfigError: cache.cache_dtype='fp8' is not supported on ACME N1 Inference "
        "Accelerator (n1): fp8 KV caches need an ACME N2 or later; "
        "use cache.cache_dtype='auto' or 'bfloat16'"
    )


def test_excluded_by_allow_list(acme_site: Path) -> None:
    out = probe(acme_site, ACME_NPU_DEVICES="0", HWPLUG_PLUGINS="")
    assert out["platform"] == "cpu"
    assert out["distribution"] is None


def test_raising_detect_is_reported_by_name(acme_site: Path) -> None:
    result = run_python(
        "import hwplug; print(hwplug.current_platform.name)",
        paths=[acme_site],
        env=clean_env(ACME_NPU_DEVICES="0", ACME_NPU_ARCH="n9"),
    )
    assert result.stdout.strip() == "cpu"
    assert "acme_npu" in result.stderr and "acme-npu" in result.stderr
    assert "ACME_NPU_ARCH='n9'" in result.stderr


def test_acme_attention_fits_the_graph_mode(acme_site: Path) -> None:
    code = """
    import json
    import hwplug
    from hwplug.core.config import EngineConfig
    res = hwplug.resolve(platform="acme-n2")
    fitted = res.changes_to("compilation.cudagraph_mode")[-1]
    out = {"backend": res.config.attention.backend, "mode": str(res.config.compilation.cudagraph_mode),
           "source": fitted.source, "reason": fitted.reason}
    try:
        hwplug.resolve(EngineConfig.from_dict({"compilation": {"cudagraph_mode": "FULL"}}),
                       platform="acme-n2")
    except hwplug.ConfigError as exc:
        out["refused"] = str(exc)
    print(json.dumps(out))
    """
    result = run_python(code, paths=[acme_site], env=clean_env())
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["backend"] == "acme"
    assert out["mode"] == "FULL_DECODE_ONLY"
    assert out["source"] == "engine"
    assert "acme attention backend's graph support is UNIFORM_SINGLE_TOKEN_DECODE" in out["reason"]
    assert "compilation.cudagraph_mode=FULL cannot run with the acme" in out["refused"]
    assert "use compilation.cudagraph_mode=NONE or FULL_DECODE_ONLY" in out["refused"]


def test_acme_graph_backend_captures_and_replays_what_the_dispatcher_plans(
    acme_site: Path,
) -> None:
    code = """
    import json
    import torch
    import hwplug
    from hwplug.core.config import EngineConfig
    from hwplug.core.graphs import BatchDescriptor, GraphDispatcher, capture_graphs, graph_context
    cfg = EngineConfig.from_dict({"scheduler": {"max_num_seqs": 4}})
    res = hwplug.resolve(cfg, platform="acme-n2")
    wrapper_cls = res.platform.graph_wrapper_cls()
    buffer = torch.zeros(8)
    model = wrapper_cls(lambda x: x * 2, res.config.compilation, "FULL")
    dispatcher = GraphDispatcher.from_config(res.config)
    done = capture_graphs(lambda key: model(buffer[: key.num_tokens]), dispatcher.capture_keys())
    mode, key = dispatcher.dispatch(BatchDescriptor(3, uniform_decode=True))
    buffer[:3] = torch.tensor([1.0, 2.0, 3.0])
    with graph_context(mode, key):
        out = model(buffer[: key.num_tokens])
    backend = model.backend
    print(json.dumps({"captured": [k.num_tokens for _, k in done], "mode": mode.name,
                      "key": key.num_tokens, "out": out[:3].tolist(),
                      "replays": sum(g.replays for g in backend.graphs), "backend": backend.name}))
    """
    result = run_python(code, paths=[acme_site], env=clean_env())
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["backend"] == "acme"
    assert out["captured"] == [4, 2, 1]  # decode graphs up to max_num_seqs, largest first
    assert (out["mode"], out["key"]) == ("FULL", 4)
    assert out["out"] == [2.0, 4.0, 6.0]
    assert out["replays"] == 1


def test_acme_brings_its_own_communicator(acme_site: Path) -> None:
    code = """
    import json
    import torch
    from hwplug.plugins import manager
    platform = manager.get_plugin_manager().platform_from_spec("acme-n2")
    comm = platform.device_communicator()
    t = torch.ones(3)
    comm.all_reduce(t)
    comm.all_gather(t)
    comm.barrier()
    mesh = platform.init_model_parallel(1, 1)
    pipe = mesh.pp_communicator
    try:  # a world of one has no one to send to: counted, then refused
        pipe.send(t, 1)
    except RuntimeError:
        pass
    print(json.dumps({"cls": type(comm).__name__, "world": comm.world_size,
                      "calls": dict(comm.calls), "t": t.tolist(),
                      "pipe": [type(pipe).__name__, dict(pipe.calls)]}))
    """
    result = run_python(code, paths=[acme_site], env=clean_env())
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out == {
        "cls": "AcmeCommunicator",
        "world": 1,
        "calls": {"all_reduce": 1, "all_gather": 1, "barrier": 1},
        "t": [1.0, 1.0, 1.0],
        "pipe": ["AcmeCommunicator", {"send": 1}],
    }
