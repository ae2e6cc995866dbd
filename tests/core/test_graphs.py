"""Graph dispatch, runtime-mode resolution, graph context and the capture phase."""

from __future__ import annotations

import copy
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwplug.core.config import CompilationConfig, CUDAGraphMode
from hwplug.core.errors import ConfigError
from hwplug.core.graphs import (
    AttentionGraphSupport,
    BatchDescriptor,
    GraphDispatcher,
    capture_phase,
    current_graph_context,
    graph_context,
    is_capture_enabled,
    resolve_runtime_graph_mode,
    set_capture_enabled,
)

NONE = CUDAGraphMode.NONE
PIECEWISE = CUDAGraphMode.PIECEWISE
FULL = CUDAGraphMode.FULL
FULL_DECODE_ONLY = CUDAGraphMode.FULL_DECODE_ONLY
FULL_AND_PIECEWISE = CUDAGraphMode.FULL_AND_PIECEWISE
ALL_MODES = list(CUDAGraphMode)
SIZES = [1, 2, 4, 8, 16]


def config(mode: CUDAGraphMode, sizes: list[int] = SIZES, **kwargs: object) -> CompilationConfig:
    cfg = CompilationConfig(cudagraph_mode=mode, **kwargs)  # type: ignore[arg-type]
    cfg.init_with_cudagraph_sizes(list(sizes))
    return cfg


def expected(
    mode: CUDAGraphMode,
    sizes: list[int],
    batch: BatchDescriptor,
    max_num_seqs: int | None = None,
    query_len: int = 1,
) -> tuple[CUDAGraphMode, BatchDescriptor]:
    """SPEC section 7, written as plainly as possible (the oracle)."""
    n, uniform = batch
    if mode is NONE or not sizes or n == 0 or n > max(sizes):
        return NONE, batch
    padded = min(s for s in sizes if s >= n)
    decode_side = uniform and not (max_num_seqs is not None and padded > max_num_seqs * query_len)
    side = mode.decode_mode() if decode_side else mode.mixed_mode()
    if side is NONE:
        return NONE, batch
    return side, BatchDescriptor(padded, decode_side and mode.separate_routine())


# -- BatchDescriptor ---------------------------------------------------------------------


def test_batch_descriptor_defaults_to_non_uniform_and_is_a_hashable_tuple() -> None:
    b = BatchDescriptor(8)
    assert b == (8, False)
    assert b.uniform_decode is False
    assert {b: 1}[BatchDescriptor(8, False)] == 1
    assert hash(BatchDescriptor(8, True)) == hash((8, True))


def test_non_uniform_drops_the_flag_and_keeps_the_size() -> None:
    assert BatchDescriptor(4, True).non_uniform == BatchDescriptor(4, False)
    assert BatchDescriptor(4).non_uniform == BatchDescriptor(4)


# -- dispatch pinned per mode ------------------------------------------------------------

BOUNDARIES = [0, 1, 2, 3, 4, 5, 8, 9, 16, 17, 1000]
PADDED = {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 8: 8, 9: 16, 16: 16}


@pytest.mark.parametrize("n", BOUNDARIES)
def test_full_serves_every_batch_with_a_non_uniform_key(n: int) -> None:
    d = GraphDispatcher(config(FULL))
    for uniform in (False, True):
        batch = BatchDescriptor(n, uniform)
        mode, key = d.dispatch(batch)
        if n in PADDED:
            assert (mode, key) == (FULL, BatchDescriptor(PADDED[n], False))
        else:
            assert mode is NONE
            assert key is batch


@pytest.mark.parametrize("n", BOUNDARIES)
def test_piecewise_serves_every_batch_piecewise(n: int) -> None:
    d = GraphDispatcher(config(PIECEWISE))
    for uniform in (False, True):
        batch = BatchDescriptor(n, uniform)
        if n in PADDED:
            assert d.dispatch(batch) == (PIECEWISE, BatchDescriptor(PADDED[n], False))
        else:
            assert d.dispatch(batch) == (NONE, batch)


