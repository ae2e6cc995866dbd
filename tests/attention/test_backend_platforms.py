"""A backend serves the platforms it declares (``platforms``), or, when it declares none,
the platforms its own distribution provides: with several vendors installed, one vendor's
backend is never chosen, suggested or checked on another vendor's platform."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import hwplug
from hwplug.attention import (
    ANY_PLATFORM,
    BUILTIN_BACKENDS,
    BackendTable,
    TorchAttentionBackend,
    backends_for,
    collect_backends,
)
from hwplug.core.config import EngineConfig
from hwplug.core.errors import ConfigError, PluginError
from hwplug.core.platform import DeviceInfo, Platform
from tests.plugins.distributions import clean_env, make_distribution, run_python

# Two vendors written as real distributions: "vela" leaves its backend's platforms
# unset (it serves its own distribution's platform), "kite" declares them.
VENDOR = """
import hwplug
from hwplug.attention import TorchAttentionBackend
from hwplug.core.platform import DeviceInfo, Platform


class {cls}Attention(TorchAttentionBackend):
    name = {name!r}
{declared}

class {cls}Platform(Platform):
    name = {name!r}
    device_type = "cpu"
    priority = {priority}
    attention_order = ({name!r}, "torch")

    @classmethod
    def profiles(cls):
        return {{{profile!r}: DeviceInfo({cls!r} + " One", 1 << 30)}}

    @classmethod
    def detect(cls):
        return []


@hwplug.hookimpl
def hwplug_platforms():
    return [{cls}Platform]


@hwplug.hookimpl
def hwplug_attention_backends():
    return [{cls}Attention]
"""

PROBE = """
import json, warnings
warnings.simplefilter("ignore")
import hwplug
from hwplug.attention import backends_for
from hwplug.conformance import run_checks
from hwplug.core.config import EngineConfig

out = {}
for profile in ("vela-1", "kite-1"):
    default = hwplug.resolve(platform=profile)
    out[profile] = {"default": default.config.attention.backend,
                    "eligible": sorted(backends_for(default.platform)),
                    "explicit": {}}
    for backend in ("vela", "kite", "torch"):
        config = EngineConfig.from_dict({"attention": {"backend": backend}})
        try:
            hwplug.resolve(config, platform=profile)
            out[profile]["explicit"][backend] = "ok"
        except hwplug.ConfigError as exc:
            out[profile]["explicit"][backend] = str(exc)
