"""Every built-in platform and the ACME NPU example pass the kit; broken copies fail it."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import pytest

from hwplug.conformance import CHECKS, CheckContext, run_checks
from hwplug.core.errors import ConfigError
from tests.conformance import broken

PLATFORMS = ["cpu", "cuda", "rocm", "hpu", "xpu", "npu"]


def _explain(report: object) -> str:
    return "\n".join(
        f"{r.id} {r.outcome}: {r.reason}"
        for r in report.results  # type: ignore[attr-defined]
    )


@pytest.mark.parametrize("name", PLATFORMS)
def test_rule_checks_pass_on_each_representative_profile(name: str) -> None:
    report = run_checks(name, kinds=("rule",))
    assert report.ok, _explain(report)
    assert [r.id for r in report.results] == [i for i, c in CHECKS.items() if c.kind == "rule"]


@pytest.mark.parametrize("name", PLATFORMS)
def test_runtime_checks_pass_on_cpu_tensors(name: str) -> None:
    report = run_checks(name, kinds=("runtime",), skip={"T04": "covered once below"})
    assert report.ok, _explain(report)
    assert report.result("T01").outcome == "pass"
    assert report.result("T02").outcome == "pass"
    graphs = report.result("T03")
    if name in ("cpu", "xpu"):
        assert graphs.outcome == "skip" and "captures no device graphs" in graphs.reason
    else:
        assert graphs.outcome == "pass", graphs.reason
    collectives = report.result("T05")
    if name == "cpu":  # the real host: two processes over gloo
        assert collectives.outcome == "pass", collectives.reason
        assert collectives.reason == "DeviceCommunicator over gloo"
    else:
        assert collectives.outcome == "skip" and "simulated" in collectives.reason


def test_the_acme_example_passes_everything_on_acme_n2() -> None:
    report = run_checks("acme-n2")
    assert report.ok, _explain(report)
    assert report.profile == "acme-n2"
    tiny = report.result("T04")
    assert tiny.outcome in ("pass", "skip")
    if tiny.outcome == "skip":
        assert "not installed" in tiny.reason


def _simulated(cls: type) -> object:
    return cls.simulate("acme-n2")  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("cls", "failing", "fragment"),
    [
        (broken.HiddenChangeNpu, {"R06", "R07"}, "behind the change log"),
        (broken.RefusedBlockNpu, {"R09"}, "advertised cache.block_size=16 is refused"),
        (broken.NotAWrapperNpu, {"R12"}, "not a subclass of hwplug.core.graphs.GraphWrapper"),
        (broken.TorchDetectNpu, {"R02"}, "detect() imported torch"),
        (broken.OffListDefaultNpu, {"R09", "R10", "R12"}, "48"),
        (broken.NoFp8NameNpu, {"R10", "R11"}, "names no fp8 format: fp8_dtype_name is None"),
    ],
    ids=[
        "hidden-change",
        "refused-block",
        "not-a-wrapper",
        "torch-in-detect",
        "off-list-default-block",
        "no-fp8-name",
    ],
)
def test_a_broken_platform_fails_exactly_the_right_checks(
    cls: type, failing: set[str], fragment: str
) -> None:
    report = run_checks(_simulated(cls), kinds=("rule",))  # type: ignore[arg-type]
    assert set(report.failed()) == failing, _explain(report)
    for check_id in failing:
        assert fragment in report.result(check_id).reason, _explain(report)
    assert not report.ok


def test_a_platform_that_cannot_resolve_skips_the_resolution_checks_saying_why() -> None:
    report = run_checks(_simulated(broken.NotAWrapperNpu), kinds=("rule",))  # type: ignore[arg-type]
    for check_id in ("R03", "R04", "R05", "R06", "R07", "R08", "R09", "R10", "R13"):
        result = report.result(check_id)
        assert result.outcome == "skip", _explain(report)
        assert "resolution cannot run" in result.reason and "(see R12)" in result.reason


def test_the_hidden_change_names_the_config_that_shows_it() -> None:
    report = run_checks(_simulated(broken.HiddenChangeNpu), kinds=("rule",))  # type: ignore[arg-type]
    reason = report.result("R06").reason
    assert "scheduler.max_num_seqs" in reason and "(config: " in reason


def test_skips_are_reported_with_their_reason_and_unknown_ids_refused() -> None:
    report = run_checks("cpu", kinds=("rule",), skip={"r08": "no subprocesses on this farm"})
    assert report.result("R08").outcome == "skip"
    assert report.result("R08").reason == "skipped by request: no subprocesses on this farm"
    with pytest.raises(ConfigError, match="unknown conformance check 'X01'"):
        run_checks("cpu", skip={"X01": "why"})
    with pytest.raises(ConfigError, match="needs a reason"):
        run_checks("cpu", skip={"R01": " "})
    with pytest.raises(ConfigError, match="unknown check kind"):
        run_checks("cpu", kinds=("fast",))


def test_runtime_checks_skip_without_a_device() -> None:
    platform = broken.NpuPlatform.simulate("acme-n2")
    context = CheckContext.for_platform(platform)
    context.device, context.runtime_problem = None, "no device in this test"
    report = run_checks(platform, kinds=("runtime",), context=context)
    assert {r.outcome for r in report.results} == {"skip"}
    assert all(r.reason == "no device in this test" for r in report.results)


def test_the_report_is_json_ready() -> None:
    report = run_checks("hpu", kinds=("rule",), skip={"R02": "slow", "R08": "slow"})
    data = report.to_dict()
    assert data["conformance_version"] == "1.1"
    assert data["platform"] == "hpu" and data["profile"] == "gaudi2" and data["simulated"]
    assert data["ok"] is True
    assert data["counts"] == {"pass": 11, "fail": 0, "skip": 2}
    assert set(data["results"][0]) == {"id", "title", "kind", "outcome", "reason", "seconds"}
    assert "passes hwplug conformance 1.1" in report.summary()


def test_every_check_has_an_id_a_title_and_what_it_protects() -> None:
    for check_id, item in CHECKS.items():
        assert item.id == check_id and check_id[0] == {"rule": "R", "runtime": "T"}[item.kind]
        assert item.title and item.protects.endswith(".")


def _builtin_profiles() -> list[str]:
    from hwplug.matrix import builtin_plugin_manager

    return sorted(builtin_plugin_manager().known_profiles())


@pytest.mark.parametrize("profile", _builtin_profiles())
def test_rule_checks_pass_on_every_builtin_profile(profile: str) -> None:
    # detect() and cross-process hashes do not depend on the profile (R02, R08 above)
    report = run_checks(
        profile, kinds=("rule",), skip={"R02": "per platform", "R08": "per platform"}
    )
    assert report.ok, _explain(report)


@pytest.fixture
def no_write_backend() -> Iterator[type]:
    """The ``nowrite`` backend registered through a plugin for one test."""
    import hwplug
    from hwplug.plugins import manager

    backend = broken.no_write_backend()

    class Provides:
        @hwplug.hookimpl
        def hwplug_attention_backends(self) -> list[type]:
            return [backend]

    pm = manager.get_plugin_manager()
    pm.register(Provides(), name="nowrite-provider")
    try:
        yield backend
    finally:
        pm.unregister(name="nowrite-provider")


def test_a_backend_that_never_writes_the_cache_fails_t02(no_write_backend: type) -> None:
    report = run_checks(_simulated(broken.NoWriteNpu), kinds=("runtime",), skip={"T04": "slow"})  # type: ignore[arg-type]
    result = report.result("T02")
    assert result.outcome == "fail", _explain(report)
    assert "the nowrite backend: its key cache is wrong after the call" in result.reason
    assert "slots written this step hold other values than the reference write" in result.reason


def test_a_check_that_never_returns_fails_after_the_timeout() -> None:
    import threading

    platform = _simulated(broken.HangingNpu)
    context = CheckContext.for_platform(platform, timeout=0.5)  # type: ignore[arg-type]
    others = {i: "not this test" for i, c in CHECKS.items() if c.kind == "rule" and i != "R01"}
    broken.HANG.set()
    try:
        report = run_checks(platform, kinds=("rule",), skip=others, context=context)  # type: ignore[arg-type]
    finally:
        broken.HANG.clear()
        broken.RELEASE.set()
        for thread in threading.enumerate():  # let the abandoned check finish
            if thread.name.startswith("hwplug-conformance-"):
                thread.join(30)
    hung = report.result("R01")
    assert hung.outcome == "fail", _explain(report)
    assert "did not finish within 0.5 s" in hung.reason
    assert 0.5 <= hung.seconds < 10
    assert report.result("R03").outcome == "skip"  # the kit went on to the others


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), "10", True])
def test_a_bad_timeout_is_a_config_error(timeout: object) -> None:
    with pytest.raises(ConfigError, match="timeout must be a positive number of seconds"):
        CheckContext(timeout=timeout)  # type: ignore[arg-type]


def test_no_timeout_runs_the_check_in_the_callers_thread() -> None:
    report = run_checks(
        "cpu", kinds=("runtime",), context=CheckContext(timeout=None), skip={"T04": "slow"}
    )
    assert report.ok, _explain(report)


@pytest.fixture
def sloppy_backends() -> Iterator[None]:
    import hwplug
    from hwplug.plugins import manager

    backends = broken.sloppy_backends()

    class Provides:
        @hwplug.hookimpl
        def hwplug_attention_backends(self) -> list[type]:
            return backends

    pm = manager.get_plugin_manager()
    pm.register(Provides(), name="sloppy-provider")
    try:
        yield
    finally:
        pm.unregister(name="sloppy-provider")


@pytest.mark.parametrize(
    ("backend", "fragment"),
    [
        ("offby", "model dtype float32"),
        ("nowindow", "sliding window 5"),
    ],
)
def test_t02_catches_a_backend_off_in_float32_or_ignoring_windows(
    sloppy_backends: None, backend: str, fragment: str
) -> None:
    platform = broken.cpu_preferring(backend).simulate("cpu-generic")  # type: ignore[attr-defined]
    report = run_checks(platform, kinds=("runtime",), skip={"T04": "slow", "T05": "slow"})
    result = report.result("T02")
    assert result.outcome == "fail", _explain(report)
    assert f"the {backend} backend is off by" in result.reason
    assert fragment in result.reason


def test_t02_says_what_it_ran() -> None:
    report = run_checks("cpu", kinds=("runtime",), skip={"T04": "slow", "T05": "slow"})
    reason = report.result("T02").reason
    assert "torch: head size 64, model dtypes" in reason and "float32" in reason
    assert "sliding window 5" in reason


@pytest.mark.skipif(
    importlib.util.find_spec("zeta_tpu") is None, reason="tests/vendor/zeta_tpu is not installed"
)
def test_a_platform_without_block_size_32_passes_every_check() -> None:
    """The suite's second vendor (blocks 16, 64, 128) on its detected device."""
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("HWPLUG_")}
    env["ZETA_TPU_DEVICES"] = "0"
    result = subprocess.run(
        [sys.executable, "-m", "hwplug", "conformance", "zeta", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads(result.stdout)
    assert data["simulated"] is False
    assert data["counts"] == {"pass": len(CHECKS), "fail": 0, "skip": 0}, data["results"]


def test_a_default_block_outside_the_list_is_named_with_what_to_do() -> None:
    report = run_checks(_simulated(broken.OffListDefaultNpu), kinds=("rule",))  # type: ignore[arg-type]
    reason = report.result("R09").reason
    assert (
        "default block size 48 (default_block_size()) is not one it advertises (32, 64)" in reason
    )
    assert "make the default one of them" in reason


def test_a_refused_platform_default_names_who_set_it() -> None:
    import hwplug

    with pytest.raises(ConfigError) as info:
        hwplug.resolve(platform=_simulated(broken.OffListDefaultNpu))  # type: ignore[arg-type]
    message = str(info.value)
    assert "cache.block_size=48 is not supported" in message
    assert (
        "cache.block_size was set by platform:npu (default block size on npu), not by the user"
        in message
    )


def test_fp8_without_a_format_name_is_refused_at_resolution_with_the_fix() -> None:
    import hwplug
    from hwplug.core.config import EngineConfig

    config = EngineConfig.from_dict({"cache": {"cache_dtype": "fp8"}})
    with pytest.raises(ConfigError) as info:
        hwplug.resolve(config, platform=_simulated(broken.NoFp8NameNpu))  # type: ignore[arg-type]
    message = str(info.value)
    assert "cache.cache_dtype='fp8' (set by the user) cannot be used" in message
    assert "its plugin must set it to one of float8_e4m3fn" in message


def test_run_checks_reports_progress_before_each_check() -> None:
    seen: list[tuple[str, int, int]] = []
    report = run_checks(
        "cpu",
        kinds=("rule",),
        skip={"R02": "slow", "R08": "slow"},
        progress=lambda id, title, i, n: seen.append((id, i, n)),
    )
    ids = [r.id for r in report.results]
    assert [s[0] for s in seen] == ids
    assert [s[1] for s in seen] == list(range(len(ids)))
    assert {s[2] for s in seen} == {len(ids)}