@pytest.mark.parametrize("n", BOUNDARIES)
def test_full_decode_only_runs_mixed_batches_without_graphs(n: int) -> None:
    d = GraphDispatcher(config(FULL_DECODE_ONLY))
    mixed = BatchDescriptor(n)
    assert d.dispatch(mixed) == (NONE, mixed)
    assert d.dispatch(mixed)[1] is mixed
    uniform = BatchDescriptor(n, True)
    if n in PADDED:
        assert d.dispatch(uniform) == (FULL, BatchDescriptor(PADDED[n], True))
    else:
        assert d.dispatch(uniform) == (NONE, uniform)


@pytest.mark.parametrize("n", BOUNDARIES)
def test_full_and_piecewise_splits_decode_and_mixed(n: int) -> None:
    d = GraphDispatcher(config(FULL_AND_PIECEWISE))
    mixed, uniform = BatchDescriptor(n), BatchDescriptor(n, True)
    if n in PADDED:
        assert d.dispatch(mixed) == (PIECEWISE, BatchDescriptor(PADDED[n], False))
        assert d.dispatch(uniform) == (FULL, BatchDescriptor(PADDED[n], True))
    else:
        assert d.dispatch(mixed) == (NONE, mixed)
        assert d.dispatch(uniform) == (NONE, uniform)


@pytest.mark.parametrize("n", BOUNDARIES)
def test_mode_none_never_pads(n: int) -> None:
    d = GraphDispatcher(config(NONE))
    for uniform in (False, True):
        batch = BatchDescriptor(n, uniform)
        mode, key = d.dispatch(batch)
        assert mode is NONE
        assert key is batch
    assert d.capture_keys() == {PIECEWISE: (), FULL: ()}
    assert d.runtime_modes == ()


def test_unset_mode_dispatches_like_none() -> None:
    cfg = CompilationConfig()
    cfg.init_with_cudagraph_sizes(SIZES)
    d = GraphDispatcher(cfg)
    assert d.mode is NONE
    assert d.dispatch(BatchDescriptor(4)) == (NONE, BatchDescriptor(4))


def test_max_capture_size_plus_one_runs_eagerly_unpadded() -> None:
    d = GraphDispatcher(config(FULL, [8, 24, 512]))
    assert d.max_capture_size == 512
    assert d.dispatch(BatchDescriptor(512)) == (FULL, BatchDescriptor(512))
    assert d.dispatch(BatchDescriptor(511)) == (FULL, BatchDescriptor(512))
    assert d.dispatch(BatchDescriptor(513)) == (NONE, BatchDescriptor(513))
    assert d.dispatch(BatchDescriptor(25)) == (FULL, BatchDescriptor(512))
    assert d.dispatch(BatchDescriptor(9)) == (FULL, BatchDescriptor(24))
    assert d.dispatch(BatchDescriptor(1)) == (FULL, BatchDescriptor(8))


def test_no_capture_sizes_means_no_graphs() -> None:
    d = GraphDispatcher(config(FULL_AND_PIECEWISE, []))
    assert d.max_capture_size == 0
    for n in (0, 1, 2):
        assert d.dispatch(BatchDescriptor(n, True)) == (NONE, BatchDescriptor(n, True))


def test_zero_tokens_have_no_graph() -> None:
    # bs_to_padded_graph_size[0] == 0, and no graph of 0 tokens is ever captured.
    d = GraphDispatcher(config(FULL))
    assert d.dispatch(BatchDescriptor(0)) == (NONE, BatchDescriptor(0))


# -- max_num_seqs and speculative decoding -----------------------------------------------


def test_uniform_batches_above_max_num_seqs_take_the_mixed_route() -> None:
    d = GraphDispatcher(config(FULL_AND_PIECEWISE), max_num_seqs=4)
    assert d.decode_limit == 4
    assert d.dispatch(BatchDescriptor(3, True)) == (FULL, BatchDescriptor(4, True))
    assert d.dispatch(BatchDescriptor(4, True)) == (FULL, BatchDescriptor(4, True))
    assert d.dispatch(BatchDescriptor(5, True)) == (PIECEWISE, BatchDescriptor(8, False))
    assert d.dispatch(BatchDescriptor(16, True)) == (PIECEWISE, BatchDescriptor(16, False))
    assert d.capture_keys()[FULL] == tuple(BatchDescriptor(s, True) for s in (4, 2, 1))


