"""AttentionCall: one object carries a layer's call through forward, attend and the op."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hwplug.attention import (
    AttentionCall,
    TorchAttentionBackend,
    TorchAttentionStep,
    forward_context,
    unified_attention,
)
from tests.attention.helpers import Batch, make_batch

HEADS, KV_HEADS, HEAD_SIZE, BLOCK = 4, 2, 32, 4


def _batch() -> Batch:
    return make_batch(
        [7, 3],
        [3, 1],
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_size=HEAD_SIZE,
        block_size=BLOCK,
    )


def _fresh(batch: Batch) -> Batch:
    return dataclasses.replace(
        batch, key_cache=batch.key_cache.clone(), value_cache=batch.value_cache.clone()
    )


class Recording(TorchAttentionBackend):
    """The torch backend, keeping every call its ``attend`` gets."""

    name = "recording"
    calls: list[AttentionCall] = []

    def attend(self, call: AttentionCall) -> torch.Tensor:
        type(self).calls.append(call)
        return super().attend(call)


def test_a_call_holds_forwards_arguments_and_metadata() -> None:
    batch = _batch()
    call = AttentionCall(*batch.args(), k_scale=0.5)
    assert call.query is batch.query and call.value_cache is batch.value_cache
    assert call.metadata is batch.metadata
    assert (call.k_scale, call.v_scale) == (0.5, 1.0)
    step = TorchAttentionBackend.prepare(
        batch.metadata, num_blocks=batch.key_cache.shape[0], block_size=BLOCK
    )
    prepared = dataclasses.replace(call, step=step)
    assert prepared.metadata is batch.metadata and prepared.query is call.query
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.query = batch.key  # type: ignore[misc]


def test_forward_call_is_forward() -> None:
    batch = _batch()
    impl = TorchAttentionBackend(HEADS, HEAD_SIZE, KV_HEADS, 0.2)
    first, second = _fresh(batch), _fresh(batch)
    want = impl.forward(*first.args())
    got = impl.forward_call(AttentionCall(*second.args()))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(second.key_cache, first.key_cache, rtol=0, atol=0)


def test_attend_gets_the_prepared_step_in_the_call() -> None:
    batch = _batch()
    Recording.calls = []
    Recording(HEADS, HEAD_SIZE, KV_HEADS, 0.2).forward(*batch.args(), k_scale=1.0)
    (call,) = Recording.calls
    assert isinstance(call.step, TorchAttentionStep)
    assert call.metadata is batch.metadata
    assert call.query is batch.query and call.key_cache is batch.key_cache


def test_the_op_rebuilds_the_call_from_plain_tensors(request: pytest.FixtureRequest) -> None:
    import hwplug
    from hwplug.plugins import manager

    class Provides:
        @hwplug.hookimpl
        def hwplug_attention_backends(self) -> list[type]:
            return [Recording]

    batch = _batch()
    pm = manager.get_plugin_manager()
    pm.register(Provides(), name="recording-provider")
    request.addfinalizer(lambda: pm.unregister(name="recording-provider"))
    Recording.calls = []
    step = Recording.prepare(batch.metadata, num_blocks=batch.key_cache.shape[0], block_size=BLOCK)
    with forward_context(step):
        unified_attention(*batch.args(), backend="recording", scale=0.2, k_scale=0.5)
    (call,) = Recording.calls
    # the op's schema takes tensors: the call is rebuilt on the backend's side, with the
    # engine's prepared step and the scales as 0-d tensors
    assert call.step is step
    assert call.query is batch.query and call.value_cache is batch.value_cache
    assert isinstance(call.k_scale, torch.Tensor) and float(call.k_scale) == 0.5
    assert float(call.v_scale) == 1.0
