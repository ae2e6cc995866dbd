"""``hwplug conformance`` and ``pytest --hwplug-conformance``."""

from __future__ import annotations

import json

import hypothesis  # noqa: F401  (kept loaded across pytester's inner runs)
import pytest

import hwplug.conformance
from hwplug.cli import main
from tests.conformance import broken

pytest_plugins = ["pytester"]

FAST = ["--kind", "rule", "--skip", "R02=slow here", "--skip", "R08=slow here"]


def test_json_report_and_exit_status_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "npu", "--profile", "acme-n1", "--json", *FAST]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["platform"] == "npu" and data["profile"] == "acme-n1"
    assert data["ok"] is True and data["conformance_version"] == "1.1"
    assert [r["id"] for r in data["results"]][:2] == ["R01", "R02"]
    assert data["results"][1] == {
        "id": "R02",
        "title": "detect() imports no torch and never raises",
        "kind": "rule",
        "outcome": "skip",
        "reason": "skipped by request: slow here",
        "seconds": 0.0,
    }


def test_table_names_every_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "hpu", *FAST]) == 0
    out = capsys.readouterr().out
    assert "R12 The graph wrapper matches has_device_graphs()" in out
    assert "hpu (simulated gaudi2) passes hwplug conformance 1.1" in out


def test_a_failing_check_exits_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        hwplug.conformance,
        "load_platform",
        lambda name, profile=None: broken.RefusedBlockNpu.simulate("acme-n2"),
    )
    assert main(["conformance", "npu", "--json", *FAST]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False
    assert [r["id"] for r in data["results"] if r["outcome"] == "fail"] == ["R09"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["nope"], "unknown platform 'nope'; known platforms:"),
        (["npu", "--profile", "h100"], "unknown npu profile 'h100'"),
        (["npu", "--skip", "X01=why"], "unknown conformance check 'X01'"),
        (["npu", "--skip", "R01"], "--skip 'R01': give ID=REASON"),
        (["npu", "--kind", "fast"], "--kind: unknown kind 'fast'"),
        (["npu", "--timeout", "0"], "--timeout '0': give a positive number of seconds"),
        (["npu", "--timeout", "soon"], "--timeout 'soon': give a positive number"),
        (["npu", "--timeout", "inf"], "--timeout 'inf': give a positive number"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], fragment: str
) -> None:
    assert main(["conformance", *args]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hwplug: error: ")
    assert fragment in lines[0]
    assert captured.out == ""


def test_pytest_option_makes_one_test_per_check(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--hwplug-conformance=hpu",
        "-k",
        "R01 or R12 or T03",
        "-rs",
        "-v",
    )
    result.assert_outcomes(passed=3, deselected=15)
    result.stdout.fnmatch_lines(["*hwplug_conformance?hpu-R01? PASSED*"])


def test_pytest_option_reports_a_skip_with_its_reason(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--hwplug-conformance=cpu", "-k", "T03", "-rs"
    )
    result.assert_outcomes(skipped=1, deselected=17)
    result.stdout.fnmatch_lines(["*the cpu platform captures no device graphs*"])


def test_pytest_option_refuses_an_unknown_platform(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("-p", "no:cacheprovider", "--hwplug-conformance=nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--hwplug-conformance: unknown platform 'nope'*"])


def test_pytest_option_takes_a_timeout(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--hwplug-conformance=cpu",
        "--hwplug-conformance-timeout=120",
        "-k",
        "R01",
    )
    result.assert_outcomes(passed=1, deselected=17)
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--hwplug-conformance=cpu", "--hwplug-conformance-timeout=0"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--hwplug-conformance-timeout 0.0: give a positive number*"])


def test_the_cli_takes_a_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "cpu", "--timeout", "300", "--json", *FAST]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