def test_decode_limit_scales_with_the_query_length() -> None:
    d = GraphDispatcher(config(FULL_AND_PIECEWISE), max_num_seqs=2, uniform_decode_query_len=4)
    assert d.decode_limit == 8
    assert d.dispatch(BatchDescriptor(8, True)) == (FULL, BatchDescriptor(8, True))
    assert d.dispatch(BatchDescriptor(9, True)) == (PIECEWISE, BatchDescriptor(16, False))


def test_full_decode_only_above_the_limit_runs_without_graphs() -> None:
    d = GraphDispatcher(config(FULL_DECODE_ONLY), max_num_seqs=2)
    assert d.dispatch(BatchDescriptor(2, True)) == (FULL, BatchDescriptor(2, True))
    batch = BatchDescriptor(3, True)
    assert d.dispatch(batch) == (NONE, batch)
    assert d.capture_keys() == {
        PIECEWISE: (),
        FULL: (BatchDescriptor(2, True), BatchDescriptor(1, True)),
    }


def test_limit_does_not_change_non_separate_modes() -> None:
    d = GraphDispatcher(config(FULL), max_num_seqs=1)
    assert d.dispatch(BatchDescriptor(16, True)) == (FULL, BatchDescriptor(16, False))


# -- the oracle, over many shapes --------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    mode=st.sampled_from(ALL_MODES),
    sizes=st.lists(st.integers(1, 64), max_size=8),
    max_num_seqs=st.none() | st.integers(1, 40),
    query_len=st.integers(1, 4),
    batches=st.lists(st.tuples(st.integers(0, 80), st.booleans()), min_size=1, max_size=20),
)
def test_dispatch_matches_the_spec_oracle(
    mode: CUDAGraphMode,
    sizes: list[int],
    max_num_seqs: int | None,
    query_len: int,
    batches: list[tuple[int, bool]],
) -> None:
    d = GraphDispatcher(
        config(mode, sizes), max_num_seqs=max_num_seqs, uniform_decode_query_len=query_len
    )
    keys = d.capture_keys()
    for n, uniform in batches:
        batch = BatchDescriptor(n, uniform)
        got = d.dispatch(batch)
        assert got == expected(mode, sizes, batch, max_num_seqs, query_len)
        runtime_mode, key = got
        assert runtime_mode.valid_runtime_modes()
        if runtime_mode is NONE:
            assert key is batch
        else:
            # Every key dispatch returns is one the capture phase captures.
            assert key in keys[runtime_mode]
            assert key.num_tokens >= n


@settings(max_examples=100, deadline=None)
@given(
    mode=st.sampled_from(ALL_MODES),
    sizes=st.lists(st.integers(1, 48), max_size=6),
    max_num_seqs=st.none() | st.integers(1, 20),
)
def test_capture_keys_are_exactly_the_reachable_keys_largest_first(
    mode: CUDAGraphMode, sizes: list[int], max_num_seqs: int | None
) -> None:
    d = GraphDispatcher(config(mode, sizes), max_num_seqs=max_num_seqs)
    reachable: dict[CUDAGraphMode, set[BatchDescriptor]] = {PIECEWISE: set(), FULL: set()}
    for n in range(0, d.max_capture_size + 2):
        for uniform in (False, True):
            runtime_mode, key = d.dispatch(BatchDescriptor(n, uniform))
            if runtime_mode is not NONE:
                reachable[runtime_mode].add(key)
    keys = d.capture_keys()
    assert {m: set(k) for m, k in keys.items()} == reachable
    for captured in keys.values():
        sizes_in_order = [k.num_tokens for k in captured]
        assert sizes_in_order == sorted(sizes_in_order, reverse=True)
    assert set(d.runtime_modes) == {m for m, k in keys.items() if k}


def test_dispatch_reuses_prebuilt_keys() -> None:
    d = GraphDispatcher(config(FULL_AND_PIECEWISE))
    first = d.dispatch(BatchDescriptor(5))
    assert d.dispatch(BatchDescriptor(6)) is first
    assert d.dispatch(BatchDescriptor(5, True)) is d.dispatch(BatchDescriptor(7, True))


