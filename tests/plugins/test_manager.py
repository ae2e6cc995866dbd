"""The plugin manager: entry points, the environment variables, failures, selection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.plugins.distributions import clean_env, make_distribution, run_python


def vendor_module(
    *,
    name: str = "vnpu",
    priority: int = 50,
    detect: str = "return [DeviceInfo('Vendor NPU', 1 << 30)]",
    extra: str = "",
) -> str:
    return f"""
import hwplug
from hwplug.core.platform import DeviceInfo, Platform

class VendorPlatform(Platform):
    name = {name!r}
    device_type = "cpu"
    priority = {priority}

    @classmethod
    def detect(cls):
        {detect}

    @classmethod
    def profiles(cls):
        return {{"{name}-sim": DeviceInfo("Simulated {name}", 2 << 30)}}

@hwplug.hookimpl
def hwplug_platforms():
    return [VendorPlatform]
{extra}
"""


def install(
    tmp_path: Path,
    dist: str,
    module: str,
    source: str,
    ep_name: str | None = None,
    group: str = "hwplug.platforms",
) -> Path:
    site = tmp_path / "site"
    make_distribution(
        site,
        dist,
        entry_points={group: {ep_name or module: module}},
        modules={f"{module}.py": source},
    )
    return site


INFO = """
import json, warnings
warnings.simplefilter("ignore")
import hwplug
from hwplug.plugins import manager
try:
    sel = manager.select_platform()
    pm = manager.get_plugin_manager()
    print(json.dumps({
        "platform": sel.platform.name,
        "simulated": sel.platform.simulated,
        "reason": sel.reason,
        "plugins": sorted(pm.plugin_info),
        "failures": [f.message() for f in pm.failures],
        "candidates": {c.name: c.present for c in sel.candidates},
    }))
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
"""


def info(paths: list[Path], **env: str) -> dict:
    result = run_python(INFO, paths=paths, env=clean_env(**env))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_builtin_platforms_are_registered_through_entry_points() -> None:
    out = info([])
    assert {"cuda", "rocm", "cpu", "hpu", "xpu"} <= set(out["plugins"])
    assert out["platform"] == "cpu"  # no accelerator on the test machines
    assert out["failures"] == []


def test_vendor_platform_found_through_package_metadata_wins_by_priority(tmp_path: Path) -> None:
    site = install(tmp_path, "vendor-npu", "vendor_npu", vendor_module(priority=50))
    out = info([site])
    assert "vendor_npu" in out["plugins"]
    assert out["platform"] == "vnpu"
    assert "highest priority (50)" in out["reason"]
    assert out["candidates"]["vnpu"] is True


def test_absent_vendor_platform_leaves_cpu(tmp_path: Path) -> None:
    site = install(tmp_path, "vendor-npu", "vendor_npu", vendor_module(detect="return []"))
    out = info([site])
    assert out["platform"] == "cpu"
    assert out["candidates"]["vnpu"] is False


@pytest.mark.parametrize(
    ("allow", "loaded"),
    [(None, True), ("", False), ("vendor_npu", True), ("other,vendor_npu", True), ("other", False)],
)
def test_hwplug_plugins_allow_list(tmp_path: Path, allow: str | None, loaded: bool) -> None:
    site = install(tmp_path, "vendor-npu", "vendor_npu", vendor_module())
    env = {} if allow is None else {"HWPLUG_PLUGINS": allow}
    out = info([site], **env)
    assert ("vendor_npu" in out["plugins"]) is loaded
    # built-in platforms always load, whatever the allow-list says
    assert {"cuda", "cpu", "hpu", "rocm", "xpu"} <= set(out["plugins"])
    assert out["platform"] == ("vnpu" if loaded else "cpu")


def test_hwplug_plugins_applies_to_extension_group_too(tmp_path: Path) -> None:
    module = "import hwplug\n\n@hwplug.hookimpl\ndef hwplug_verify_config(config):\n    pass\n"
    site = install(tmp_path, "vendor-ext", "vendor_ext", module, group="hwplug.plugins")
    assert "vendor_ext" in info([site])["plugins"]
    assert "vendor_ext" not in info([site], HWPLUG_PLUGINS="")["plugins"]


def test_hwplug_platform_forces_a_present_platform(tmp_path: Path) -> None:
    site = install(tmp_path, "vendor-npu", "vendor_npu", vendor_module())
    out = info([site], HWPLUG_PLATFORM="cpu")
    assert out["platform"] == "cpu"
    assert out["reason"] == "HWPLUG_PLATFORM=cpu"


def test_hwplug_platform_unknown_lists_known() -> None:
    out = info([], HWPLUG_PLATFORM="tpu")
    assert out["error"] == "ConfigError"
    assert "unknown platform 'tpu'" in out["message"]
    for name in ("cpu", "cuda", "hpu", "rocm", "xpu"):
        assert name in out["message"]


def test_hwplug_platform_absent_says_how_to_simulate() -> None:
    out = info([], HWPLUG_PLATFORM="cuda")
    assert out["error"] == "ConfigError"
    assert "no cuda device was detected" in out["message"]
    assert "HWPLUG_SIMULATE" in out["message"] and "h100" in out["message"]


def test_hwplug_simulate_implies_platform_and_never_probes(tmp_path: Path) -> None:
    # A vendor whose probe would explode: simulation must not call any detect().
    site = install(
        tmp_path,
        "vendor-npu",
        "vendor_npu",
        vendor_module(detect="raise RuntimeError('probe touched hardware')"),
    )
    out = info([site], HWPLUG_SIMULATE="h100:8", HWPLUG_STRICT="1")
    assert out["platform"] == "cuda"
    assert out["simulated"] is True
    assert out["failures"] == []


def test_hwplug_simulate_vendor_profile(tmp_path: Path) -> None:
    site = install(tmp_path, "vendor-npu", "vendor_npu", vendor_module(detect="return []"))
    out = info([site], HWPLUG_SIMULATE="vnpu-sim")
    assert out["platform"] == "vnpu"
    assert out["simulated"] is True


def test_hwplug_simulate_unknown_profile_lists_known() -> None:
    out = info([], HWPLUG_SIMULATE="h1000")
    assert out["error"] == "ConfigError"
    assert "unknown device profile 'h1000'" in out["message"]
    assert "h100" in out["message"] and "mi300x" in out["message"]


def test_hwplug_simulate_conflicting_with_platform() -> None:
    out = info([], HWPLUG_SIMULATE="h100", HWPLUG_PLATFORM="rocm")
    assert out["error"] == "ConfigError"
    assert "HWPLUG_SIMULATE=h100" in out["message"] and "HWPLUG_PLATFORM=rocm" in out["message"]


FAILURES = {
    "import error": (
        "vendor_broken",
        "import does_not_exist_anywhere\n",
        "load",
        "ModuleNotFoundError",
    ),
    "raising detect": (
        "vendor_npu",
        vendor_module(detect="raise OSError('driver gone')"),
        "vnpu.detect()",
        "OSError: driver gone",
    ),
    "raising hook": (
        "vendor_npu",
        "import hwplug\n@hwplug.hookimpl\ndef hwplug_platforms():\n"
        "    raise RuntimeError('boom')\n",
        "hwplug_platforms",
        "RuntimeError: boom",
    ),
    "garbage from hook": (
        "vendor_npu",
        "import hwplug\n@hwplug.hookimpl\ndef hwplug_platforms():\n    return 42\n",
        "hwplug_platforms",
        "returned int",
    ),
    "garbage item": (
        "vendor_npu",
        "import hwplug\n@hwplug.hookimpl\ndef hwplug_platforms():\n    return [object]\n",
        "hwplug_platforms",
        "not a Platform subclass",
    ),
    "garbage from detect": (
        "vendor_npu",
        vendor_module(detect="return 'yes'"),
        "vnpu.detect()",
        "expected a list of DeviceInfo",
    ),
}


@pytest.mark.parametrize("kind", sorted(FAILURES))
def test_failing_plugin_is_named_and_skipped(tmp_path: Path, kind: str) -> None:
    module, source, stage, error = FAILURES[kind]
    site = install(tmp_path, "vendor-dist", module, source)
    out = info([site])
    assert out["platform"] == "cpu"
    [failure] = out["failures"]
    assert f"plugin '{module}' from distribution 'vendor-dist' failed in {stage}" in failure
    assert error in failure


@pytest.mark.parametrize("kind", sorted(FAILURES))
def test_failing_plugin_is_an_error_when_strict(tmp_path: Path, kind: str) -> None:
    module, source, _stage, _error = FAILURES[kind]
    site = install(tmp_path, "vendor-dist", module, source)
    out = info([site], HWPLUG_STRICT="1")
    assert out["error"] == "PluginError"
    assert f"'{module}'" in out["message"] and "'vendor-dist'" in out["message"]
    assert "HWPLUG_STRICT=1" in out["message"]


def test_failing_plugin_warns_with_its_name(tmp_path: Path) -> None:
    site = install(tmp_path, "vendor-dist", "vendor_broken", "raise ImportError('no driver')\n")
    result = run_python(
        "import hwplug; print(hwplug.current_platform.name)", paths=[site], env=clean_env()
    )
    assert result.returncode == 0
    assert result.stdout.strip() == "cpu"
    assert "PluginWarning" in result.stderr and "vendor_broken" in result.stderr
    assert "vendor-dist" in result.stderr


def test_platform_name_claimed_twice_names_both_distributions(tmp_path: Path) -> None:
    site = tmp_path / "site"
    make_distribution(
        site,
        "first-dist",
        entry_points={"hwplug.platforms": {"a": "vendor_a"}},
        modules={"vendor_a.py": vendor_module()},
    )
    make_distribution(
        site,
        "second-dist",
        entry_points={"hwplug.platforms": {"b": "vendor_b"}},
        modules={"vendor_b.py": vendor_module()},
    )
    out = info([site])
    assert out["error"] == "PluginError"
    assert "'vnpu' is claimed twice" in out["message"]
    assert "first-dist" in out["message"] and "second-dist" in out["message"]


def test_claiming_a_builtin_name_is_an_error(tmp_path: Path) -> None:
    site = install(tmp_path, "fake-cuda", "fake_cuda", vendor_module(name="cuda"))
    out = info([site])
    assert out["error"] == "PluginError"
    assert "'cuda' is claimed twice" in out["message"]
    assert "'hwplug'" in out["message"] and "'fake-cuda'" in out["message"]


def test_equal_priority_tie_names_both_and_says_how_to_force(tmp_path: Path) -> None:
    site = tmp_path / "site"
    make_distribution(
        site,
        "first-dist",
        entry_points={"hwplug.platforms": {"a": "vendor_a"}},
        modules={"vendor_a.py": vendor_module(name="npu1")},
    )
    make_distribution(
        site,
        "second-dist",
        entry_points={"hwplug.platforms": {"b": "vendor_b"}},
        modules={"vendor_b.py": vendor_module(name="npu2")},
    )
    out = info([site])
    assert out["error"] == "PluginError"
    assert "'npu1'" in out["message"] and "'npu2'" in out["message"]
    assert "HWPLUG_PLATFORM" in out["message"]
    # ... and how to settle it for good, not only for one process
    assert "for good" in out["message"] and "HWPLUG_PLUGINS" in out["message"]
    assert "priority no other installed platform uses" in out["message"]
    assert info([site], HWPLUG_PLATFORM="npu2")["platform"] == "npu2"
    assert info([site], HWPLUG_PLUGINS="b")["platform"] == "npu2"


def test_current_platform_is_detected_once_under_concurrent_first_use(tmp_path: Path) -> None:
    counter = tmp_path / "calls"
    source = vendor_module(
        detect=(
            f"import time; open({str(counter)!r}, 'a').write('x'); time.sleep(0.2); "
            "return [DeviceInfo('Vendor NPU', 1 << 30)]"
        )
    )
    site = install(tmp_path, "vendor-npu", "vendor_npu", source)
    code = """
    import threading, hwplug
    barrier = threading.Barrier(32)
    seen = []
    def worker():
        barrier.wait()
        seen.append(hwplug.current_platform)
    threads = [threading.Thread(target=worker) for _ in range(32)]
    for t in threads: t.start()
    for t in threads: t.join()
    print(len(seen), len({id(p) for p in seen}), seen[0].name)
    """
    result = run_python(code, paths=[site], env=clean_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["32", "1", "vnpu"]
    assert counter.read_text() == "x"


def test_import_and_current_platform_leave_torch_unimported() -> None:
    code = """
    import sys, hwplug
    p = hwplug.current_platform
    hwplug.get_platform()
    print(p.name, 'torch' in sys.modules)
    """
    result = run_python(code, env=clean_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["cpu", "False"]


def test_simulated_selection_leaves_torch_unimported() -> None:
    code = "import sys, hwplug; print(hwplug.current_platform.name, 'torch' in sys.modules)"
    result = run_python(code, env=clean_env(HWPLUG_SIMULATE="mi300x:8"))
    assert result.stdout.split() == ["rocm", "False"], result.stderr


def test_trace_logs_every_hook_call_and_names_each_plugin(tmp_path: Path) -> None:
    extra = "\n@hwplug.hookimpl\ndef hwplug_check_and_update_config(config, changes):\n    pass\n"
    site = install(tmp_path, "vendor-npu", "vendor_npu", vendor_module(extra=extra))
    result = run_python(
        "import hwplug; hwplug.resolve()", paths=[site], env=clean_env(HWPLUG_TRACE="1")
    )
    assert result.returncode == 0, result.stderr
    assert "hwplug-trace:" in result.stderr
    assert "hwplug_platforms: plugin vendor_npu" in result.stderr
    assert "vnpu.detect(): plugin vendor_npu" in result.stderr
    assert "hwplug_check_and_update_config: plugin vendor_npu" in result.stderr
    assert "hwplug_verify_config" in result.stderr
    assert "[pluginmanage]" not in result.stderr


def test_without_trace_nothing_is_logged(tmp_path: Path) -> None:
    result = run_python("import hwplug; hwplug.resolve()", env=clean_env())
    assert "hwplug-trace" not in result.stderr
