"""Fake /sys, /proc, /dev and /etc trees for the hardware probes.

:class:`FakeRoot` writes files shaped like the ones Linux kernel drivers
publish; the ``*_box`` builders assemble whole machines (an 8-GPU NVIDIA
server, an MI300X server, a Gaudi 2 server, Intel discrete and integrated
GPUs, a Jetson, a machine with nothing). Point a probe at one with
``probe_nvidia(root)`` or, for a subprocess, ``HWPLUG_PROBE_ROOT=<root>``.
"""

from __future__ import annotations

import os
from pathlib import Path

GiB = 1 << 30

# PCI addresses of the eight GPUs in a DGX H100.
DGX_ADDRESSES = (
    "0000:18:00.0",
    "0000:2a:00.0",
    "0000:3a:00.0",
    "0000:5d:00.0",
    "0000:9a:00.0",
    "0000:ab:00.0",
    "0000:ba:00.0",
    "0000:db:00.0",
)

XEON_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush "
    "mmx fxsr sse sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc pni pclmulqdq "
    "ssse3 fma cx16 sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand "
    "hypervisor lahf_lm abm 3dnowprefetch bmi1 avx2 smep bmi2 erms invpcid avx512f "
    "avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd sha_ni avx512bw "
    "avx512vl xsaveopt xsavec xgetbv1 xsaves avx_vnni avx512_bf16 wbnoinvd arat "
    "avx512vbmi umip pku ospke waitpkg avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni "
    "avx512_bitalg tme avx512_vpopcntdq rdpid cldemote movdiri movdir64b md_clear "
    "serialize tsxldtrk amx_bf16 avx512_fp16 amx_tile amx_int8 flush_l1d arch_capabilities"
)

DESKTOP_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush "
    "mmx fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc "
    "pni pclmulqdq monitor ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx "
    "f16c rdrand lahf_lm cmp_legacy svm extapic cr8_legacy abm sse4a misalignsse "
    "3dnowprefetch osvw ibs skinit wdt tce topoext bmi1 avx2 smep bmi2 rdseed adx smap "
    "clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 xsaves"
)

ARM_FEATURES = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid"


