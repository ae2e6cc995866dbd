"""Hardware probes that read the operating system and never import torch.

Each probe answers "which devices of this kind does this process see?" from
what the kernel publishes, so that platform detection costs a few file reads,
initialises no device runtime and leaves a later ``fork`` safe. Vendor
management libraries (NVML, amdsmi) are used when installed, because they
know names, memory and capability exactly; they talk to the kernel driver,
not to the CUDA/HIP runtime.

Every probe takes a filesystem ``root`` (default: ``$HWPLUG_PROBE_ROOT`` or
``/``) under which it reads ``sys``, ``proc``, ``dev`` and ``etc``, so tests
build fake trees for each vendor, and an ``env`` mapping (default:
``os.environ``) for the visibility variables. Vendor libraries are consulted
only when ``root`` is the real ``/``. A missing, unreadable or malformed file
makes a probe skip what it describes (logged at debug level on the
``hwplug.probes`` logger); a probe never raises for the state of the machine.

Each probe lives in its platform's folder (``hwplug/platforms/<name>/probe.py``)
and shares the bounded readers of :mod:`hwplug.platforms.sysfs`; this module
is where they are imported from. Sources, per probe:

NVIDIA (:func:`probe_nvidia`)
    NVML (``pynvml`` from nvidia-ml-py): name, memory, compute capability and
    UUID of every GPU. Without it, PCI functions in ``/sys/bus/pci/devices``
    with vendor ``0x10de`` and a display class (``0x03xxxx``), named from
    ``/proc/driver/nvidia/gpus/<address>/information`` ("Model:", "GPU UUID:")
    and completed from a table of known PCI device ids. Jetson modules have
    no PCI GPU: ``/etc/nv_tegra_release`` or ``/sys/class/tegra-firmware``
    marks the integrated GPU, named from ``/proc/device-tree/model``.
    ``CUDA_VISIBLE_DEVICES`` applies.
AMD (:func:`probe_amd`)
    amdsmi, else the KFD topology ``/sys/class/kfd/kfd/topology/nodes/*``:
    ``properties`` (``gfx_target_version`` is 0 on CPU nodes), memory banks
    and ``name``. ``ROCR_VISIBLE_DEVICES`` then ``HIP_VISIBLE_DEVICES`` (or
    ``CUDA_VISIBLE_DEVICES``, which HIP also reads) apply.
Intel Gaudi (:func:`probe_habana`)
    PCI vendor ``0x1da3``, generation from the device id; the habanalabs
    driver's ``/dev/accel/accel*`` (or older ``/dev/hl*``) nodes must exist.
    ``HABANA_VISIBLE_MODULES`` (module ids) applies.
Intel GPU (:func:`probe_intel_gpu`)
    PCI vendor ``0x8086`` display devices bound to ``xe`` or ``i915`` that
    have device-local memory; integrated GPUs never count.
    ``ZE_AFFINITY_MASK`` applies.
CPU (:func:`probe_cpu`, :func:`cpu_numa_nodes`)
    ``/proc/cpuinfo`` for the model and ISA flags, psutil (or
    ``/proc/meminfo``) for memory, ``/sys/devices/system/node`` for NUMA
    nodes (``CPU_VISIBLE_MEMORY_NODES`` applies).

Visibility variables follow the CUDA convention: unset means all devices; an
empty value (or ``-1``) means none, except for ``ZE_AFFINITY_MASK`` and
``CPU_VISIBLE_MEMORY_NODES``, where empty means all; entries are taken in
order and an invalid entry (unknown index or id, or a repeat) ends the list
there.
"""

from __future__ import annotations

from hwplug.platforms.cpu.probe import cpu_numa_nodes, ipex_available, probe_cpu
from hwplug.platforms.cuda.probe import probe_nvidia
from hwplug.platforms.hpu.probe import probe_habana
from hwplug.platforms.rocm.probe import probe_amd
from hwplug.platforms.sysfs import PROBE_ROOT_ENV, library_text
from hwplug.platforms.xpu.probe import probe_intel_gpu

__all__ = [
    "PROBE_ROOT_ENV",
    "cpu_numa_nodes",
    "ipex_available",
    "library_text",
    "probe_amd",
    "probe_cpu",
    "probe_habana",
    "probe_intel_gpu",
    "probe_nvidia",
]