def test_dispatch_accepts_plain_tuples() -> None:
    d = GraphDispatcher(config(FULL_AND_PIECEWISE))
    assert d.dispatch((3, True)) == (FULL, BatchDescriptor(4, True))  # type: ignore[arg-type]


# -- construction ------------------------------------------------------------------------


def test_unfinalised_config_is_finalised_on_a_copy() -> None:
    cfg = CompilationConfig(cudagraph_mode="FULL", cudagraph_capture_sizes=[4, 1, 2])
    before = copy.deepcopy(cfg)
    d = GraphDispatcher(cfg)
    assert d.dispatch(BatchDescriptor(3)) == (FULL, BatchDescriptor(4))
    assert cfg.bs_to_padded_graph_size is None
    assert cfg == before


def test_unfinalised_config_without_sizes_has_no_graphs() -> None:
    d = GraphDispatcher(CompilationConfig(cudagraph_mode="FULL"))
    assert d.max_capture_size == 0
    assert d.dispatch(BatchDescriptor(1)) == (NONE, BatchDescriptor(1))


def test_inconsistent_padding_table_is_rejected() -> None:
    cfg = config(FULL)
    cfg.bs_to_padded_graph_size = [0, 1, 1]
    with pytest.raises(ConfigError, match=r"compilation\.bs_to_padded_graph_size"):
        GraphDispatcher(cfg)


@pytest.mark.parametrize("value", [0, -1, True, 2.0, "8"])
def test_bad_max_num_seqs_is_rejected(value: object) -> None:
    with pytest.raises(ValueError, match=r"scheduler\.max_num_seqs must be a positive integer"):
        GraphDispatcher(config(FULL), max_num_seqs=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, -2, False, 1.5])
def test_bad_query_len_is_rejected(value: object) -> None:
    with pytest.raises(ValueError, match="uniform_decode_query_len must be a positive integer"):
        GraphDispatcher(config(FULL), uniform_decode_query_len=value)  # type: ignore[arg-type]


def test_negative_token_count_is_an_error() -> None:
    d = GraphDispatcher(config(FULL))
    with pytest.raises(ValueError, match="num_tokens must be >= 0, got -1"):
        d.dispatch(BatchDescriptor(-1))


def test_repr_names_mode_and_key_counts() -> None:
    text = repr(GraphDispatcher(config(FULL_AND_PIECEWISE), max_num_seqs=2))
    assert "FULL_AND_PIECEWISE" in text
    assert "PIECEWISE: 5" in text
    assert "FULL: 2" in text


# -- runtime mode resolution -------------------------------------------------------------


def attention_split(mode: CUDAGraphMode) -> CompilationConfig:
    """Level 3 with the attention ops as splitting ops."""
    cfg = CompilationConfig(level=3, cudagraph_mode=mode)
    cfg.set_splitting_ops_for_v1()
    assert cfg.splitting_ops_contain_attention()
    return cfg


def no_split(mode: CUDAGraphMode) -> CompilationConfig:
    """Level 3, but attention stays inside the compiled graph."""
    return CompilationConfig(level=3, cudagraph_mode=mode, splitting_ops=[])


def inductor_partition(mode: CUDAGraphMode) -> CompilationConfig:
    cfg = CompilationConfig(level=3, cudagraph_mode=mode, use_inductor_graph_partition=True)
    cfg.set_splitting_ops_for_v1()
    return cfg


S = AttentionGraphSupport


