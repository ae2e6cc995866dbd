"""The hwplug pytest plugin, end to end with ``pytester``."""

from __future__ import annotations

import os
import re

# Imported here so that pytester's inner runs find it loaded: its pytest plugin
# imports it at the end of every run, and pytester forgets modules imported
# during a run, which would cost seconds of re-import per inner run.
import hypothesis  # noqa: F401
import pytest

import hwplug
from hwplug.plugins import manager

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def _clean_hwplug(monkeypatch: pytest.MonkeyPatch):
    for key in list(os.environ):
        if key.startswith("HWPLUG_"):
            monkeypatch.delenv(key)
    manager.reset()
    yield
    manager.reset()


def _representatives() -> list[str]:
    pm = manager.HwplugPluginManager()
    pm.load_entrypoints()
    return [
        entry.cls.representative_profile
        for _name, entry in sorted(pm.platform_entries().items())
        if entry.cls.representative_profile
    ]


def _ids(result: pytest.RunResult) -> list[str]:
    return re.findall(r"::test_\w+\[([^\]]+)\] PASSED", result.stdout.str())


SIMPLE = """
import hwplug

def test_platform(hwplug_platform):
    assert hwplug.current_platform is hwplug_platform
    assert hwplug_platform.simulated
    assert hwplug.resolve().platform is hwplug_platform
"""


def test_default_runs_one_representative_profile_per_installed_platform(pytester) -> None:
    pytester.makepyfile(SIMPLE)
    result = pytester.runpytest("-v")
    result.assert_outcomes(passed=len(_representatives()))
    assert sorted(_ids(result)) == sorted(_representatives())
    assert {"h100", "mi300x", "cpu-generic"} <= set(_ids(result))


def test_ids_show_the_selected_profiles_in_order(pytester) -> None:
    pytester.makepyfile(SIMPLE)
    result = pytester.runpytest("-v", "--hwplug-profiles=mi300x, h100:8 ,gaudi3")
    result.assert_outcomes(passed=3)
    assert _ids(result) == ["mi300x", "h100:8", "gaudi3"]
    result.stdout.fnmatch_lines(["*test_platform[[]h100:8[]] PASSED*"])


def test_all_selects_every_known_profile(pytester) -> None:
    known = manager.get_plugin_manager().known_profiles()
    pytester.makepyfile(SIMPLE)
    result = pytester.runpytest("-v", "--hwplug-profiles=all")
    result.assert_outcomes(passed=len(known))
    assert sorted(_ids(result)) == sorted(known)


def test_the_fixture_makes_the_profile_current(pytester) -> None:
    pytester.makepyfile(
        """
        import hwplug

        def test_device(hwplug_platform):
            platform = hwplug.current_platform
            assert platform.name == "rocm"
            assert platform.profile == "mi300x:8"
            assert len(platform.devices) == 8
            assert platform.devices[0].arch == "gfx942"
        """
    )
    pytester.runpytest("--hwplug-profiles=mi300x:8").assert_outcomes(passed=1)


def test_platforms_marker_filters_the_parameter_set(pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.hwplug_platforms("cuda", "hpu")
        def test_gpu_like(hwplug_platform):
            assert hwplug_platform.name in ("cuda", "hpu")

        @pytest.mark.hwplug_platforms("xeon-spr")
        def test_by_profile(hwplug_platform):
            assert hwplug_platform.profile == "xeon-spr"

        @pytest.mark.hwplug_platforms("xpu")
        def test_nothing_selected(hwplug_platform):
            raise AssertionError("must not run")

        @pytest.mark.hwplug_platforms("cuda", "rocm")
        class TestNested:
            @pytest.mark.hwplug_platforms("rocm")
            def test_both_markers_apply(self, hwplug_platform):
                assert hwplug_platform.name == "rocm"
        """
    )
    result = pytester.runpytest("-v", "--hwplug-profiles=h100,a100,mi300x,gaudi2,xeon-spr")
    result.assert_outcomes(passed=3 + 1 + 1, skipped=1)
    out = result.stdout.str()
    assert "test_gpu_like[h100] PASSED" in out
    assert "test_gpu_like[gaudi2] PASSED" in out
    assert "test_gpu_like[mi300x]" not in out
    assert "test_both_markers_apply[mi300x] PASSED" in out
    assert "empty parameter set" in pytester.runpytest("-rs", "--hwplug-profiles=h100").stdout.str()


def test_platforms_marker_with_an_unknown_name_is_a_usage_error(pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.hwplug_platforms("nvidia")
        def test_misnamed(hwplug_platform):
            raise AssertionError("must not run")
        """
    )
    result = pytester.runpytest("--hwplug-profiles=h100")
    assert result.ret != 0
    out = result.stdout.str()
    assert "unknown platform or profile 'nvidia'" in out
    assert "cuda" in out
    result.assert_outcomes(errors=1)