class FakeRoot:
    """A directory that probes read as ``/``; usable wherever a path is."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    # -- primitives -------------------------------------------------------------
    def write(self, rel: str, text: str | bytes) -> Path:
        """Write ``text`` to ``rel`` (relative to the root), creating parents."""
        target = self.path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            target.write_bytes(text)
        else:
            target.write_text(text)
        return target

    def mkdir(self, rel: str) -> Path:
        target = self.path / rel
        target.mkdir(parents=True, exist_ok=True)
        return target

    def touch(self, rel: str) -> Path:
        """An empty file, standing in for a device node under ``dev``."""
        return self.write(rel, "")

    def symlink(self, rel: str, target: str) -> Path:
        link = self.path / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, link)
        return link

    # -- PCI ----------------------------------------------------------------------
    def pci_device(
        self,
        address: str,
        *,
        vendor: int,
        device: int,
        pci_class: int,
        driver: str | None = None,
    ) -> Path:
        """A PCI function in ``sys/bus/pci/devices`` as sysfs shows it."""
        base = f"sys/bus/pci/devices/{address}"
        self.write(f"{base}/vendor", f"0x{vendor:04x}\n")
        self.write(f"{base}/device", f"0x{device:04x}\n")
        self.write(f"{base}/class", f"0x{pci_class:06x}\n")
        if driver is not None:
            self.mkdir(f"sys/bus/pci/drivers/{driver}")
            self.symlink(f"{base}/driver", f"../../../../bus/pci/drivers/{driver}")
        return self.path / base

    # -- NVIDIA -------------------------------------------------------------------
    def nvidia_gpu(
        self,
        address: str,
        *,
        device: int = 0x2330,
        model: str | None = "NVIDIA H100 80GB HBM3",
        uuid: str | None = None,
        minor: int = 0,
        pci_class: int = 0x030200,
        driver: str | None = "nvidia",
    ) -> Path:
        """A GPU on the PCI bus plus its ``/proc/driver/nvidia`` entry (when ``model``)."""
        path = self.pci_device(
            address, vendor=0x10DE, device=device, pci_class=pci_class, driver=driver
        )
        if model is not None:
            uuid = uuid or f"GPU-{minor:08x}-b60b-a624-bf14-0a1819cfda3b"
            self.write(
                f"proc/driver/nvidia/gpus/{address}/information",
                f"Model: \t\t {model}\n"
                "IRQ:   \t\t 10\n"
                f"GPU UUID: \t {uuid}\n"
                "Video BIOS: \t 96.00.99.00.01\n"
                "Bus Type: \t PCIe\n"
                "DMA Size: \t 52 bits\n"
                "DMA Mask: \t 0xfffffffffffff\n"
                f"Bus Location: \t {address}\n"
                f"Device Minor: \t {minor}\n"
                "GPU Firmware: \t 535.129.03\n"
                "GPU Excluded:\t No\n",
            )
            self.touch(f"dev/nvidia{minor}")
        return path

    # -- AMD ----------------------------------------------------------------------
    def kfd_node(
        self,
        index: int,
        *,
        gfx_target_version: int,
        device_id: int = 0,
        unique_id: int = 0,
        name: str = "",
        banks: tuple[tuple[int, int], ...] = (),
    ) -> Path:
        """A KFD topology node; ``banks`` are ``(heap_type, size_in_bytes)`` pairs."""
        base = f"sys/class/kfd/kfd/topology/nodes/{index}"
        is_gpu = gfx_target_version != 0
        self.write(
            f"{base}/properties",
            f"cpu_cores_count {0 if is_gpu else 96}\n"
            f"simd_count {1216 if is_gpu else 0}\n"
            f"mem_banks_count {len(banks)}\n"
            f"gfx_target_version {gfx_target_version}\n"
            f"vendor_id {4098 if is_gpu else 0}\n"
            f"device_id {device_id}\n"
            f"location_id {256 * index}\n"
            "domain 0\n"
            f"drm_render_minor {128 + index if is_gpu else 0}\n"
            f"unique_id {unique_id}\n"
            "num_xcc 8\n",
        )
        self.write(f"{base}/name", f"{name}\n")
        for i, (heap_type, size) in enumerate(banks):
            self.write(
                f"{base}/mem_banks/{i}/properties",
                f"heap_type {heap_type}\nsize_in_bytes {size}\nflags 0\nwidth 4096\n",
            )
        return self.path / base

    # -- CPU ----------------------------------------------------------------------
    def cpuinfo(
        self,
        *,
        model_name: str,
        flags: str,
        processors: int = 2,
        vendor_id: str = "GenuineIntel",
    ) -> Path:
        blocks = [
            f"processor\t: {n}\nvendor_id\t: {vendor_id}\ncpu family\t: 6\nmodel\t\t: 143\n"
            f"model name\t: {model_name}\nflags\t\t: {flags}\n"
            for n in range(processors)
        ]
        return self.write("proc/cpuinfo", "\n".join(blocks) + "\n")

    def arm_cpuinfo(self, *, processors: int = 2, features: str = ARM_FEATURES) -> Path:
        blocks = [
            f"processor\t: {n}\nBogoMIPS\t: 50.00\nFeatures\t: {features}\n"
            "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: 0xd4f\n"
            for n in range(processors)
        ]
        return self.write("proc/cpuinfo", "\n".join(blocks) + "\n")

    def meminfo(self, total_bytes: int) -> Path:
        kib = total_bytes // 1024
        return self.write(
            "proc/meminfo",
            f"MemTotal:       {kib} kB\nMemFree:        {kib // 2} kB\n"
            f"MemAvailable:   {kib // 2} kB\n",
        )

    def numa_nodes(self, *ids: int) -> None:
        for n in ids:
            self.write(f"sys/devices/system/node/node{n}/cpulist", f"{n * 48}-{n * 48 + 47}\n")
        self.write("sys/devices/system/node/online", ",".join(str(n) for n in ids) + "\n")


# -- whole machines ------------------------------------------------------------------


def _host_noise(root: FakeRoot) -> None:
    """Devices every server has: a host bridge, an Intel NIC, a Mellanox NIC."""
    root.pci_device("0000:00:00.0", vendor=0x8086, device=0x09A2, pci_class=0x060000)
    root.pci_device("0000:00:1f.6", vendor=0x8086, device=0x15FB, pci_class=0x020000)
    root.pci_device("0000:0c:00.0", vendor=0x15B3, device=0x1021, pci_class=0x020700)


def empty_box(path: Path) -> FakeRoot:
    """A machine with no accelerator: a CPU, memory and unrelated PCI devices."""
    root = FakeRoot(path)
    _host_noise(root)
    root.cpuinfo(
        model_name="AMD Ryzen 9 7950X 16-Core Processor",
        flags=DESKTOP_FLAGS,
        vendor_id="AuthenticAMD",
    )
    root.meminfo(64 * GiB)
    root.numa_nodes(0)
    return root


def nvidia_box(
    path: Path,
    *,
    count: int = 8,
    device: int = 0x2330,
    model: str | None = "NVIDIA H100 80GB HBM3",
) -> FakeRoot:
    """A DGX-like server: ``count`` GPUs, NVSwitches (bridge class), host devices."""
    root = FakeRoot(path)
    _host_noise(root)
    for minor, address in enumerate(DGX_ADDRESSES[:count]):
        root.nvidia_gpu(address, device=device, model=model, minor=minor)
    # NVSwitches are NVIDIA PCI functions of class "bridge": not GPUs.
    for i in range(4):
        root.pci_device(
            f"0000:{0xE0 + i:02x}:00.0",
            vendor=0x10DE,
            device=0x22A3,
            pci_class=0x068000,
            driver="nvidia",
        )
    root.touch("dev/nvidiactl")
    root.cpuinfo(model_name="Intel(R) Xeon(R) Platinum 8480C", flags=XEON_FLAGS)
    root.meminfo(2048 * GiB)
    root.numa_nodes(0, 1)
    return root


def amd_box(path: Path, *, count: int = 8) -> FakeRoot:
    """An MI300X server: two CPU nodes (gfx_target_version 0), then ``count`` GPUs."""
    root = FakeRoot(path)
    _host_noise(root)
    for cpu_node in (0, 1):
        root.kfd_node(cpu_node, gfx_target_version=0, banks=((0, 1024 * GiB),))
    for i in range(count):
        root.kfd_node(
            2 + i,
            gfx_target_version=90402,
            device_id=0x74A1,
            unique_id=0x4C1D2A0C4B5D1230 + i,
            name="ip discovery",
            banks=((1, 192 * GiB),),
        )
    root.touch("dev/kfd")
    return root


def habana_box(
    path: Path,
    *,
    count: int = 8,
    device: int = 0x1020,
    devices: tuple[int, ...] | None = None,
    module_ids: bool = True,
) -> FakeRoot:
    """A Gaudi 2 server: PCI functions, ``module_id`` files and ``/dev/accel`` nodes.

    ``devices`` gives one PCI device id per card (overriding ``count``/``device``).
    """
    root = FakeRoot(path)
    _host_noise(root)
    ids = devices if devices is not None else (device,) * count
    count = len(ids)
    for i, device_id in enumerate(ids):
        address = f"0000:{0x19 + 0x10 * i:02x}:00.0"
        pci = root.pci_device(
            address, vendor=0x1DA3, device=device_id, pci_class=0x120000, driver="habanalabs"
        )
        root.touch(f"dev/accel/accel{i}")
        root.touch(f"dev/accel/accel_controlD{i}")
        if not module_ids:
            continue
        # The driver numbers accel minors in probe order; module ids follow
        # the board wiring, so they differ from the bus order.
        module_id = (i + 4) % count
        root.write(str(pci.relative_to(root.path) / f"accel/accel{i}/module_id"), f"{module_id}\n")
    return root


def intel_discrete_box(
    path: Path,
    *,
    device: int = 0x0BD5,
    count: int = 2,
    driver: str = "xe",
    tiles: int = 2,
    vram_per_tile: int = 64 * GiB,
) -> FakeRoot:
    """Discrete Intel GPUs: xe publishes per-tile VRAM, i915 ``lmem_total_bytes``."""
    root = FakeRoot(path)
    _host_noise(root)
    for i in range(count):
        address = f"0000:{0x3A + 0x20 * i:02x}:00.0"
        pci = root.pci_device(
            address, vendor=0x8086, device=device, pci_class=0x038000, driver=driver
        )
        rel = pci.relative_to(root.path)
        if driver == "xe":
            for tile in range(tiles):
                root.write(f"{rel}/tile{tile}/physical_vram_size_bytes", f"{vram_per_tile}\n")
                root.mkdir(f"{rel}/tile{tile}/gt{tile}")
        else:
            root.write(f"{rel}/drm/card{i}/lmem_total_bytes", f"{vram_per_tile * tiles}\n")
    return root


def intel_integrated_box(path: Path, *, driver: str = "i915", device: int = 0x46A6) -> FakeRoot:
    """A laptop: an integrated GPU at 00:02.0 (VGA class) and no device-local memory."""
    root = FakeRoot(path)
    pci = root.pci_device(
        "0000:00:02.0", vendor=0x8086, device=device, pci_class=0x030000, driver=driver
    )
    rel = pci.relative_to(root.path)
    root.mkdir(f"{rel}/drm/card0")
    if driver == "xe":
        # xe still creates tile0/gt0 on integrated parts, just no VRAM file.
        root.mkdir(f"{rel}/tile0/gt0")
    root.cpuinfo(model_name="12th Gen Intel(R) Core(TM) i7-1260P", flags=DESKTOP_FLAGS)
    root.meminfo(16 * GiB)
    return root


def jetson_box(path: Path, *, model: str = "NVIDIA Jetson AGX Orin Developer Kit") -> FakeRoot:
    """A Jetson module: no PCI GPU, the L4T release file and a device-tree model."""
    root = FakeRoot(path)
    root.write(
        "etc/nv_tegra_release",
        "# R36 (release), REVISION: 3.0, GCID: 36923193, BOARD: generic, EABI: aarch64\n",
    )
    root.write("proc/device-tree/model", model.encode() + b"\x00")
    root.arm_cpuinfo(processors=12)
    root.meminfo(64 * GiB)
    return root