@pytest.mark.parametrize(
    ("make", "mode", "support", "query_len", "result"),
    [
        (attention_split, FULL, S.ALWAYS, 1, FULL),
        (attention_split, FULL, S.UNIFORM_BATCH, 1, FULL_AND_PIECEWISE),
        (no_split, FULL, S.UNIFORM_BATCH, 1, FULL_DECODE_ONLY),
        (attention_split, FULL, S.UNIFORM_SINGLE_TOKEN_DECODE, 1, FULL_AND_PIECEWISE),
        (attention_split, FULL, S.UNIFORM_SINGLE_TOKEN_DECODE, 2, PIECEWISE),
        (no_split, FULL, S.UNIFORM_SINGLE_TOKEN_DECODE, 2, NONE),
        (attention_split, FULL_AND_PIECEWISE, S.NEVER, 1, PIECEWISE),
        (no_split, FULL_DECODE_ONLY, S.NEVER, 1, NONE),
        (inductor_partition, FULL_DECODE_ONLY, S.NEVER, 1, PIECEWISE),
        (attention_split, FULL_AND_PIECEWISE, S.UNIFORM_BATCH, 3, FULL_AND_PIECEWISE),
        (attention_split, FULL_AND_PIECEWISE, S.UNIFORM_SINGLE_TOKEN_DECODE, 1, FULL_AND_PIECEWISE),
        (attention_split, FULL_AND_PIECEWISE, S.UNIFORM_SINGLE_TOKEN_DECODE, 2, PIECEWISE),
        (no_split, FULL_DECODE_ONLY, S.UNIFORM_SINGLE_TOKEN_DECODE, 2, NONE),
        (attention_split, FULL_DECODE_ONLY, S.UNIFORM_BATCH, 2, FULL_DECODE_ONLY),
        (attention_split, PIECEWISE, S.NEVER, 1, PIECEWISE),
        (attention_split, NONE, S.NEVER, 4, NONE),
        (attention_split, FULL_AND_PIECEWISE, S.ALWAYS, 4, FULL_AND_PIECEWISE),
    ],
)
def test_runtime_mode_degrades_to_what_attention_supports(
    make: object,
    mode: CUDAGraphMode,
    support: AttentionGraphSupport,
    query_len: int,
    result: CUDAGraphMode,
) -> None:
    cfg = make(mode)  # type: ignore[operator]
    before = copy.deepcopy(cfg)
    got = resolve_runtime_graph_mode(cfg, support, uniform_decode_query_len=query_len)
    assert got is result
    assert cfg == before  # pure


@pytest.mark.parametrize("make", [attention_split, no_split])
def test_full_with_never_supported_attention_is_a_config_error(make: object) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_runtime_graph_mode(make(FULL), "NEVER")  # type: ignore[operator]
    message = str(info.value)
    assert "compilation.cudagraph_mode=FULL" in message
    assert "NEVER" in message
    assert "PIECEWISE" in message


def test_support_is_accepted_by_name_in_any_case_or_by_value() -> None:
    cfg = attention_split(FULL)
    assert resolve_runtime_graph_mode(cfg, "uniform_batch") is FULL_AND_PIECEWISE
    assert resolve_runtime_graph_mode(cfg, " Always ") is FULL
    assert resolve_runtime_graph_mode(cfg, 3) is FULL


def test_the_weakest_backend_decides() -> None:
    cfg = attention_split(FULL)
    assert resolve_runtime_graph_mode(cfg, [S.ALWAYS, "UNIFORM_BATCH", 3]) is FULL_AND_PIECEWISE
    assert resolve_runtime_graph_mode(cfg, (S.ALWAYS, S.ALWAYS)) is FULL
    with pytest.raises(ConfigError):
        resolve_runtime_graph_mode(cfg, [S.ALWAYS, S.NEVER])


def test_no_attention_backend_constrains_nothing() -> None:
    assert resolve_runtime_graph_mode(attention_split(FULL), []) is FULL


@pytest.mark.parametrize("bad", ["SOMETIMES", 7, -1, True, None, 1.5, ["ALWAYS", "nope"]])
def test_unknown_support_is_rejected_with_the_allowed_names(bad: object) -> None:
    with pytest.raises(
        ValueError, match="NEVER, UNIFORM_SINGLE_TOKEN_DECODE, UNIFORM_BATCH, ALWAYS"
    ):
        resolve_runtime_graph_mode(attention_split(FULL), bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, True, "2"])
def test_bad_query_len_in_resolution_is_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="uniform_decode_query_len"):
        resolve_runtime_graph_mode(
            attention_split(FULL),
            S.ALWAYS,
            uniform_decode_query_len=bad,  # type: ignore[arg-type]
        )


def test_support_levels_are_ordered_ints() -> None:
    assert [int(s) for s in S] == [0, 1, 2, 3]
    assert S.NEVER < S.UNIFORM_SINGLE_TOKEN_DECODE < S.UNIFORM_BATCH < S.ALWAYS


