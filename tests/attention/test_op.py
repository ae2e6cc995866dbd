"""The ``hwplug::unified_attention`` custom op, eagerly and under torch.compile."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
import torch

from hwplug.attention import (
    AttentionMetadata,
    TorchAttentionBackend,
    register_unified_attention,
    unified_attention,
)
from hwplug.compilation import PiecewiseBackend
from hwplug.core.config import CompilationConfig
from tests.attention.helpers import make_batch

HEADS, KV_HEADS, HEAD_SIZE = 4, 2, 32


def test_the_op_is_registered_on_first_use_not_at_import() -> None:
    script = textwrap.dedent(
        """
        import torch
        import hwplug, hwplug.attention
        assert not hasattr(torch.ops.hwplug, "unified_attention")
        op = hwplug.attention.register_unified_attention()
        assert op is torch.ops.hwplug.unified_attention
        assert hwplug.attention.register_unified_attention() is op
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def test_schema_mutates_only_the_caches() -> None:
    schema = register_unified_attention().default._schema
    mutated = [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write]
    assert mutated == ["key_cache", "value_cache"]
    assert [a.name for a in schema.arguments][-3:] == ["backend", "scale", "sliding_window"]


@pytest.mark.parametrize("fp8", [False, True])
def test_the_op_equals_the_backend_s_forward(fp8: bool) -> None:
    cache_dtype = torch.float8_e4m3fn if fp8 else None
    batch = make_batch(
        [7, 12, 3],
        [7, 1, 2],
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_size=HEAD_SIZE,
        block_size=4,
        cache_dtype=cache_dtype,
        padding=2,
    )
    k_scale = torch.tensor(0.02) if fp8 else 1.0
    caches = (batch.key_cache.clone(), batch.value_cache.clone())
    impl = TorchAttentionBackend(
        HEADS, HEAD_SIZE, KV_HEADS, 0.2, sliding_window=5, cache_dtype=batch.key_cache.dtype
    )
    want = impl.forward(
        batch.query, batch.key, batch.value, *caches, batch.metadata, k_scale=k_scale, v_scale=0.5
    )
    got = unified_attention(
        batch.query,
        batch.key,
        batch.value,
        batch.key_cache,
        batch.value_cache,
        batch.metadata,
        backend="torch",
        scale=0.2,
        sliding_window=5,
        k_scale=k_scale,
        v_scale=0.5,
    )
    assert torch.equal(got, want)
    assert torch.equal(batch.key_cache.view(torch.uint8), caches[0].view(torch.uint8))


@pytest.mark.parametrize("which", ["k_scale", "v_scale"])
@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf"), "1"])
def test_the_op_refuses_the_scales_forward_refuses(which: str, scale: object) -> None:
    batch = make_batch(
        [5], [5], num_heads=HEADS, num_kv_heads=KV_HEADS, head_size=HEAD_SIZE, block_size=4
    )
    with pytest.raises(ValueError, match=f"{which} must be a positive finite float"):
        unified_attention(
            *batch.args(),
            backend="torch",
            scale=0.2,
            **{which: scale},  # type: ignore[arg-type]
        )


