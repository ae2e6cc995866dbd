"""Every built-in platform and the ACME NPU example pass the kit; broken copies fail it."""

from __future__ import annotations

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
    ],
    ids=["hidden-change", "refused-block", "not-a-wrapper", "torch-in-detect"],
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
