"""Simulated device profiles: the platforms.md table, as data."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hwplug.core.errors import ConfigError
from hwplug.core.platform import DeviceCapability, DeviceInfo
from hwplug.platforms.profiles import PROFILES, all_profiles, find_profile

GiB = 1 << 30

# platform -> profile -> (nominal memory in GiB/GB, capability, arch) from platforms.md.
TABLE: dict[str, dict[str, tuple[float, tuple[int, int] | None, str | None]]] = {
    "cuda": {
        "b200": (180, (10, 0), None),
        "h100": (80, (9, 0), None),
        "h200": (141, (9, 0), None),
        "a100": (80, (8, 0), None),
        "l4": (24, (8, 9), None),
        "rtx3090": (24, (8, 6), None),
        "t4": (16, (7, 5), None),
    },
    "rocm": {
        "mi300x": (192, (9, 4), "gfx942"),
        "mi325x": (256, (9, 4), "gfx942"),
        "mi355x": (288, (9, 5), "gfx950"),
        "mi250x": (64, (9, 0), "gfx90a"),
        "rx7900xtx": (24, (11, 0), "gfx1100"),
    },
    "hpu": {
        "gaudi": (32, None, "gaudi"),
        "gaudi2": (96, None, "gaudi2"),
        "gaudi3": (128, None, "gaudi3"),
    },
    "cpu": {
        "cpu-generic": (64, None, "x86_64"),
        "xeon-spr": (512, None, "x86_64"),
    },
    "xpu": {
        "max-1550": (128, None, "pvc"),
        "arc-a770": (16, None, "dg2"),
        "arc-b580": (12, None, "bmg"),
    },
}

VENDORS = {"cuda": "NVIDIA", "rocm": "AMD", "hpu": "Intel Habana", "xpu": "Intel"}

CASES = [
    (platform, profile, *row) for platform, rows in TABLE.items() for profile, row in rows.items()
]


def test_exactly_the_profiles_of_platforms_md() -> None:
    assert {p: set(table) for p, table in PROFILES.items()} == {
        p: set(rows) for p, rows in TABLE.items()
    }


@pytest.mark.parametrize(("platform", "profile", "memory", "capability", "arch"), CASES)
def test_profile_matches_the_table(
    platform: str,
    profile: str,
    memory: float,
    capability: tuple[int, int] | None,
    arch: str | None,
) -> None:
    device = PROFILES[platform][profile]
    assert isinstance(device, DeviceInfo)
    # Within 5% of the nominal figure (GB or GiB), whichever the vendor meant.
    assert memory * 0.95 * 10**9 <= device.total_memory <= memory * 1.05 * GiB
    if capability is None:
        assert device.capability is None
    else:
        assert isinstance(device.capability, DeviceCapability)
        assert device.capability == capability
    assert device.arch == arch
    if platform in VENDORS:
        assert device.vendor == VENDORS[platform]
    json.dumps(device.to_dict())


@pytest.mark.parametrize(
    ("profile", "name"),
    [
        ("h100", "NVIDIA H100 80GB HBM3"),
        ("a100", "NVIDIA A100-SXM4-80GB"),
        ("t4", "Tesla T4"),
        ("rtx3090", "NVIDIA GeForce RTX 3090"),
        ("mi300x", "AMD Instinct MI300X"),
        ("mi355x", "AMD Instinct MI355X"),
        ("rx7900xtx", "AMD Radeon RX 7900 XTX"),
        ("max-1550", "Intel(R) Data Center GPU Max 1550"),
        ("arc-a770", "Intel(R) Arc(TM) A770 Graphics"),
        ("xeon-spr", "Intel(R) Xeon(R) Platinum 8480+"),
    ],
)
def test_marketing_names(profile: str, name: str) -> None:
    assert find_profile(profile)[1].name == name


def test_exact_reported_memory_where_known() -> None:
    assert PROFILES["cuda"]["h100"].total_memory == 81559 * 2**20
    assert PROFILES["rocm"]["mi300x"].total_memory == 192 * GiB


def test_device_names_are_distinct() -> None:
    devices = [d for table in PROFILES.values() for d in table.values()]
    assert len({d.name for d in devices}) == len(devices)


def test_features() -> None:
    assert PROFILES["cpu"]["cpu-generic"].features == frozenset({"avx2"})
    assert PROFILES["cpu"]["xeon-spr"].features == frozenset(
        {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "ipex"}
    )
    assert "fp8" in PROFILES["hpu"]["gaudi2"].features
    assert "fp8" in PROFILES["hpu"]["gaudi3"].features
    assert "fp8" not in PROFILES["hpu"]["gaudi"].features
    assert all("ipex" not in d.features for d in PROFILES["xpu"].values())


def test_all_profiles_maps_each_profile_to_its_platform() -> None:
    mapping = all_profiles()
    assert len(mapping) == sum(len(t) for t in PROFILES.values())
    for platform, table in PROFILES.items():
        for profile in table:
            assert mapping[profile] == platform


@pytest.mark.parametrize("spelling", ["mi300x", "MI300X", " mi300x ", "mi300x:8"])
def test_find_profile_spellings(spelling: str) -> None:
    assert find_profile(spelling) == ("rocm", PROFILES["rocm"]["mi300x"])


def test_find_profile_unknown_lists_every_known_profile() -> None:
    with pytest.raises(ConfigError, match="unknown device profile 'h900'") as info:
        find_profile("h900")
    message = str(info.value)
    for profile in all_profiles():
        assert profile in message


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [("", "empty device profile"), ("h100:0", "positive integer"), ("h100:x", "positive integer")],
)
def test_find_profile_malformed(bad: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        find_profile(bad)


@pytest.mark.parametrize("bad", [None, 100, ("h100",)])
def test_find_profile_rejects_non_strings_as_config_error(bad: object) -> None:
    with pytest.raises(ConfigError, match="must be a string"):
        find_profile(bad)  # type: ignore[arg-type]


@given(st.text(max_size=20))
def test_find_profile_raises_only_config_error(name: str) -> None:
    try:
        platform, device = find_profile(name)
    except ConfigError:
        return
    assert device is PROFILES[platform][name.strip().lower().partition(":")[0].strip()]
