"""What an engine is asked to do, checked without torch or weights.

The engine config filled from a checkpoint's ``config.json``
(:func:`engine_config_for`), and the arguments of ``LLM.generate``: prompts
against the vocabulary and the context, ``max_tokens``, ``temperature`` and
``seed``. ``LLM`` checks with these; ``python -m tiny_engine`` checks its
input with them before it imports torch or loads a model, so a bad prompt is
an error within a second, not after the weights have loaded.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import operator
from collections.abc import Mapping, Sequence
from typing import Any, SupportsIndex

from hwplug import ConfigError
from hwplug.core.config import EngineConfig, ModelConfig
from tiny_engine.checkpoint import ModelSpec

__all__ = [
    "GREEDY_BELOW",
    "check_prompts",
    "check_seed",
    "check_temperature",
    "engine_config_for",
    "sequence_seed",
]

GREEDY_BELOW = 1e-5
"""Temperatures below this sample greedily (the reference engine's rule): dividing
the logits by less would only round the softmax to a one-hot vector."""


def _as_integer(value: object) -> int | None:
    """``value`` as an int when it is an integer: a Python int or another library's
    integer scalar (numpy's ``int64``; anything whose ``__index__`` gives an int),
    never a bool (Python's or an array's); else None."""
    if (
        isinstance(value, bool)
        or "bool" in str(getattr(value, "dtype", ""))
        or getattr(value, "ndim", 0) != 0  # an array of one element is no scalar
        or not isinstance(value, SupportsIndex)
    ):
        return None
    try:
        return operator.index(value)
    except TypeError:  # torch's float tensors have an __index__ that refuses
        return None


def _type_name(value: object) -> str:
    """For messages: ``int``, ``str``, ``numpy.float64``."""
    kind = type(value)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


def _is_rows(value: object, ndim: int) -> bool:
    """Whether ``value`` is a sequence (not text) or an ``ndim``-dimensional array."""
    if isinstance(value, (str, bytes)):
        return False
    return isinstance(value, Sequence) or getattr(value, "ndim", None) == ndim


def check_seed(seed: object) -> int | None:
    """``seed`` as an int (numpy integers too) or None, else a ``ValueError``."""
    if seed is None:
        return None
    value = _as_integer(seed)
    if value is None:
        raise ValueError(f"seed must be an int or None, got {_type_name(seed)} {seed!r}")
    return value


def check_temperature(temperature: object) -> float:
    """``temperature`` as a float when it is a finite number >= 0 (numpy's too), else a
    ``ValueError``."""
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise ValueError(
            f"temperature must be a finite number >= 0, got {_type_name(temperature)} "
            f"{temperature!r}"
        )
    value = float(temperature)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    return value


def sequence_seed(seed: int, index: int) -> int:
    """The generator seed of prompt ``index`` of a call made with ``seed``: any int
    (negative, or beyond 64 bits) hashed to ``[0, 2**63)``, the same in every process."""
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _as_config(config: EngineConfig | Mapping[str, Any] | None) -> EngineConfig:
    if config is None:
        return EngineConfig()
    if isinstance(config, EngineConfig):
        return config.copy()
    if isinstance(config, Mapping):
        return EngineConfig.from_dict(config)
    raise ConfigError(
        f"LLM(config=...) takes an EngineConfig or a dict of sections, got {type(config).__name__}"
    )


def engine_config_for(
    spec: ModelSpec, config: EngineConfig | Mapping[str, Any] | None = None
) -> EngineConfig:
    """``config`` with its model section filled from the checkpoint (a new object).

    The checkpoint's shape (layers, heads, head size, hidden size, sliding
    window) is copied in; a value the user gave that differs is a
    ``ConfigError``. ``max_model_len`` is the checkpoint's
    ``max_position_embeddings`` unless the user gave a value that is not larger.
    The user's other model fields (``dtype``, ``enforce_eager``) stay as given.
    """
    cfg = _as_config(config)
    model = cfg.model
    given = model.given_fields()
    where = f"{spec.path / 'config.json'}"
    shape = {
        "num_layers": (spec.num_layers, "num_hidden_layers"),
        "num_attention_heads": (spec.num_heads, "num_attention_heads"),
        "num_kv_heads": (spec.num_kv_heads, "num_key_value_heads"),
        "head_size": (spec.head_dim, "head_dim"),
        "hidden_size": (spec.hidden_size, "hidden_size"),
        "sliding_window": (spec.sliding_window, "sliding_window"),
        "is_attention_free": (False, "architectures"),
        "use_mla": (False, "architectures"),
    }
    for name, (value, source) in shape.items():
        if name in given and getattr(model, name) != value:
            raise ConfigError(
                f"model.{name}={getattr(model, name)!r} contradicts the checkpoint, whose "
                f"{source} gives {value!r} ({where}); leave model.{name} unset"
            )
    values = {name: getattr(model, name) for name in given}
    values.update({name: value for name, (value, _) in shape.items()})
    longest = spec.max_position_embeddings
    if spec.rope.rope_type == "dynamic" and spec.rope.original_max_position_embeddings:
        # dynamic NTK rescales past the original context, per batch: not served beyond it
        longest = min(longest, spec.rope.original_max_position_embeddings)
    if "max_model_len" in given:
        if model.max_model_len > longest:
            raise ConfigError(
                f"model.max_model_len={model.max_model_len} is longer than the checkpoint's "
                f"max_position_embeddings={longest} ({where}); use at most {longest}"
            )
    else:
        values["max_model_len"] = longest
    cfg.model = ModelConfig(**values)
    return cfg


def check_prompts(
    prompts: Sequence[Sequence[int]],
    max_tokens: int | Sequence[int],
    *,
    vocab_size: int,
    max_model_len: int,
) -> tuple[list[list[int]], list[int]]:
    """The prompts as lists of ints and ``max_tokens`` as one limit per prompt, once
    every prompt is a non-empty list of token ids below ``vocab_size`` that leaves
    room for a token in ``max_model_len``, and every limit a positive integer; else
    a ``ValueError`` naming the prompt and position.

    Token ids and limits may be numpy integers (any integer with ``__index__``, not
    a bool); a prompt may be a 1-D integer array, and the prompts a 2-D one.

    Needs only the checkpoint's ``config.json`` (no weights, no torch): the command
    line checks its prompts this way before it loads a model.
    """
    if not _is_rows(prompts, 2):
        raise ValueError("prompts must be a list of token-id lists (or a 2-D integer array)")
    one = _as_integer(max_tokens)
    each: Any = max_tokens if one is None else [one] * len(prompts)
    if not _is_rows(each, 1) or len(each) != len(prompts):
        raise ValueError(
            f"max_tokens must be a positive integer or one per prompt, got {max_tokens!r}"
        )
    limits: list[int] = []
    for n in each:
        count = _as_integer(n)
        if count is None or count < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {n!r}")
        limits.append(count)
    limit = max_model_len
    vocab = vocab_size
    checked: list[list[int]] = []
    for i, prompt in enumerate(prompts):
        if not _is_rows(prompt, 1):
            raise ValueError(f"prompt {i} must be a list of token ids")
        if len(prompt) == 0:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        ids: list[int] = []
        for j, t in enumerate(prompt):
            token = _as_integer(t)
            if token is None:
                raise ValueError(
                    f"prompt {i}, position {j}: token {t!r} is a {_type_name(t)}, not an "
                    f"integer; token ids are ints (or numpy integers) 0 .. {vocab - 1}"
                )
            if not 0 <= token < vocab:
                raise ValueError(
                    f"prompt {i}, position {j}: token {token} is not a token id of this "
                    f"model (0 .. {vocab - 1})"
                )
            ids.append(token)
        if len(ids) >= limit:
            raise ValueError(
                f"prompt {i} has {len(ids)} tokens; model.max_model_len={limit} leaves "
                f"room for prompts of at most {limit - 1}"
            )
        checked.append(ids)
    return checked, limits
