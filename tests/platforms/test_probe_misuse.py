"""Probes against hostile machine state: they never raise, block or exhaust memory.

A probe reads what the kernel publishes and the visibility variables; what it
cannot read or parse (unicode digits, a device node or FIFO linked in place of
a sysfs file, ranges that would expand to millions of entries) is skipped,
as if absent. Numbers are ASCII decimals only: a superscript two (which
``str.isdigit`` accepts and ``int`` refuses) and a fullwidth three (which
``int`` reads as 3) are not numbers here.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hwplug.core.platform import DeviceInfo
from hwplug.platforms.probes import (
    cpu_numa_nodes,
    probe_amd,
    probe_cpu,
    probe_habana,
    probe_intel_gpu,
    probe_nvidia,
)
from hwplug.platforms.profiles import PROFILES
from tests.platforms.fakes import (
    DGX_ADDRESSES,
    FakeRoot,
    amd_box,
    empty_box,
    habana_box,
    intel_discrete_box,
    jetson_box,
    nvidia_box,
)

GiB = 1 << 30
REPO = Path(__file__).resolve().parents[2]
# Superscript two (str.isdigit, but int() refuses it), fullwidth one and
# Arabic-Indic one (int() reads both as 1, a valid index).
UNICODE_DIGITS = ("²", "\uff11", "\u0661")
DECIMAL_DIGITS = UNICODE_DIGITS[1:]  # the ones a regex \d also matches
ALL_PROBES: tuple[Callable[..., Any], ...] = (
    probe_nvidia,
    probe_amd,
    probe_habana,
    probe_intel_gpu,
    probe_cpu,
    cpu_numa_nodes,
)


@pytest.fixture(autouse=True)
def _no_vendor_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Probes see no real NVML or amdsmi (fake roots never use them anyway)."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    monkeypatch.delenv("HWPLUG_PROBE_ROOT", raising=False)


def names(devices: list[DeviceInfo]) -> list[str]:
    return [d.name for d in devices]


# ---------------------------------------------------------------------------
# Unicode digits in sysfs names
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("digit", UNICODE_DIGITS)
def test_a_kfd_node_named_with_a_unicode_digit_is_skipped(tmp_path: Path, digit: str) -> None:
    root = amd_box(tmp_path, count=2)
    # A complete GPU node, but under a name that is not an ASCII node number.
    gpu = root.path / "sys/class/kfd/kfd/topology/nodes/2"
    odd = root.path / f"sys/class/kfd/kfd/topology/nodes/{digit}"
    odd.mkdir()
    (odd / "properties").write_text((gpu / "properties").read_text())
    assert probe_amd(root, env={}) == [PROFILES["rocm"]["mi300x"]] * 2


@pytest.mark.parametrize("digit", UNICODE_DIGITS)
def test_a_pci_accel_entry_with_a_unicode_digit_is_skipped(tmp_path: Path, digit: str) -> None:
    # No real module ids: the cards take module ids in bus order (0, 1).
    root = habana_box(tmp_path, count=2, module_ids=False)
    pci = root.path / "sys/bus/pci/devices/0000:19:00.0"
    root.write(str((pci / f"accel/accel{digit}/module_id").relative_to(root.path)), "5\n")
    assert len(probe_habana(root, env={"HABANA_VISIBLE_MODULES": "0"})) == 1
    assert probe_habana(root, env={"HABANA_VISIBLE_MODULES": "5"}) == []
    assert len(probe_habana(root, env={})) == 2


@pytest.mark.parametrize("digit", UNICODE_DIGITS)
def test_a_dev_accel_node_with_a_unicode_digit_is_no_driver_node(
    tmp_path: Path, digit: str
) -> None:
    root = habana_box(tmp_path, count=2)
    for node in (root.path / "dev/accel").iterdir():
        node.unlink()
    root.touch(f"dev/accel/accel{digit}")
    assert probe_habana(root, env={}) == []


# ---------------------------------------------------------------------------
# Unicode digits in visibility variables
# ---------------------------------------------------------------------------


def two_nvidia(path: Path) -> FakeRoot:
    return nvidia_box(path, count=2)


def two_amd(path: Path) -> FakeRoot:
    return amd_box(path, count=2)


def two_habana(path: Path) -> FakeRoot:
    return habana_box(path, count=2)


def two_intel(path: Path) -> FakeRoot:
    return intel_discrete_box(path, count=2)


VISIBILITY = [
    pytest.param(probe_nvidia, two_nvidia, "CUDA_VISIBLE_DEVICES", id="cuda"),
    pytest.param(probe_amd, two_amd, "HIP_VISIBLE_DEVICES", id="hip"),
    pytest.param(probe_amd, two_amd, "CUDA_VISIBLE_DEVICES", id="hip-via-cuda"),
    pytest.param(probe_amd, two_amd, "ROCR_VISIBLE_DEVICES", id="rocr"),
    pytest.param(probe_habana, two_habana, "HABANA_VISIBLE_MODULES", id="habana"),
    pytest.param(probe_intel_gpu, two_intel, "ZE_AFFINITY_MASK", id="ze"),
]


@pytest.mark.parametrize(
    ("probe", "box", "var", "digit"),
    [
        pytest.param(*case.values, digit, id=f"{case.id}-{digit}")
        for case in VISIBILITY
        for digit in UNICODE_DIGITS
        # ZE_AFFINITY_MASK was always read with a regex \d, which refuses "²".
        if not (case.id == "ze" and digit == "²")
    ],
)
def test_a_unicode_digit_in_a_visibility_variable_selects_nothing(
    tmp_path: Path, probe: Callable[..., Any], box: Callable[[Path], FakeRoot], var: str, digit: str
) -> None:
    root = box(tmp_path)
    assert len(probe(root, env={})) == 2
    assert probe(root, env={var: digit}) == []
    assert probe(root, env={var: f" {digit} "}) == []
    # Entries are taken in order and the first invalid one ends the list.
    assert len(probe(root, env={var: f"0,{digit}"})) == 1
    assert probe(root, env={var: f"{digit},0"}) == []


@pytest.mark.parametrize("digit", DECIMAL_DIGITS)
def test_a_unicode_digit_as_a_ze_tile_selects_nothing(tmp_path: Path, digit: str) -> None:
    root = intel_discrete_box(tmp_path, count=2)
    assert len(probe_intel_gpu(root, env={"ZE_AFFINITY_MASK": "1.0"})) == 1
    assert probe_intel_gpu(root, env={"ZE_AFFINITY_MASK": f"1.{digit}"}) == []
    assert probe_intel_gpu(root, env={"ZE_AFFINITY_MASK": f"{digit}.0"}) == []


@pytest.mark.parametrize("digit", UNICODE_DIGITS)
def test_a_unicode_digit_in_cpu_visible_memory_nodes_selects_nothing(
    tmp_path: Path, digit: str
) -> None:
    root = FakeRoot(tmp_path)
    root.numa_nodes(0, 1, 2, 3)
    var = "CPU_VISIBLE_MEMORY_NODES"
    assert cpu_numa_nodes(root, env={var: digit}) == []
    assert cpu_numa_nodes(root, env={var: f"2,{digit}"}) == [2]
    assert cpu_numa_nodes(root, env={var: f"0-{digit}"}) == []


# ---------------------------------------------------------------------------
# Unicode digits in proc files
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("digit", [*UNICODE_DIGITS, "\uff13\uff12", "1²", "²²²"])
def test_memtotal_in_unicode_digits_is_unknown_memory(tmp_path: Path, digit: str) -> None:
    root = empty_box(tmp_path)
    root.write("proc/meminfo", f"MemTotal:       {digit} kB\nMemFree:        1 kB\n")
    cpu = probe_cpu(root, env={})
    assert cpu.total_memory == 0
    assert cpu.name == "AMD Ryzen 9 7950X 16-Core Processor"


def test_jetson_memtotal_in_unicode_digits_is_unknown_memory(tmp_path: Path) -> None:
    root = jetson_box(tmp_path)
    root.write("proc/meminfo", "MemTotal: ² kB\n")
    (gpu,) = probe_nvidia(root, env={})
    assert gpu.total_memory == 0
    assert gpu.name == "NVIDIA Jetson AGX Orin Developer Kit"


# ---------------------------------------------------------------------------
# Device nodes and FIFOs in place of files
# ---------------------------------------------------------------------------


def run_isolated(code: str, root: FakeRoot, env: dict[str, str] | None = None) -> Any:
    """Run ``code`` (which prints JSON) in a child limited to 2 GiB of address space.

    A probe that read ``/dev/zero`` to the end, or expanded a huge range,
    fails there with a ``MemoryError`` instead of exhausting this machine.
    """

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 * GiB, 2 * GiB))

    child_env = {
        key: value
        for key, value in os.environ.items()
        if not key.endswith("_VISIBLE_DEVICES")
        and key not in ("HABANA_VISIBLE_MODULES", "ZE_AFFINITY_MASK", "CPU_VISIBLE_MEMORY_NODES")
    }
    child_env["HWPLUG_PROBE_ROOT"] = str(root)
    child_env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO / "src"), child_env.get("PYTHONPATH")])
    )
    child_env.update(env or {})
    result = subprocess.run(
        [sys.executable, "-c", "import json\nimport hwplug.platforms.probes as p\n" + code],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=limit,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def every_vendor_box(path: Path) -> FakeRoot:
    """One device of each vendor (two NVIDIA GPUs), CPU, memory and two NUMA nodes."""
    root = nvidia_box(path, count=2)
    amd_box(path, count=1)
    habana_box(path, count=1)
    intel_discrete_box(path, count=1)
    return root


SUMMARY = (
    "print(json.dumps({\n"
    "    'nvidia': [d.name for d in p.probe_nvidia()],\n"
    "    'amd': [d.total_memory for d in p.probe_amd()],\n"
    "    'habana': len(p.probe_habana()),\n"
    "    'intel': [d.total_memory for d in p.probe_intel_gpu()],\n"
    "    'cpu': [p.probe_cpu().name, p.probe_cpu().total_memory],\n"
    "    'numa': p.cpu_numa_nodes(),\n"
    "}))\n"
)
NVIDIA_0 = f"sys/bus/pci/devices/{DGX_ADDRESSES[0]}"
H100 = PROFILES["cuda"]["h100"].name

# (file replaced, what the probes then report: the rest of the machine as usual).
SPECIAL_FILE_CASES = [
    pytest.param(f"{NVIDIA_0}/vendor", {"nvidia": [H100]}, id="pci-vendor"),
    pytest.param(f"{NVIDIA_0}/class", {"nvidia": [H100]}, id="pci-class"),
    pytest.param(
        f"proc/driver/nvidia/gpus/{DGX_ADDRESSES[0]}/information",
        {"nvidia": [H100, H100]},
        id="nvidia-information",
    ),
    pytest.param("sys/class/kfd/kfd/topology/nodes/2/properties", {"amd": []}, id="kfd-properties"),
    pytest.param(
        "sys/class/kfd/kfd/topology/nodes/2/mem_banks/0/properties", {"amd": [0]}, id="kfd-bank"
    ),
    pytest.param(
        "sys/bus/pci/devices/0000:19:00.0/accel/accel0/module_id", {"habana": 1}, id="module-id"
    ),
    pytest.param(
        "sys/bus/pci/devices/0000:3a:00.0/tile0/physical_vram_size_bytes",
        {"intel": [64 * GiB]},
        id="xe-vram",
    ),
    pytest.param(
        "proc/cpuinfo", {"cpu": ["CPU", 2048 * GiB]}, id="cpuinfo"
    ),  # name unknown, memory still read
    pytest.param("proc/meminfo", {"cpu": ["Intel(R) Xeon(R) Platinum 8480C", 0]}, id="meminfo"),
]
NORMAL = {
    "nvidia": [H100, H100],
    "amd": [192 * GiB],
    "habana": 1,
    "intel": [128 * GiB],
    "cpu": ["Intel(R) Xeon(R) Platinum 8480C", 2048 * GiB],
    "numa": [0, 1],
}


def test_the_every_vendor_box_as_the_probes_see_it(tmp_path: Path) -> None:
    assert run_isolated(SUMMARY, every_vendor_box(tmp_path)) == NORMAL


@pytest.mark.parametrize(("rel", "changed"), SPECIAL_FILE_CASES)
def test_a_link_to_dev_zero_is_unreadable_not_read_forever(
    tmp_path: Path, rel: str, changed: dict[str, Any]
) -> None:
    root = every_vendor_box(tmp_path)
    target = root.path / rel
    target.unlink()
    os.symlink("/dev/zero", target)
    assert run_isolated(SUMMARY, root) == {**NORMAL, **changed}


def run_guarded(call: Callable[[], Any], unblock: Callable[[], None], timeout: float = 60) -> Any:
    """``call()`` in a daemon thread; fails (after ``unblock()``) if it does not return.

    The timeout only guards against a probe that blocks for good: the test
    asserts what is returned, not how long it took.
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # reported below
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        unblock()
        thread.join(5)
        pytest.fail(f"the probe was still blocked after {timeout} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def fifo_unblocker(path: Path) -> Callable[[], None]:
    """Open ``path`` for writing and close it, releasing a reader blocked on the FIFO."""

    def unblock() -> None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return
        os.close(fd)

    return unblock


def summary(root: FakeRoot) -> dict[str, Any]:
    cpu = probe_cpu(root, env={})
    return {
        "nvidia": names(probe_nvidia(root, env={})),
        "amd": [d.total_memory for d in probe_amd(root, env={})],
        "habana": len(probe_habana(root, env={})),
        "intel": [d.total_memory for d in probe_intel_gpu(root, env={})],
        "cpu": [cpu.name, cpu.total_memory],
        "numa": cpu_numa_nodes(root, env={}),
    }


@pytest.mark.parametrize(("rel", "changed"), SPECIAL_FILE_CASES)
def test_a_fifo_in_place_of_a_file_is_unreadable_and_never_blocks(
    tmp_path: Path, rel: str, changed: dict[str, Any]
) -> None:
    root = every_vendor_box(tmp_path)
    target = root.path / rel
    target.unlink()
    os.mkfifo(target)
    result = run_guarded(lambda: summary(root), fifo_unblocker(target))
    assert result == {**NORMAL, **changed}


# ---------------------------------------------------------------------------
# Node ranges that would expand to millions of entries
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0-99999999", [0, 1, 2, 3]),
        ("2-99999999", [2, 3]),
        ("99999990-99999999,0", []),
        ("1,99999990-99999999", [1]),
        ("3,0-99999999", [3, 0, 1, 2]),
        ("0-999999999999999999", [0, 1, 2, 3]),
        ("0-" + "9" * 40, []),
        ("0-1,2-99999999", [0, 1, 2, 3]),
    ],
)
def test_huge_numa_ranges_return_the_right_nodes(
    value: str, expected: list[int], tmp_path: Path
) -> None:
    root = FakeRoot(tmp_path)
    root.numa_nodes(0, 1, 2, 3)
    code = "print(json.dumps(p.cpu_numa_nodes()))\n"
    assert run_isolated(code, root, {"CPU_VISIBLE_MEMORY_NODES": value}) == expected
