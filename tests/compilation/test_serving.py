"""``hwplug.compilation.serving`` and ``prime_compiler``: eager module calls in one thread
never meet a compiler's module-intercepting trace in another.

Each test that needs Inductor's trace not yet made runs in a fresh interpreter: the
trace is made once per process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from hwplug.compilation import BackgroundCompilation, serving
from hwplug.compilation.serving import is_serving
from tests.compilation.widen_trace import WIDEN_PLAIN_TRACES


def _run_python(code: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WIDEN_PLAIN_TRACES + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_an_eager_call_during_a_plain_trace_in_another_thread_fails_without_the_gate() -> None:
    # The hazard itself, so that the tests below can fail: a module called while
    # another thread's plain trace has patched nn.Module.__call__.
    result = _run_python(
        """
        import threading, time, torch
        layer = torch.nn.Linear(4, 4)
        tracer = threading.Thread(target=torch.fx.symbolic_trace, args=(lambda x: x,))
        tracer.start()
        time.sleep(WINDOW / 2)
        try:
            layer(torch.ones(1, 4))
        except NameError as exc:
            print("NameError:", exc)
        tracer.join()
        """
    )
    assert result.returncode == 0, result.stderr
    assert "NameError: module is not installed as a submodule" in result.stdout


def test_eager_steps_beside_a_background_inductor_compilation_never_meet_its_trace() -> None:
    # What failed the conformance kit's T04 once in CI: an engine's eager step (the
    # zeta engine) while another engine's model compiled in the background.
    result = _run_python(
        """
        import torch
        from hwplug.compilation import BackgroundCompilation, serving

        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
        x = torch.randn(3, 8)

        def build():
            compiled = torch.compile(model, backend="inductor", fullgraph=True)
            compiled(x)
            return compiled

        job = BackgroundCompilation(build, name="probe")
        steps = 0
        while not job.done:
            with serving():
                model(x)
            steps += 1
        assert job.error is None, job.error
        assert torch.allclose(job.result(x), model(x), atol=1e-5)
        print("steps", steps)
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.split()[-1]) > 0


def test_priming_waits_for_serving_threads_and_keeps_new_ones_out() -> None:
    result = _run_python(
        """
        import sys, threading, time, torch
        from hwplug.compilation.serving import prime_compiler, serving

        events = []
        inside = threading.Event()
        leave = threading.Event()

        def serve():
            with serving():
                inside.set()
                leave.wait()
                events.append("served")

        server = threading.Thread(target=serve)
        server.start()
        inside.wait()
        primer = threading.Thread(target=lambda: (prime_compiler(), events.append("primed")))
        primer.start()
        import torch._inductor.loop_body  # what priming imports first
        time.sleep(1.0)
        assert events == [], events          # priming waits for the serving thread
        from torch._inductor.loop_body import InterpreterShim

        def late_serve():
            with serving():  # waits for the priming, which waits for `server`
                traced = InterpreterShim._dummy_gm.cache_info().currsize
                events.append(f"late after the trace: {traced == 1}")

        late = threading.Thread(target=late_serve)
        late.start()
        time.sleep(0.3)
        assert events == [], events
        leave.set()
        primer.join(30)
        late.join(30)
        assert events[0] == "served", events
        assert sorted(events[1:]) == ["late after the trace: True", "primed"], events
        # primed: serving costs nothing and never waits again
        with serving():
            pass
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"


def test_a_thread_that_serves_may_prime_and_serve_again_inside() -> None:
    result = _run_python(
        """
        from hwplug.compilation.serving import is_serving, prime_compiler, serving

        with serving():
            with serving():
                assert is_serving()
                prime_compiler()  # waits only for other threads: none
            assert is_serving()
        assert not is_serving()
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"


def test_waiting_for_a_compilation_inside_serving_is_refused() -> None:
    release = threading.Event()
    job = BackgroundCompilation(lambda: (release.wait(30), "built")[1], name="probe")
    try:
        with serving():
            assert is_serving()
            with pytest.raises(RuntimeError, match="inside hwplug.compilation.serving"):
                job.wait()
    finally:
        release.set()
    assert job.wait(60) and job.result == "built"
    assert not is_serving()


def test_serving_is_left_when_its_block_raises() -> None:
    with pytest.raises(ValueError), serving():
        raise ValueError("a failed step")
    assert not is_serving()