report = run_checks("kite-1", kinds=["rule"])
out["R13"] = [r.outcome for r in report.results if r.id == "R13"]
print(json.dumps(out))
"""


def _vendor(site: Path, dist: str, name: str, priority: int, declared: str) -> None:
    make_distribution(
        site,
        dist,
        entry_points={"hwplug.platforms": {name: f"{name}_plugin"}},
        modules={
            f"{name}_plugin.py": VENDOR.format(
                cls=name.capitalize(),
                name=name,
                priority=priority,
                profile=f"{name}-1",
                declared=declared,
            )
        },
    )


def test_two_vendors_installed_side_by_side_keep_to_their_own_platforms(
    tmp_path: Path,
) -> None:
    site = tmp_path / "site"
    _vendor(site, "vela-npu", "vela", 60, "")
    _vendor(site, "kite-npu", "kite", 61, '    platforms = ("kite",)\n')
    result = run_python(PROBE, paths=[site], env=clean_env(HWPLUG_PLUGINS="vela,kite"))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])

    vela, kite = out["vela-1"], out["kite-1"]
    assert (vela["default"], kite["default"]) == ("vela", "kite")
    assert vela["eligible"] == ["torch", "triton", "vela"]
    assert kite["eligible"] == ["kite", "torch", "triton"]
    assert vela["explicit"]["vela"] == kite["explicit"]["kite"] == "ok"
    assert vela["explicit"]["torch"] == kite["explicit"]["torch"] == "ok"

    # vela's backend on kite's platform: refused, naming who provides it and what it serves
    refused = kite["explicit"]["vela"]
    assert "attention.backend='vela' (set by the user) cannot run on" in refused
    assert "plugin 'vela' (distribution 'vela-npu')" in refused
    assert "serves platform 'vela' only (the platforms its distribution provides)" in refused
    assert "is platform 'kite'" in refused
    assert "use attention.backend='kite' (or 'torch')" in refused  # never 'vela'
    # kite's declared scope keeps it off vela's platform
    refused = vela["explicit"]["kite"]
    assert "plugin 'kite' (distribution 'kite-npu') serves platform 'kite' only" in refused
    assert "(the platforms its distribution provides)" not in refused
    assert "use attention.backend='vela' (or 'torch')" in refused
    assert out["R13"] == ["pass"]


@pytest.mark.skipif(
    importlib.util.find_spec("acme_npu") is None or importlib.util.find_spec("zeta_tpu") is None,
    reason="examples/acme_npu and tests/vendor/zeta_tpu are not both installed",
)
def test_installed_acme_and_zeta_backends_stay_on_their_platforms() -> None:
    for backend, profile, owner in (("acme", "zeta-t1", "acme"), ("zeta", "acme-n2", "zeta")):
        config = EngineConfig.from_dict({"attention": {"backend": backend}})
        with pytest.raises(ConfigError, match=f"attention backend of plugin '{owner}") as info:
            hwplug.resolve(config, platform=profile)
        assert f"'{backend}')" not in str(info.value).split("; use ")[-1]
    assert "acme" not in backends_for(hwplug.resolve(platform="zeta-t1").platform)
    assert "zeta" not in backends_for(hwplug.resolve(platform="acme-n2").platform)


# --------------------------------------------------------------------------- the table


class Declared(TorchAttentionBackend):
    name = "declared"
    platforms = ("npu",)


class Inferred(TorchAttentionBackend):
    name = "inferred"


class Everywhere(TorchAttentionBackend):
    name = "everywhere"
    platforms = (ANY_PLATFORM,)


def _own(provided: dict[str, set[str]]):  # type: ignore[no-untyped-def]
    return lambda plugin, distribution: provided.get(distribution, set())


def test_scopes_declared_inferred_and_unrestricted() -> None:
    table = collect_backends(
        BUILTIN_BACKENDS,
        [
            ("acme", "acme-npu", [Declared, Inferred, Everywhere]),
            (
                "kernels",
                "kernel-pack",
                [type("Loose", (TorchAttentionBackend,), {"name": "loose"})],
            ),
        ],
        _own({"acme-npu": {"npu", "npu2"}}),
    )
    assert isinstance(table, BackendTable)
    assert table.scope("torch") is None and table.scope("triton") is None
    assert table.scope("declared") == ("npu",)
    assert table.scope("inferred") == ("npu", "npu2")
    assert table.scope("everywhere") is None
    assert table.scope("loose") is None  # its distribution provides no platform
    assert table.owner("declared") == "plugin 'acme' (distribution 'acme-npu')"
    cuda = hwplug.resolve(platform="h100").platform
    assert set(table.for_platform(cuda)) == {"torch", "triton", "everywhere", "loose"}
    problem = table.problem("inferred", EngineConfig(), cuda)
    assert problem is not None
    assert "serves platforms 'npu' and 'npu2' only (the platforms its distribution" in problem


def test_a_declared_scope_is_honoured_by_the_class_itself() -> None:
    cuda = hwplug.resolve(platform="h100").platform
    problem = Declared.problem(EngineConfig(), cuda)
    assert problem is not None and "serves platform 'npu' only" in problem
    assert Everywhere.problem(EngineConfig(), cuda) is None


@pytest.mark.parametrize("bad", ["npu", ("NPU",), (3,), {"npu": 1}])
def test_a_malformed_platforms_value_is_the_plugins_fault(bad: object) -> None:
    cls = type("Bad", (TorchAttentionBackend,), {"name": "bad", "platforms": bad})
    with pytest.raises(PluginError, match="whose platforms is .*use None, a tuple of platform"):
        collect_backends(BUILTIN_BACKENDS, [("acme", "acme-npu", [cls])])


def test_builtins_serve_every_platform_without_a_session() -> None:
    cpu = hwplug.resolve(platform="cpu").platform
    assert {"torch", "triton"} <= set(backends_for(cpu))


class RiverPlatform(Platform):
    """Names another vendor's backend first in its order: R13 must fail it."""

    name = "river"
    device_type = "cpu"
    priority = 40
    attention_order = ("vela", "torch")

    @classmethod
    def profiles(cls) -> dict[str, DeviceInfo]:
        return {"river-1": DeviceInfo("River One", 1 << 30)}


class VelaPlatform(RiverPlatform):
    name = "vela"
    attention_order = ("vela", "torch")

    @classmethod
    def profiles(cls) -> dict[str, DeviceInfo]:
        return {"vela-1": DeviceInfo("Vela One", 1 << 30)}


class VelaAttention(TorchAttentionBackend):
    name = "vela"


class VelaPlugin:
    @hwplug.hookimpl
    def hwplug_platforms(self) -> list[type]:
        return [VelaPlatform]

    @hwplug.hookimpl
    def hwplug_attention_backends(self) -> list[type]:
        return [VelaAttention]


class RiverPlugin:
    @hwplug.hookimpl
    def hwplug_platforms(self) -> list[type]:
        return [RiverPlatform]


def test_the_conformance_kit_fails_an_order_that_names_another_vendors_backend() -> None:
    from hwplug.conformance import run_checks
    from hwplug.plugins.manager import HwplugPluginManager, Session

    manager = HwplugPluginManager(strict=True)
    manager.load_builtins()
    manager.register(VelaPlugin(), name="vela")  # plain register(): scoped by plugin
    manager.register(RiverPlugin(), name="river")
    session = Session(manager)
    assert session.attention_backends().scope("vela") == ("vela",)
    with session.activate():
        report = run_checks("river-1", kinds=["rule"], session=session)
    (r13,) = [r for r in report.results if r.id == "R13"]
    assert r13.outcome == "fail", r13.reason
    assert "names 'vela', which do not serve platform 'river'" in r13.reason
    # resolution on river skips vela for the same reason, and says so
    resolution = session.resolve(platform="river-1")
    assert resolution.config.attention.backend == "torch"
    why = resolution.changes_to("attention.backend")[-1].reason
    assert "vela: the vela attention backend of plugin 'vela' serves platform 'vela' only" in why
