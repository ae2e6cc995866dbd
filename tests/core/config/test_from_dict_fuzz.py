"""Property tests: any dict fed to ``EngineConfig.from_dict`` gives a config or a clear error."""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwplug.core.config import EngineConfig
from hwplug.core.errors import ConfigError

SECTIONS = EngineConfig.section_types()
FIELDS = {name: cls.init_field_names() for name, cls in SECTIONS.items()}
NAMES_A_PLACE = re.compile(r"\b(model|cache|compilation|parallel|scheduler|attention)\b")

# Strings that are never importable names, so a fuzzed `inductor_passes` entry
# cannot import (and run) an arbitrary module.
safe_text = st.text(max_size=6).map(lambda s: s + " !")
plausible = st.sampled_from(
    [
        "auto",
        "fp8",
        "bf16",
        "float32",
        "sha256_cbor",
        "mp",
        "all",
        "none",
        "+rms_norm",
        "-silu",
        "FULL",
        "piecewise",
        "full_and_piecewise",
        "cudagraph_capture_sizes",
        "os.path.join",
        "os.path.nope",
        "nosuchmodule_hwplug.fn",
        "",
        "3",
        "1e3",
        "true",
    ]
)
scalars = st.one_of(
    st.sampled_from([None, True, False, 0, 1, 2, 3, 8, 16, 512, -1, 10**30, -(10**30), 2**70]),
    st.integers(),
    st.floats(),
    plausible,
    safe_text,
)
# Nested junk one level deep: enough to reach every validator, cheap to generate.
junk = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),
    st.dictionaries(plausible, scalars, max_size=2),
    st.lists(st.lists(scalars, max_size=2), max_size=2),
)


@st.composite
def section_bodies(draw: st.DrawFn, section: str) -> Any:
    if draw(st.integers(0, 9)) == 0:  # sometimes not a dict at all
        return draw(junk)
    keys = st.one_of(
        st.sampled_from(FIELDS[section]),
        st.sampled_from(FIELDS[section]),
        st.sampled_from(FIELDS[section]),
        safe_text,
        st.integers(-3, 3),
    )
    return draw(st.dictionaries(keys, junk, max_size=3))


# Up to two (section, body) pairs; a misspelt and an unknown section now and then.
engine_dicts = st.lists(
    st.one_of(
        [
            st.tuples(st.just(name), section_bodies(name if name in SECTIONS else "cache"))
            for name in [*SECTIONS, "cahce", "extra"]
        ]
    ),
    max_size=2,
).map(dict)


@settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(engine_dicts)
def test_any_dict_gives_a_config_or_an_error_naming_the_field(data: dict[Any, Any]) -> None:
    try:
        config = EngineConfig.from_dict(data)
    except ConfigError as exc:
        message = str(exc)
        assert NAMES_A_PLACE.search(message), message
        return
    assert isinstance(config, EngineConfig)
    json.dumps(config.to_dict())
    config.compute_hash()


# Values that are valid for their fields, to check the round trip on many shapes.
VALID = {
    "model": {
        "dtype": st.sampled_from(["auto", "half", "bf16", "float32"]),
        "num_layers": st.integers(1, 200),
        "max_model_len": st.integers(1, 2**20),
        "enforce_eager": st.booleans(),
        "sliding_window": st.none() | st.integers(1, 4096),
        "use_mla": st.booleans(),
    },
    "cache": {
        "block_size": st.none() | st.integers(1, 1024),
        "gpu_memory_utilization": st.floats(0.01, 1.0),
        "swap_space": st.floats(0, 64),
        "cache_dtype": st.sampled_from(["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"]),
        "enable_prefix_caching": st.none() | st.booleans(),
        "prefix_caching_hash_algo": st.sampled_from(["sha256", "sha256_cbor"]),
        "kv_cache_memory_bytes": st.none() | st.integers(0, 2**40),
    },
    "compilation": {
        "level": st.none() | st.integers(0, 3),
        "backend": st.sampled_from(["", "eager", "inductor"]),
        "custom_ops": st.lists(st.sampled_from(["+a", "-b", "+c"]), max_size=3).flatmap(
            lambda ops: st.sampled_from([ops, ["all", *ops], ["none", *ops]])
        ),
        "splitting_ops": st.none() | st.lists(st.sampled_from(["x.a", "x.b"]), max_size=2),
        "compile_sizes": st.none()
        | st.lists(st.integers(1, 64) | st.just("cudagraph_capture_sizes"), max_size=3),
        "cudagraph_mode": st.none()
        | st.sampled_from(["none", "PIECEWISE", "Full", "FULL_DECODE_ONLY", "full_and_piecewise"]),
        "cudagraph_capture_sizes": st.none() | st.lists(st.integers(1, 512), max_size=5),
        "inductor_passes": st.dictionaries(st.sampled_from(["p", "q"]), st.just("os.path.join")),
        "pass_config": st.fixed_dictionaries(
            {}, optional={"enable_noop": st.booleans(), "dump_graph_dir": st.just("/tmp/x")}
        ),
    },
    "parallel": {
        "tensor_parallel_size": st.integers(1, 8),
        "distributed_executor_backend": st.none() | st.sampled_from(["mp", "ray", "uni"]),
    },
    "scheduler": {
        "max_num_seqs": st.integers(1, 1024),
        "enable_chunked_prefill": st.none() | st.booleans(),
        "cuda_graph_sizes": st.lists(st.integers(1, 1024), max_size=3),
    },
}
valid_dicts = st.fixed_dictionaries(
    {},
    optional={
        section: st.fixed_dictionaries({}, optional=fields)  # type: ignore[call-overload]
        for section, fields in VALID.items()
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_dicts)
def test_valid_dicts_round_trip(data: dict[str, Any]) -> None:
    config = EngineConfig.from_dict(data)
    again = EngineConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config
    assert again.compute_hash() == config.compute_hash()
