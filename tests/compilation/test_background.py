"""``hwplug.compilation.BackgroundCompilation`` and ``compiles_in_background``."""

from __future__ import annotations

import contextvars
import logging
import threading

import pytest
import torch

import hwplug
from hwplug.compilation import BackgroundCompilation, compile_model, compiles_in_background
from hwplug.compilation.background import BUILT_IN_BACKENDS, ENV
from hwplug.core.config import EngineConfig


def _resolved(platform: str, **compilation: object) -> EngineConfig:
    config = EngineConfig.from_dict({"model": {"dtype": "float32"}, "compilation": compilation})
    return hwplug.resolve(config, platform=platform).config


def test_a_cpu_config_compiles_in_the_background(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    config = _resolved("cpu-generic")
    assert int(config.compilation.level or 0) == 2
    assert compiles_in_background(config)
    monkeypatch.setenv(ENV, "1")
    assert compiles_in_background(config)


def test_no_background_compilation_for_an_eager_level_ranks_or_device_graphs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert not compiles_in_background(_resolved("cpu-generic", level=0))
    assert not compiles_in_background(_resolved("cpu-generic"), world_size=2)
    graphs = _resolved("h100")
    assert str(graphs.compilation.cudagraph_mode) != "NONE"
    assert not compiles_in_background(graphs)


def test_a_custom_backend_is_built_before_the_engine_serves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    for name in sorted(BUILT_IN_BACKENDS - {""}):
        assert compiles_in_background(_resolved("cpu-generic", backend=name)), name
    custom = _resolved("cpu-generic", backend="my_pkg.my_backend")
    assert not compiles_in_background(custom)


def test_the_environment_turns_it_off_and_a_bad_value_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = _resolved("cpu-generic")
    monkeypatch.setenv(ENV, "0")
    assert not compiles_in_background(config)
    monkeypatch.setenv(ENV, "yes")
    with pytest.raises(ValueError, match=f"{ENV} must be 0 or 1; got 'yes'"):
        compiles_in_background(config)


def test_the_result_comes_from_another_thread_with_the_callers_context_and_modes() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("test_var", default="unset")
    var.set("caller's")
    release = threading.Event()
    seen: dict[str, object] = {}

    def build() -> str:
        release.wait(30)
        seen["thread"] = threading.current_thread().name
        seen["var"] = var.get()
        seen["inference"] = torch.is_inference_mode_enabled()
        seen["grad"] = torch.is_grad_enabled()
        return "built"

    with torch.inference_mode():
        job = BackgroundCompilation(build, name="probe")
    assert not job.done and job.result is None
    assert not job.wait(0.01)
    assert "running" in repr(job)
    release.set()
    assert job.wait(30)
    assert job.done and job.result == "built" and job.error is None
    assert job.seconds is not None and job.seconds >= 0
    assert seen == {
        "thread": "hwplug-compile-probe",
        "var": "caller's",
        "inference": True,
        "grad": False,
    }
    assert "built in" in repr(job)


def test_a_failed_build_is_kept_and_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    def build() -> str:
        raise RuntimeError("no compiler here")

    with caplog.at_level(logging.WARNING, logger="hwplug.compilation.background"):
        job = BackgroundCompilation(build, name="broken")
        assert job.wait(30)
    assert job.result is None
    assert isinstance(job.error, RuntimeError)
    assert "failed" in repr(job)
    assert any(
        "compiling broken in the background failed" in r.getMessage()
        and "RuntimeError: no compiler here" in r.getMessage()
        for r in caplog.records
    )


def test_waiting_from_the_worker_thread_does_not_block() -> None:
    holder: list[BackgroundCompilation[bool]] = []
    ready = threading.Event()

    def build() -> bool:
        ready.wait(30)
        return holder[0].wait()  # its own thread: returns at once (False: not done)

    holder.append(BackgroundCompilation(build, name="self-wait"))
    ready.set()
    assert holder[0].wait(30)
    assert holder[0].result is False


def test_a_model_compiled_in_the_background_matches_the_eager_one() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.SiLU())
    config = _resolved("cpu-generic", level=2, backend="eager")
    x = torch.randn(3, 8)

    def build() -> object:
        compiled = compile_model(model, config, platform=hwplug.get_platform())
        compiled(torch.randn(5, 8))
        return compiled

    job = BackgroundCompilation(build)
    expected = model(x)  # the caller runs the model meanwhile
    assert job.wait(120) and job.error is None
    assert callable(job.result)
    torch.testing.assert_close(job.result(x), expected)
