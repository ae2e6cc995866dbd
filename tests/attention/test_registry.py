"""Backend registry helpers: collecting plugin backends and looking names up."""

from __future__ import annotations

import pytest

from hwplug.attention import (
    BUILTIN_BACKENDS,
    AttentionBackend,
    TorchAttentionBackend,
    TritonAttentionBackend,
    available_backends,
    collect_backends,
    get_backend,
    lookup_backend,
)
from hwplug.core.errors import ConfigError, PluginError
from hwplug.core.graphs import AttentionGraphSupport


class NpuAttention(AttentionBackend):
    name = "acme_npu"
    graph_support = AttentionGraphSupport.UNIFORM_BATCH
    device_types = ("npu",)


class OtherNpuAttention(AttentionBackend):
    name = "acme_npu"


def test_builtins_are_torch_and_triton() -> None:
    assert dict(BUILTIN_BACKENDS) == {
        "torch": TorchAttentionBackend,
        "triton": TritonAttentionBackend,
    }
    with pytest.raises(TypeError):
        BUILTIN_BACKENDS["x"] = NpuAttention  # type: ignore[index]


def test_get_backend_and_available_backends() -> None:
    assert get_backend("triton") is TritonAttentionBackend
    backends = available_backends()
    # the built-ins, plus the backends of installed plugins (acme_npu's "acme", say)
    assert dict(BUILTIN_BACKENDS).items() <= backends.items()
    backends.clear()  # a copy: the registry is untouched
    assert get_backend("torch") is TorchAttentionBackend


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown attention backend 'flash'; known backends: "):
        get_backend("flash")
    with pytest.raises(ConfigError, match="known backends: torch, triton$"):
        lookup_backend(3, BUILTIN_BACKENDS)


def test_a_wrongly_cased_name_gets_a_hint() -> None:
    with pytest.raises(ConfigError, match=r"names are lower case: 'triton'"):
        get_backend("Triton")


def test_plugins_add_backends() -> None:
    table = collect_backends(BUILTIN_BACKENDS, [("acme", "acme-npu", [NpuAttention])])
    assert table == {**BUILTIN_BACKENDS, "acme_npu": NpuAttention}
    assert lookup_backend("acme_npu", table) is NpuAttention


def test_a_class_returned_twice_is_harmless() -> None:
    results = [("acme", "acme-npu", [NpuAttention, NpuAttention]), ("b", "", (NpuAttention,))]
    assert collect_backends(BUILTIN_BACKENDS, results)["acme_npu"] is NpuAttention


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (NpuAttention, "returned <class .*NpuAttention'> from hwplug_attention_backends\\(\\); "),
        (None, "returned None from hwplug_attention_backends"),
        ([object], "returned <class 'object'> from .*every entry must be a subclass of hwplug"),
        (["torch"], "returned 'torch' from"),
    ],
)
def test_bad_results_name_the_plugin(result: object, message: str) -> None:
    prefix = r"plugin 'acme' \(distribution 'acme-npu'\) "
    with pytest.raises(PluginError, match=prefix + message):
        collect_backends(BUILTIN_BACKENDS, [("acme", "acme-npu", result)])


@pytest.mark.parametrize("name", ["", "Acme", "1npu", "has space", None])
def test_bad_names_are_plugin_errors(name: object) -> None:
    cls = type("Bad", (AttentionBackend,), {"name": name})
    with pytest.raises(
        PluginError, match=r"plugin 'acme' returned attention backend Bad with name"
    ):
        collect_backends(BUILTIN_BACKENDS, [("acme", "", [cls])])


def test_bad_graph_support_is_a_plugin_error() -> None:
    cls = type("Bad", (AttentionBackend,), {"name": "bad", "graph_support": "ALWAYS"})
    with pytest.raises(PluginError, match="graph_support is 'ALWAYS'; use an"):
        collect_backends(BUILTIN_BACKENDS, [("acme", "", [cls])])


def test_a_name_claimed_by_two_plugins_names_both() -> None:
    results = [("acme", "acme-npu", [NpuAttention]), ("rival", "rival-dist", [OtherNpuAttention])]
    with pytest.raises(PluginError) as info:
        collect_backends(BUILTIN_BACKENDS, results)
    message = str(info.value)
    assert "attention backend name 'acme_npu' is claimed twice" in message
    assert "plugin 'acme' (distribution 'acme-npu')" in message
    assert "plugin 'rival' (distribution 'rival-dist')" in message


def test_a_plugin_cannot_take_a_built_in_name() -> None:
    impostor = type("Impostor", (AttentionBackend,), {"name": "triton"})
    with pytest.raises(PluginError, match="'triton' is claimed twice: by hwplug's built-in"):
        collect_backends(BUILTIN_BACKENDS, [("acme", "", [impostor])])