def test_bad_profile_count_is_a_usage_error_not_an_internal_error(pytester) -> None:
    pytester.makepyfile("def test_x(hwplug_platform):\n    pass\n")
    result = pytester.runpytest("--hwplug-profiles=h100:\u00b2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert "device count in profile" in result.stderr.str()


def test_requires_device_skips_unless_really_present(pytester, monkeypatch) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.hwplug_requires_device("hpu")
        def test_on_gaudi():
            pass

        @pytest.mark.hwplug_requires_device("cpu")
        def test_on_cpu():
            pass

        @pytest.mark.hwplug_requires_device("tpu")
        def test_on_tpu():
            pass
        """
    )
    # Simulating a Gaudi does not make one present.
    monkeypatch.setenv("HWPLUG_SIMULATE", "gaudi2")
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(
        [
            "*needs a real hpu device; none detected*",
            "*needs a real tpu device: platform 'tpu' is not installed*",
        ]
    )


def test_requires_device_marker_needs_one_name(pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.hwplug_requires_device()
        def test_nameless():
            pass
        """
    )
    result = pytester.runpytest()
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*hwplug_requires_device takes one platform name*"])


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("h100,nope", "--hwplug-profiles: unknown profile 'nope'; known profiles: *h100*"),
        ("h100:0", "--hwplug-profiles: device count in profile 'h100:0' must be a positive*"),
        (",", "--hwplug-profiles is empty*"),
    ],
)
def test_bad_profiles_are_a_usage_error_before_collection(pytester, option, message) -> None:
    pytester.makepyfile(
        """
        raise RuntimeError("collected")
        """
    )
    result = pytester.runpytest(f"--hwplug-profiles={option}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}"])
    assert "collected" not in result.stdout.str() + result.stderr.str()


def test_header_names_the_detected_platform(pytester) -> None:
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(["hwplug: detected platform * (*)"])


def test_header_reports_simulation_and_errors(pytester, monkeypatch) -> None:
    pytester.makepyfile("def test_nothing(): pass")
    monkeypatch.setenv("HWPLUG_SIMULATE", "h100:2")
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(
        [
            "hwplug: detected platform cuda (simulated h100:2: 2 x NVIDIA H100*HWPLUG_SIMULATE=h100:2)"
        ]
    )
    monkeypatch.setenv("HWPLUG_SIMULATE", "nosuchdevice")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["hwplug: platform detection failed: ConfigError: HWPLUG_SIMULATE=nosuchdevice: unknown *"]
    )


def test_header_does_not_fix_the_current_platform(pytester, monkeypatch) -> None:
    pytester.makepyfile(
        """
        import hwplug

        def test_selection_happens_later(monkeypatch):
            monkeypatch.setenv("HWPLUG_SIMULATE", "gaudi3")
            assert hwplug.current_platform.profile == "gaudi3"
        """
    )
    monkeypatch.setenv("HWPLUG_SIMULATE", "h100")
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(["hwplug: detected platform cuda (*"])
    result.assert_outcomes(passed=1)


def test_current_platform_is_restored_after_each_test(pytester) -> None:
    pytester.makepyfile(
        """
        import hwplug

        def test_a(hwplug_platform):
            assert hwplug.current_platform.profile == "h100"

        def test_b():
            assert hwplug.current_platform.profile == "xeon-spr"
        """
    )
    with hwplug.use_platform("xeon-spr") as outer:
        result = pytester.runpytest("--hwplug-profiles=h100", "-p", "no:randomly")
        result.assert_outcomes(passed=2)
        assert hwplug.current_platform is outer
    assert hwplug.current_platform.name == "cpu"


def test_a_test_may_parametrize_the_fixture_itself(pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("hwplug_platform", ["l4", "t4"], indirect=True)
        def test_own(hwplug_platform):
            assert hwplug_platform.name == "cuda"
        """
    )
    result = pytester.runpytest("-v", "--hwplug-profiles=mi300x")
    result.assert_outcomes(passed=2)
    assert _ids(result) == ["l4", "t4"]


def test_markers_are_registered_for_strict_markers(pytester) -> None:
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(
        ["@pytest.mark.hwplug_platforms(*names)*", "@pytest.mark.hwplug_requires_device(name)*"]
    )
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.hwplug_platforms("cuda")
        def test_x(hwplug_platform):
            pass
        """
    )
    pytester.runpytest("--strict-markers").assert_outcomes(passed=1)


def test_help_documents_the_option(pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*--hwplug-profiles=PROFILES*"])
