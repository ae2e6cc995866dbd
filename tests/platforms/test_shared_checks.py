"""The scheduler checks every platform shares, and the CPU/XPU compilation, KV-space and MLA rules.

platforms.md, "Checks every platform shares": without chunked prefill
``scheduler.max_num_batched_tokens`` must be at least ``model.max_model_len``,
and in every case at least ``scheduler.max_num_seqs``; a violation names both
fields and the value that works. The table rows for the CPU and XPU:
compilation (custom ops off only when the level compiles), Inductor options
(unset keys only), memory for KV (``HWPLUG_CPU_KVCACHE_SPACE``) and MLA.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hwplug
from hwplug import ConfigError
from hwplug.core.config import EngineConfig

GiB = 1 << 30
MiB = 1 << 20
KVCACHE_SPACE_ENV = "HWPLUG_CPU_KVCACHE_SPACE"
PROFILES = ["h100", "cpu-generic", "gaudi2", "max-1550"]
INDUCTOR_DEFAULTS = {
    "dce": True,
    "epilogue_fusion": True,
    "size_asserts": False,
    "nan_asserts": False,
}


@pytest.fixture(autouse=True)
def _no_kvcache_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KVCACHE_SPACE_ENV, raising=False)


def resolve(profile: str, data: dict[str, Any]) -> hwplug.Resolution:
    return hwplug.resolve(EngineConfig.from_dict(data), platform=profile)


def refused(profile: str, data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        resolve(profile, data)
    return str(info.value)


def changed_paths(res: hwplug.Resolution) -> set[str]:
    return {change.path for change in res.changes}


def change(res: hwplug.Resolution, path: str) -> hwplug.Change:
    (found,) = res.changes_to(path)
    return found


def scheduler(**fields: Any) -> dict[str, Any]:
    return {"scheduler": fields}


# ---------------------------------------------------------------------------
# Checks every platform shares
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize(("max_model_len", "tokens"), [(4096, 2048), (8192, 8191), (32768, 256)])
def test_without_chunked_prefill_a_step_must_hold_a_whole_prompt(
    profile: str, max_model_len: int, tokens: int
) -> None:
    message = refused(
        profile,
        {
            "model": {"max_model_len": max_model_len},
            **scheduler(
                enable_chunked_prefill=False, max_num_batched_tokens=tokens, max_num_seqs=1
            ),
        },
    )
    assert f"scheduler.max_num_batched_tokens={tokens}" in message
    assert f"model.max_model_len={max_model_len}" in message
    # The value that works.
    assert f"scheduler.max_num_batched_tokens={max_model_len}" in message


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("chunked", [True, False, None])
def test_a_step_must_hold_one_token_of_every_sequence(profile: str, chunked: bool | None) -> None:
    body: dict[str, Any] = {"max_num_seqs": 256, "max_num_batched_tokens": 128}
    if chunked is not None:
        body["enable_chunked_prefill"] = chunked
    message = refused(profile, {"model": {"max_model_len": 128}, "scheduler": body})
    assert "scheduler.max_num_batched_tokens=128" in message
    assert "scheduler.max_num_seqs=256" in message
    # Either value that works.
    assert "scheduler.max_num_batched_tokens=256" in message
    assert "scheduler.max_num_seqs=128" in message


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize(
    ("model", "sched"),
    [
        # Without chunked prefill: exactly a whole prompt per step.
        (
            {"max_model_len": 4096},
            {"enable_chunked_prefill": False, "max_num_batched_tokens": 4096},
        ),
        # With chunked prefill (explicit or the platform's default) prompts are split.
        ({"max_model_len": 4096}, {"enable_chunked_prefill": True, "max_num_batched_tokens": 2048}),
        ({"max_model_len": 4096}, {"max_num_batched_tokens": 2048}),
        # One token for each of max_num_seqs sequences, exactly.
        ({"max_model_len": 256}, {"max_num_seqs": 256, "max_num_batched_tokens": 256}),
        ({}, {}),
    ],
)
def test_combinations_that_work_resolve(
    profile: str, model: dict[str, Any], sched: dict[str, Any]
) -> None:
    res = resolve(profile, {"model": model, "scheduler": sched})
    config = res.config.scheduler
    for field, value in sched.items():
        assert getattr(config, field) == value
    assert config.max_num_batched_tokens >= config.max_num_seqs
    if not config.enable_chunked_prefill:
        assert config.max_num_batched_tokens >= res.config.model.max_model_len


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(PROFILES),
    st.integers(1, 32768),
    st.integers(1, 32768),
    st.integers(1, 1024),
    st.booleans(),
)
def test_the_shared_checks_hold_exactly(
    profile: str, max_model_len: int, tokens: int, seqs: int, chunked: bool
) -> None:
    data = {
        "model": {"max_model_len": max_model_len},
        **scheduler(
            max_num_batched_tokens=tokens, max_num_seqs=seqs, enable_chunked_prefill=chunked
        ),
    }
    fits = tokens >= seqs and (chunked or tokens >= max_model_len)
    if fits:
        resolve(profile, data)
    else:
        message = refused(profile, data)
        assert "scheduler.max_num_batched_tokens" in message
        assert "model.max_model_len" in message or "scheduler.max_num_seqs" in message


# ---------------------------------------------------------------------------
# CPU: custom ops off only when the level compiles
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("level", [0, 1])
def test_cpu_levels_that_do_not_compile_keep_the_custom_ops(level: int) -> None:
    res = resolve("cpu-generic", {"compilation": {"level": level}})
    assert res.config.compilation.custom_ops == []
    assert not res.changes_to("compilation.custom_ops")


@pytest.mark.parametrize("level", [2, 3, None])
def test_cpu_levels_that_compile_turn_custom_ops_off(level: int | None) -> None:
    res = resolve("cpu-generic", {"compilation": {"level": level}})
    assert res.config.compilation.level >= 2
    assert res.config.compilation.custom_ops == ["none"]
    found = change(res, "compilation.custom_ops")
    assert (found.old, found.new, found.source) == ([], ["none"], "platform:cpu")


def test_cpu_under_enforce_eager_keeps_the_custom_ops() -> None:
    res = resolve("cpu-generic", {"model": {"enforce_eager": True}})
    assert res.config.compilation.level == 0
    assert res.config.compilation.custom_ops == []
    assert not res.changes_to("compilation.custom_ops")


def test_cpu_without_inductor_keeps_the_custom_ops() -> None:
    res = resolve("cpu-generic", {"compilation": {"level": 2, "use_inductor": False}})
    assert res.config.compilation.custom_ops == []
    assert not res.changes_to("compilation.custom_ops")


@pytest.mark.parametrize("ops", [[], ["+rms_norm"], ["all", "-silu"]])
def test_cpu_keeps_custom_ops_the_user_gave(ops: list[str]) -> None:
    res = resolve("cpu-generic", {"compilation": {"level": 2, "custom_ops": ops}})
    assert res.config.compilation.custom_ops == ops
    assert not res.changes_to("compilation.custom_ops")


# ---------------------------------------------------------------------------
# CPU: Inductor option defaults (unset keys only)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("compilation", [{}, {"backend": "inductor"}, {"level": 0}])
def test_cpu_fills_the_inductor_defaults_with_the_inductor_backend(
    compilation: dict[str, Any],
) -> None:
    res = resolve("cpu-generic", {"compilation": compilation})
    assert res.config.compilation.backend == "inductor"
    options = res.config.compilation.inductor_compile_config
    assert {key: options[key] for key in INDUCTOR_DEFAULTS} == INDUCTOR_DEFAULTS
    found = change(res, "compilation.inductor_compile_config")
    assert found.source == "platform:cpu"
    assert not set(INDUCTOR_DEFAULTS) & set(found.old)
    assert set(INDUCTOR_DEFAULTS) <= set(found.new)


@pytest.mark.parametrize(
    "given_options",
    [
        {"dce": False},
        {"nan_asserts": True, "size_asserts": True},
        {"max_autotune": True},
        dict.fromkeys(INDUCTOR_DEFAULTS, "user"),
    ],
)
def test_cpu_inductor_defaults_never_overwrite_the_users_keys(
    given_options: dict[str, Any],
) -> None:
    res = resolve("cpu-generic", {"compilation": {"inductor_compile_config": given_options}})
    options = res.config.compilation.inductor_compile_config
    for key, value in given_options.items():
        assert options[key] == value
    missing = {k: v for k, v in INDUCTOR_DEFAULTS.items() if k not in given_options}
    for key, value in missing.items():
        assert options[key] == value
    records = res.changes_to("compilation.inductor_compile_config")
    if missing:
        (found,) = records
        assert found.source == "platform:cpu"
        assert set(missing) <= set(found.new)
        assert set(missing).isdisjoint(found.old)
    else:
        assert not records


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "os.path.join"])
def test_cpu_adds_no_inductor_options_for_another_backend(backend: str) -> None:
    res = resolve("cpu-generic", {"compilation": {"backend": backend}})
    options = res.config.compilation.inductor_compile_config
    assert set(INDUCTOR_DEFAULTS).isdisjoint(options)
    assert not res.changes_to("compilation.inductor_compile_config")
    assert not res.changes_to("compilation.backend")


@pytest.mark.parametrize("profile", ["h100", "gaudi2", "max-1550"])
def test_other_platforms_add_no_inductor_options(profile: str) -> None:
    res = resolve(profile, {"compilation": {"backend": "inductor", "level": 2}})
    assert set(INDUCTOR_DEFAULTS).isdisjoint(res.config.compilation.inductor_compile_config)


# ---------------------------------------------------------------------------
# CPU: KV-cache space from HWPLUG_CPU_KVCACHE_SPACE
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    ["1e300", "1e-300", "1e19", "1e-4", "inf", "-inf", "nan", "0", "-4", "abc", "4GiB", "²"],
)
def test_a_kvcache_space_out_of_range_is_a_config_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv(KVCACHE_SPACE_ENV, raw)
    message = refused("cpu-generic", {})
    assert KVCACHE_SPACE_ENV in message
    assert "GiB" in message


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("4", 4 * GiB),
        ("0.5", GiB // 2),
        (" 2 ", 2 * GiB),
        (str(MiB / GiB), MiB),
        ("1024", 1024 * GiB),
    ],
)
def test_a_kvcache_space_in_range_is_recorded(
    monkeypatch: pytest.MonkeyPatch, raw: str, expected: int
) -> None:
    monkeypatch.setenv(KVCACHE_SPACE_ENV, raw)
    res = resolve("cpu-generic", {})
    assert res.config.cache.cpu_kvcache_space_bytes == expected
    found = change(res, "cache.cpu_kvcache_space_bytes")
    assert found.source == "platform:cpu"
    assert KVCACHE_SPACE_ENV in found.reason


def test_an_explicit_kvcache_space_does_not_read_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KVCACHE_SPACE_ENV, "1e300")
    res = resolve("cpu-generic", {"cache": {"cpu_kvcache_space_bytes": 8 * GiB}})
    assert res.config.cache.cpu_kvcache_space_bytes == 8 * GiB
    assert not res.changes_to("cache.cpu_kvcache_space_bytes")


# ---------------------------------------------------------------------------
# MLA on the CPU and XPU: no chunked prefill
# ---------------------------------------------------------------------------

MLA_WITHOUT_CHUNKED_PREFILL = {"cpu-generic": "platform:cpu", "max-1550": "platform:xpu"}


@pytest.mark.parametrize("profile", MLA_WITHOUT_CHUNKED_PREFILL)
@pytest.mark.parametrize(
    ("max_model_len", "tokens"), [(16384, 16384), (32768, 32768), (1024, 2048)]
)
def test_mla_turns_unset_chunked_prefill_off_and_fits_a_prompt_in_a_step(
    profile: str, max_model_len: int, tokens: int
) -> None:
    res = resolve(profile, {"model": {"use_mla": True, "max_model_len": max_model_len}})
    sched = res.config.scheduler
    assert sched.enable_chunked_prefill is False
    assert change(res, "scheduler.enable_chunked_prefill").new is False
    assert sched.max_num_batched_tokens == tokens == max(max_model_len, 2048)
    found = change(res, "scheduler.max_num_batched_tokens")
    assert (found.new, found.source) == (tokens, MLA_WITHOUT_CHUNKED_PREFILL[profile])


@pytest.mark.parametrize("profile", MLA_WITHOUT_CHUNKED_PREFILL)
def test_mla_with_explicit_chunked_prefill_off_still_fills_the_tokens(profile: str) -> None:
    res = resolve(
        profile,
        {
            "model": {"use_mla": True, "max_model_len": 16384},
            **scheduler(enable_chunked_prefill=False),
        },
    )
    assert res.config.scheduler.max_num_batched_tokens == 16384
    assert not res.changes_to("scheduler.enable_chunked_prefill")


@pytest.mark.parametrize("profile", MLA_WITHOUT_CHUNKED_PREFILL)
def test_mla_with_explicit_chunked_prefill_on_is_a_config_error(profile: str) -> None:
    message = refused(
        profile,
        {
            "model": {"use_mla": True, "max_model_len": 16384},
            **scheduler(enable_chunked_prefill=True),
        },
    )
    assert "scheduler.enable_chunked_prefill=True" in message
    assert "model.use_mla=True" in message
    assert "scheduler.enable_chunked_prefill=False" in message


@pytest.mark.parametrize("profile", MLA_WITHOUT_CHUNKED_PREFILL)
@pytest.mark.parametrize("tokens", [16384, 20000, 8192 * 4])
def test_mla_keeps_explicit_batched_tokens_that_hold_a_prompt(profile: str, tokens: int) -> None:
    res = resolve(
        profile,
        {
            "model": {"use_mla": True, "max_model_len": 16384},
            **scheduler(max_num_batched_tokens=tokens),
        },
    )
    assert res.config.scheduler.max_num_batched_tokens == tokens
    assert not res.changes_to("scheduler.max_num_batched_tokens")
    assert res.config.scheduler.enable_chunked_prefill is False


@pytest.mark.parametrize("profile", MLA_WITHOUT_CHUNKED_PREFILL)
@pytest.mark.parametrize("tokens", [4096, 8192, 16383])
def test_mla_refuses_explicit_batched_tokens_below_max_model_len(profile: str, tokens: int) -> None:
    message = refused(
        profile,
        {
            "model": {"use_mla": True, "max_model_len": 16384},
            **scheduler(max_num_batched_tokens=tokens),
        },
    )
    assert f"scheduler.max_num_batched_tokens={tokens}" in message
    assert "model.max_model_len=16384" in message
    assert "scheduler.max_num_batched_tokens=16384" in message


@pytest.mark.parametrize("profile", MLA_WITHOUT_CHUNKED_PREFILL)
def test_without_mla_the_cpu_and_xpu_keep_chunked_prefill(profile: str) -> None:
    res = resolve(profile, {"model": {"max_model_len": 16384}})
    assert res.config.scheduler.enable_chunked_prefill is True
    assert res.config.scheduler.max_num_batched_tokens == 8192
    assert not res.changes_to("scheduler.max_num_batched_tokens")


def test_mla_on_h100_keeps_chunked_prefill_on() -> None:
    res = resolve("h100", {"model": {"use_mla": True, "max_model_len": 16384}})
    assert res.config.scheduler.enable_chunked_prefill is True
    assert change(res, "scheduler.enable_chunked_prefill").new is True
    assert res.config.scheduler.max_num_batched_tokens == 8192
    assert not res.changes_to("scheduler.max_num_batched_tokens")
    explicit = resolve(
        "h100",
        {
            "model": {"use_mla": True, "max_model_len": 16384},
            **scheduler(enable_chunked_prefill=True),
        },
    )
    assert explicit.config.scheduler.enable_chunked_prefill is True
