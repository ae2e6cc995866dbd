"""The current platform across threads, tasks and processes."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading

import pytest

import hwplug
from tests.plugins.distributions import clean_env, make_distribution, run_python


def test_use_platform_holds_in_its_own_thread_only() -> None:
    entered = threading.Event()
    release = threading.Event()
    seen: dict[str, str] = {}

    def holder() -> None:
        with hwplug.use_platform("h100"):
            seen["holder"] = hwplug.current_platform.name
            entered.set()
            release.wait(30)

    def other() -> None:
        seen["other"] = hwplug.current_platform.name

    thread_a = threading.Thread(target=holder)
    thread_a.start()
    assert entered.wait(30)
    thread_b = threading.Thread(target=other)
    thread_b.start()
    thread_b.join(30)
    seen["main"] = hwplug.current_platform.name
    release.set()
    thread_a.join(30)
    assert seen == {"holder": "cuda", "other": "cpu", "main": "cpu"}


def test_use_platform_holds_per_asyncio_task() -> None:
    async def task(spec: str, started: asyncio.Event, go: asyncio.Event) -> str:
        with hwplug.use_platform(spec):
            started.set()
            await go.wait()
            return str(hwplug.current_platform.name)

    async def main() -> list[str]:
        go = asyncio.Event()
        events = [asyncio.Event(), asyncio.Event()]
        tasks = [
            asyncio.create_task(task(spec, ev, go)) for spec, ev in zip(("h100", "gaudi2"), events)
        ]
        for ev in events:
            await ev.wait()
        outside = str(hwplug.current_platform.name)
        go.set()
        return [outside, *await asyncio.gather(*tasks)]

    assert asyncio.run(main()) == ["cpu", "cuda", "hpu"]


SLOW_DETECT = """
import os
import time
import hwplug
from hwplug.core.platform import DeviceInfo, Platform

class SlowPlatform(Platform):
    name = "slow"
    device_type = "cpu"
    priority = 50

    @classmethod
    def detect(cls):
        open(os.environ["SLOW_MARK"], "w").close()  # now inside detection
        time.sleep(2)
        return []

@hwplug.hookimpl
def hwplug_platforms():
    return [SlowPlatform]
"""

FORK_WHILE_DETECTING = """
import os, threading, time, json
import hwplug
from hwplug.plugins import current

worker = threading.Thread(target=lambda: hwplug.current_platform)
worker.start()
deadline = time.monotonic() + 60
while not os.path.exists(os.environ["SLOW_MARK"]) and time.monotonic() < deadline:
    time.sleep(0.01)
# The worker is inside detection now, holding the manager's lock.
pid = os.fork()
if pid == 0:
    # The child must not wait forever for the parent's lock.
    current.reset()
    name = hwplug.get_platform().name
    os.write(1, (json.dumps({"child": name}) + "\\n").encode())
    os._exit(0)
worker.join()
_, status = os.waitpid(pid, 0)
print(json.dumps({"parent": hwplug.current_platform.name, "status": status}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_while_another_thread_detects_does_not_deadlock(tmp_path) -> None:
    site = tmp_path / "site"
    make_distribution(
        site,
        "slow-npu",
        entry_points={"hwplug.platforms": {"slow_npu": "slow_npu"}},
        modules={"slow_npu.py": SLOW_DETECT},
    )
    env = clean_env(SLOW_MARK=str(tmp_path / "inside-detect"))
    result = run_python(FORK_WHILE_DETECTING, paths=[site], env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert {"child": "cpu"} in lines
    assert {"parent": "cpu", "status": 0} in lines


SPAWN_CHILD = """
import json, multiprocessing, os

def child(queue):
    import hwplug
    queue.put(hwplug.current_platform.profile)

if __name__ == "__main__":
    import hwplug
    ctx = multiprocessing.get_context("spawn")
    with hwplug.use_platform("mi300x"):
        queue = ctx.Queue()
        plain = ctx.Process(target=child, args=(queue,))
        plain.start(); plain.join(60)
        without = queue.get(timeout=60)
        os.environ["HWPLUG_SIMULATE"] = hwplug.current_platform.profile
        told = ctx.Process(target=child, args=(queue,))
        told.start(); told.join(60)
        with_env = queue.get(timeout=60)
    print(json.dumps([without, with_env]))
"""


@pytest.mark.slow
def test_spawned_children_follow_hwplug_simulate_not_use_platform(tmp_path) -> None:
    script = tmp_path / "spawn_child.py"
    script.write_text(SPAWN_CHILD)
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    import subprocess

    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == [None, "mi300x"]