def test_an_unknown_backend_name_is_a_config_error() -> None:
    from hwplug.core.errors import ConfigError

    batch = make_batch([2], [2], num_heads=2, num_kv_heads=1, head_size=32, block_size=4)
    with pytest.raises(ConfigError, match="unknown attention backend 'flash'"):
        unified_attention(
            batch.query,
            batch.key,
            batch.value,
            batch.key_cache,
            batch.value_cache,
            batch.metadata,
            backend="flash",
            scale=0.1,
        )


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        width = HEADS * HEAD_SIZE
        self.q = torch.nn.Linear(width, width)
        self.kv = torch.nn.Linear(width, 2 * KV_HEADS * HEAD_SIZE)
        self.out = torch.nn.Linear(width, width)

    def forward(
        self,
        x: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        n = x.shape[0]
        q = self.q(x).view(n, HEADS, HEAD_SIZE)
        k, v = self.kv(x).view(n, 2, KV_HEADS, HEAD_SIZE).unbind(1)
        attn = unified_attention(
            q,
            k,
            v,
            key_cache,
            value_cache,
            metadata,
            backend="torch",
            scale=HEAD_SIZE**-0.5,
        )
        return x + self.out(attn.reshape(n, -1))


class Model(torch.nn.Module):
    """Prologue, two attention layers (each with its own cache), epilogue."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList([Layer(), Layer()])

    def forward(
        self,
        x: torch.Tensor,
        caches: list[tuple[torch.Tensor, torch.Tensor]],
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        x = x * 2
        for layer, (key_cache, value_cache) in zip(self.layers, caches):
            x = layer(x, key_cache, value_cache, metadata)
        return torch.relu(x)


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("use_inductor", [False, True], ids=["eager-pieces", "inductor"])
def test_piecewise_compilation_splits_at_the_op(use_inductor: bool) -> None:
    register_unified_attention()
    batch = make_batch(
        [5, 17, 9],
        [5, 4, 1],
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_size=HEAD_SIZE,
        block_size=4,
        padding=3,
    )
    x = torch.randn(batch.metadata.num_tokens, HEADS * HEAD_SIZE)
    model = Model()

    def caches() -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(batch.key_cache.clone(), batch.value_cache.clone()) for _ in range(2)]

    eager_caches, compiled_caches = caches(), caches()
    config = CompilationConfig(
        level=3, splitting_ops=["hwplug.unified_attention"], use_inductor=use_inductor
    )
    backend = PiecewiseBackend(config)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with torch.no_grad():
        want = model(x, eager_caches, batch.metadata)
        got = compiled(x, compiled_caches, batch.metadata)

    # prologue | attention | between | attention | epilogue
    assert backend.num_pieces == 5
    assert len(backend.splitting_piece_names) == 2
    assert backend.compiled_piece_names == [
        n for n in backend.piece_names if n not in backend.splitting_piece_names
    ]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for (k1, v1), (k2, v2) in zip(eager_caches, compiled_caches):
        assert torch.equal(k1, k2)
        assert torch.equal(v1, v2)


@pytest.mark.usefixtures("fresh_dynamo")
def test_the_fake_implementation_traces_shapes() -> None:
    register_unified_attention()
    batch = make_batch([3, 4], [1, 4], num_heads=4, num_kv_heads=1, head_size=32, block_size=2)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = unified_attention(
            q, k, v, batch.key_cache, batch.value_cache, batch.metadata, backend="torch", scale=1.0
        )
        return out.sum(-1)

    compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)
    out = compiled(batch.query, batch.key, batch.value)
    assert out.shape == (5, 4)


def test_the_op_follows_plugins_registered_and_unregistered() -> None:
    import hwplug
    from hwplug.core.errors import ConfigError
    from hwplug.plugins import manager

    calls: list[str] = []

    def backend_named(tag: str) -> type:
        class Tagged(TorchAttentionBackend):
            name = "tagged"

            def attend(self, *args: object, **kwargs: object) -> torch.Tensor:
                calls.append(tag)
                return super().attend(*args, **kwargs)  # type: ignore[arg-type]

        return Tagged

    def provider(backend: type) -> object:
        class Provides:
            @hwplug.hookimpl
            def hwplug_attention_backends(self) -> list[type]:
                return [backend]

        return Provides()

    batch = make_batch(
        [5], [5], num_heads=HEADS, num_kv_heads=KV_HEADS, head_size=HEAD_SIZE, block_size=4
    )
    pm = manager.get_plugin_manager()
    pm.register(provider(backend_named("first")), name="tagged-provider")
    try:
        unified_attention(*batch.args(), backend="tagged", scale=0.2)
        assert calls == ["first"]
    finally:
        pm.unregister(name="tagged-provider")
    with pytest.raises(ConfigError, match="unknown attention backend 'tagged'"):
        unified_attention(*batch.args(), backend="tagged", scale=0.2)
    pm.register(provider(backend_named("second")), name="tagged-provider")
    try:
        unified_attention(*batch.args(), backend="tagged", scale=0.2)
        assert calls == ["first", "second"]
    finally:
        pm.unregister(name="tagged-provider")
