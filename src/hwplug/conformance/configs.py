"""Engine configs generated for the rule checks: what an engine might ask of a platform."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hwplug.conformance.base import CheckContext, CheckFailed

if TYPE_CHECKING:
    from hwplug.core.platform import Platform

__all__ = ["config_dicts", "for_each_config"]

_GRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


def config_dicts(platform: Platform) -> st.SearchStrategy[dict[str, Any]]:
    """Partial config dicts: every field is left out (unset) or given a value an engine
    might choose, advertised or not, so refusals are generated too."""
    blocks = sorted({*platform.supported_block_sizes(), 1, 16, 32, 128})
    cache_dtypes = sorted({*platform.supported_cache_dtypes(), "auto", "bfloat16", "fp8"})

    def section(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
        return st.fixed_dictionaries({}, optional=fields)

    return st.fixed_dictionaries(
        {},
        optional={
            "model": section(
                {
                    "dtype": st.sampled_from(["auto", "bfloat16", "float16", "float32"]),
                    "head_size": st.sampled_from([64, 128]),
                    "enforce_eager": st.booleans(),
                    "sliding_window": st.sampled_from([None, 1024]),
                    "use_mla": st.booleans(),
                }
            ),
            "cache": section(
                {
                    "block_size": st.sampled_from([None, *blocks]),
                    "cache_dtype": st.sampled_from(cache_dtypes),
                    "enable_prefix_caching": st.sampled_from([None, True, False]),
                }
            ),
            "compilation": section(
                {
                    "level": st.integers(0, 3),
                    "cudagraph_mode": st.sampled_from(_GRAPH_MODES),
                }
            ),
            "scheduler": section(
                {
                    "max_num_seqs": st.sampled_from([1, 4, 64, 256, 512]),
                    "enable_chunked_prefill": st.sampled_from([None, True, False]),
                }
            ),
            "parallel": section({"tensor_parallel_size": st.sampled_from([1, 2])}),
        },
    )


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    from hypothesis.reporting import with_reporter

    with with_reporter(lambda _text: None):
        yield


def for_each_config(
    platform: Platform, context: CheckContext, test: Callable[[dict[str, Any]], None]
) -> None:
    """Call ``test(data)`` on ``context.examples`` generated config dicts.

    The first :class:`CheckFailed` is shrunk to a small config and raised again
    with that config named in its reason.
    """

    @settings(
        max_examples=context.examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(config_dicts(platform))
    @example({})
    @example({"scheduler": {"max_num_seqs": 4}, "cache": {"enable_prefix_caching": False}})
    def run(data: dict[str, Any]) -> None:
        try:
            test(data)
        except CheckFailed as exc:
            raise CheckFailed(f"{exc.reason} (config: {json.dumps(data, sort_keys=True)})") from exc

    with _quiet():
        try:
            run()
        except CheckFailed as exc:
            raise CheckFailed(exc.reason) from None