@settings(max_examples=150, deadline=None)
@given(
    mode=st.sampled_from(ALL_MODES),
    support=st.sampled_from(list(S)),
    query_len=st.integers(1, 4),
    split=st.sampled_from([attention_split, no_split, inductor_partition]),
)
def test_resolved_mode_never_asks_more_than_attention_supports(
    mode: CUDAGraphMode, support: AttentionGraphSupport, query_len: int, split: object
) -> None:
    cfg = split(mode)  # type: ignore[operator]
    try:
        got = resolve_runtime_graph_mode(cfg, support, uniform_decode_query_len=query_len)
    except ConfigError:
        assert support is S.NEVER
        assert mode.mixed_mode() is FULL
        return
    if got.mixed_mode() is FULL:
        assert support is S.ALWAYS
    if got.decode_mode() is FULL:
        assert support > S.NEVER
        if query_len > 1:
            assert support >= S.UNIFORM_BATCH
    if got is not mode:
        assert got.has_full_cudagraphs() <= mode.has_full_cudagraphs()
    if support is S.ALWAYS:
        assert got is mode


# -- graph context -----------------------------------------------------------------------


def test_outside_any_context_the_mode_is_none() -> None:
    ctx = current_graph_context()
    assert ctx.runtime_mode is NONE
    assert ctx.batch_descriptor is None


def test_graph_context_nests_and_restores() -> None:
    outer_key, inner_key = BatchDescriptor(8, True), BatchDescriptor(4)
    with graph_context(FULL, outer_key) as outer:
        assert outer == (FULL, outer_key)
        with graph_context("piecewise", inner_key):
            assert current_graph_context() == (PIECEWISE, inner_key)
        assert current_graph_context() == (FULL, outer_key)
    assert current_graph_context().runtime_mode is NONE


def test_graph_context_restores_after_an_exception() -> None:
    with pytest.raises(KeyError), graph_context(FULL, BatchDescriptor(2)):
        raise KeyError("boom")
    assert current_graph_context().runtime_mode is NONE


def test_graph_context_is_per_thread() -> None:
    seen: list[CUDAGraphMode] = []
    with graph_context(FULL, BatchDescriptor(1)):
        worker = threading.Thread(target=lambda: seen.append(current_graph_context()[0]))
        worker.start()
        worker.join()
    assert seen == [NONE]


@pytest.mark.parametrize("mode", [FULL_AND_PIECEWISE, FULL_DECODE_ONLY, "FULLISH", 7])
def test_graph_context_needs_a_runtime_mode(mode: object) -> None:
    with pytest.raises(ValueError, match="NONE, PIECEWISE, FULL"), graph_context(mode):  # type: ignore[arg-type]
        pass


def test_graph_context_needs_a_key_for_graph_modes() -> None:
    with pytest.raises(ValueError, match="needs the batch_descriptor"), graph_context(FULL):
        pass
    with graph_context(NONE) as ctx:
        assert ctx.batch_descriptor is None


# -- capture phase -----------------------------------------------------------------------


def test_capture_is_closed_by_default_and_opened_by_the_phase() -> None:
    assert not is_capture_enabled()
    with capture_phase():
        assert is_capture_enabled()
        with capture_phase():
            assert is_capture_enabled()
        assert is_capture_enabled()
    assert not is_capture_enabled()


def test_set_capture_enabled_returns_the_previous_state() -> None:
    assert set_capture_enabled(True) is False
    try:
        assert is_capture_enabled()
        assert set_capture_enabled(True) is True
    finally:
        assert set_capture_enabled(False) is True
    assert not is_capture_enabled()


def test_capture_is_open_per_thread() -> None:
    """An engine's foreground capture and its background compilation's capture of host
    step graphs run at once in two threads: one closing its phase must not close the
    other's."""
    import threading

    inside, closed = threading.Event(), threading.Event()
    seen: list[bool] = []

    def background() -> None:
        seen.append(is_capture_enabled())  # a new thread starts closed
        with capture_phase():
            inside.set()
            closed.wait(timeout=10)
        seen.append(is_capture_enabled())

    with capture_phase():
        thread = threading.Thread(target=background)
        thread.start()
        assert inside.wait(timeout=10)
        closed.set()
        thread.join(timeout=10)
        assert is_capture_enabled()  # the other thread's exit left this one open
    assert not is_capture_enabled()
    assert seen == [False, False]
