"""Reading a Hugging Face checkpoint directory: its shape, its rotary embedding, its weights.

A checkpoint is ``config.json`` plus one ``model.safetensors`` or several
shards listed by ``model.safetensors.index.json``; ``generation_config.json``,
when present, names the end-of-sequence token(s). Both spellings of the rotary
settings are read: ``rope_theta`` + ``rope_scaling`` (checkpoints written by
transformers 4.x, as on the Hub) and ``rope_parameters`` (transformers 5).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "ARCHITECTURES",
    "ROPE_TYPES",
    "CheckpointError",
    "ModelSpec",
    "RopeSpec",
    "iter_weights",
    "read_checkpoint",
]

ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
"""The ``architectures`` this engine serves -> its name for the model family."""

ROPE_TYPES: tuple[str, ...] = ("default", "linear", "llama3", "yarn", "dynamic")
"""Rotary scalings served. ``dynamic`` (NTK) rescales only past the original context, so
the engine serves it up to ``original_max_position_embeddings``; ``longrope`` is not served."""

_MAX_JSON_BYTES = 4 << 20


class CheckpointError(ValueError):
    """The checkpoint directory cannot be served: missing files, bad JSON, unsupported model."""


@dataclasses.dataclass(frozen=True)
class RopeSpec:
    """The rotary embedding: base ``theta``, scaling ``rope_type`` and its parameters."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    def attention_scaling(self) -> float:
        """What cos and sin are multiplied by: yarn's attention factor, else 1."""
        if self.rope_type != "yarn":
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if self.mscale and self.mscale_all_dim:
            return mscale(self.factor, self.mscale) / mscale(self.factor, self.mscale_all_dim)
        return mscale(self.factor)

    def inv_freq(self, head_dim: int, max_position_embeddings: int) -> torch.Tensor:
        """The inverse frequencies, ``[head_dim // 2]`` float32.

        The same arithmetic as transformers' rope initialisers, so fp32 models
        agree to the last bit.
        """
        import torch

        exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
        base = 1.0 / (self.theta**exponent)
        if self.rope_type in ("default", "dynamic"):
            # dynamic NTK changes nothing within the original context (all the engine serves)
            return base
        if self.rope_type == "linear":
            return base / self.factor
        if self.rope_type == "llama3":
            original = self.original_max_position_embeddings or max_position_embeddings
            low_wavelen = original / self.low_freq_factor
            high_wavelen = original / self.high_freq_factor
            wavelen = 2 * math.pi / base
            scaled = torch.where(wavelen > low_wavelen, base / self.factor, base)
            smooth = (original / wavelen - self.low_freq_factor) / (
                self.high_freq_factor - self.low_freq_factor
            )
            smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
            medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
            return torch.where(medium, smoothed, scaled)
        if self.rope_type == "yarn":
            return self._yarn(head_dim, max_position_embeddings)
        raise CheckpointError(f"rope type {self.rope_type!r} is not supported")

    def _yarn(self, dim: int, max_position_embeddings: int) -> torch.Tensor:
        """YaRN: each frequency between extrapolation and interpolation by its rotations
        over the original context (the same arithmetic as transformers')."""
        import torch

        original = self.original_max_position_embeddings or max_position_embeddings

        def correction_dim(rotations: float) -> float:
            return (dim * math.log(original / (rotations * 2 * math.pi))) / (
                2 * math.log(self.theta)
            )

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # no division by zero
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        extrapolation_factor = 1 - ramp
        pos_freqs = self.theta ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
        extrapolation = 1.0 / pos_freqs
        interpolation = 1.0 / (self.factor * pos_freqs)
        return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What the engine needs to know about a checkpoint's model.

    ``sliding_windows`` has one entry per layer (None: full attention);
    ``eos_token_ids`` are the tokens that end a generation.
    """

    path: Path
    architecture: str
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeSpec
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    sliding_windows: tuple[int | None, ...]
    eos_token_ids: tuple[int, ...]
    checkpoint_dtype: str | None

    @property
    def sliding_window(self) -> int | None:
        """The window when every layer slides, else None (some or all see everything)."""
        windows = set(self.sliding_windows)
        if len(windows) == 1:
            return next(iter(windows))
        return None


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        with path.open("rb") as stream:
            raw = stream.read(_MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read {what}: {exc.strerror or exc}") from exc
    if len(raw) > _MAX_JSON_BYTES:
        raise CheckpointError(f"{path}: {what} is larger than {_MAX_JSON_BYTES >> 20} MiB")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: {what} is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: {what} must hold a JSON object")
    return data


def _int(config: dict[str, Any], key: str, path: Path, default: int | None = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"{path}: {key} must be a positive integer, got {value!r}")
    return value


def _optional_int(config: dict[str, Any], key: str, path: Path, where: str = "") -> int | None:
    """A positive integer or null/absent (``where``: the object holding ``key``)."""
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"{path}: {where}{key} must be a positive integer, got {value!r}")
    return value


def _number(config: dict[str, Any], key: str, path: Path, default: float, where: str = "") -> float:
    """A positive finite number (a JSON int or float, not a string or a bool)."""
    value = config.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckpointError(
            f"{path}: {where}{key} must be a number, got {type(value).__name__} {value!r}"
        )
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise CheckpointError(
            f"{path}: {where}{key} must be a positive finite number, got {value!r}"
        )
    return number


def _flag(config: dict[str, Any], key: str, path: Path, default: bool = False) -> bool:
    value = config.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise CheckpointError(
            f"{path}: {key} must be true or false, got {type(value).__name__} {value!r}"
        )
    return value


def _eos_ids(value: Any, path: Path) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise CheckpointError(f"{path}: eos_token_id must be a token id or a list of them")
    return tuple(values)


def _rope(config: dict[str, Any], path: Path) -> RopeSpec:
    params = config.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise CheckpointError(
            f"{path}: rope_parameters must be an object, got {type(params).__name__} {params!r}"
        )
    if params is not None:
        # transformers 5: one dict; per-layer-type dicts are not used by these models
        scaling: dict[str, Any] = dict(params)
        where = "rope_parameters"
    else:
        raw = config.get("rope_scaling")
        if raw is not None and not isinstance(raw, dict):
            raise CheckpointError(
                f"{path}: rope_scaling must be an object or null, got {type(raw).__name__} {raw!r}"
            )
        scaling = dict(raw or {})
        where = "rope_scaling"
    if scaling.get("rope_theta") is not None:
        theta = _number(scaling, "rope_theta", path, 10000.0, f"{where}.")
    else:
        theta = _number(config, "rope_theta", path, 10000.0)
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise CheckpointError(
            f"{path}: {where}.rope_type {rope_type!r} is not supported; supported: "
            f"{', '.join(ROPE_TYPES)}"
        )
    values: dict[str, Any] = {"theta": theta, "rope_type": rope_type}
    for field in ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow"):
        if scaling.get(field) is not None:
            values[field] = _number(scaling, field, path, 1.0, f"{where}.")
    for field in ("attention_factor", "mscale", "mscale_all_dim"):
        if scaling.get(field) is not None:
            values[field] = _number(scaling, field, path, 1.0, f"{where}.")
    if scaling.get("truncate") is not None:
        if not isinstance(scaling["truncate"], bool):
            raise CheckpointError(f"{path}: {where}.truncate must be true or false")
        values["truncate"] = scaling["truncate"]
    partial = scaling.get("partial_rotary_factor", config.get("partial_rotary_factor"))
    if partial is not None and partial != 1 and partial != 1.0:
        raise CheckpointError(
            f"{path}: partial_rotary_factor={partial!r} is not supported; tiny_engine rotates "
            "whole heads (1.0)"
        )
    if rope_type not in ("default", "dynamic") and "factor" not in values:
        raise CheckpointError(f"{path}: {where}.factor is needed by rope_type {rope_type!r}")
    original = _optional_int(scaling, "original_max_position_embeddings", path, f"{where}.")
    if original is not None:
        values["original_max_position_embeddings"] = original
    if rope_type == "llama3" and values.get("low_freq_factor", 1.0) >= values.get(
        "high_freq_factor", 4.0
    ):
        raise CheckpointError(
            f"{path}: {where}.low_freq_factor must be smaller than high_freq_factor for "
            "rope_type 'llama3'"
        )
    return RopeSpec(**values)


def _sliding_windows(
    config: dict[str, Any], family: str, layers: int, path: Path
) -> tuple[int | None, ...]:
    window = _optional_int(config, "sliding_window", path)
    layer_types = config.get("layer_types")
    if layer_types is not None:
        if not (
            isinstance(layer_types, list)
            and len(layer_types) == layers
            and all(isinstance(kind, str) for kind in layer_types)
        ):
            raise CheckpointError(
                f"{path}: layer_types must list one string per layer ({layers}), got "
                f"{layer_types!r}"
            )
        unknown = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
        if unknown:
            raise CheckpointError(
                f"{path}: layer_types {unknown} are not served (full_attention, sliding_attention)"
            )
        if "sliding_attention" in layer_types and window is None:
            raise CheckpointError(f"{path}: sliding_attention layers need a sliding_window")
        return tuple(window if kind == "sliding_attention" else None for kind in layer_types)
    if family == "llama" or not _flag(config, "use_sliding_window", path) or window is None:
        return (None,) * layers
    first = config.get("max_window_layers", layers)
    if isinstance(first, bool) or not isinstance(first, int) or first < 0:
        raise CheckpointError(
            f"{path}: max_window_layers must be a non-negative integer, got {first!r}"
        )
    return tuple(window if i >= first else None for i in range(layers))


def read_checkpoint(directory: str | Path) -> ModelSpec:
    """The :class:`ModelSpec` of a checkpoint directory.

    :raises CheckpointError: the directory or ``config.json`` is missing or
        malformed, the architecture is not one of :data:`ARCHITECTURES`, or
        the model uses something this engine does not implement.
    """
    path = Path(directory)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a checkpoint directory (it does not exist)")
    config_path = path / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{path}: no config.json; expected a Hugging Face checkpoint")
    config = _read_json(config_path, "config.json")
    archs = config.get("architectures") or []
    if not isinstance(archs, list):
        archs = [archs]
    arch = next((a for a in archs if isinstance(a, str) and a in ARCHITECTURES), None)
    if arch is None:
        raise CheckpointError(
            f"{config_path}: unsupported architecture {archs!r}; supported: "
            f"{', '.join(ARCHITECTURES)}"
        )
    family = ARCHITECTURES[arch]
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{config_path}: hidden_act {act!r} is not supported (only silu)")
    hidden = _int(config, "hidden_size", config_path)
    heads = _int(config, "num_attention_heads", config_path)
    kv_heads = _int(config, "num_key_value_heads", config_path, heads)
    if heads % kv_heads:
        raise CheckpointError(
            f"{config_path}: num_attention_heads={heads} is not a multiple of "
            f"num_key_value_heads={kv_heads}"
        )
    head_dim = _optional_int(config, "head_dim", config_path)
    if head_dim is None:
        if hidden % heads:
            raise CheckpointError(
                f"{config_path}: head_dim is not given and hidden_size={hidden} is not a "
                f"multiple of num_attention_heads={heads}"
            )
        head_dim = hidden // heads
    if head_dim % 2:
        raise CheckpointError(
            f"{config_path}: head_dim={head_dim} must be even for the rotary embedding"
        )
    layers = _int(config, "num_hidden_layers", config_path)
    attention_bias = _flag(config, "attention_bias", config_path)

    gen_path = path / "generation_config.json"
    eos: tuple[int, ...] = ()
    if gen_path.is_file():
        eos = _eos_ids(_read_json(gen_path, "generation_config.json").get("eos_token_id"), gen_path)
    if not eos:
        eos = _eos_ids(config.get("eos_token_id"), config_path)
    dtype = config.get("dtype", config.get("torch_dtype"))
    if dtype is not None and not isinstance(dtype, str):
        raise CheckpointError(f"{config_path}: dtype must be a string, got {dtype!r}")

    return ModelSpec(
        path=path,
        architecture=arch,
        family=family,
        vocab_size=_int(config, "vocab_size", config_path),
        hidden_size=hidden,
        intermediate_size=_int(config, "intermediate_size", config_path),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=_number(config, "rms_norm_eps", config_path, 1e-6),
        max_position_embeddings=_int(config, "max_position_embeddings", config_path, 2048),
        rope=_rope(config, config_path),
        tie_word_embeddings=_flag(config, "tie_word_embeddings", config_path),
        qkv_bias=True if family == "qwen2" else attention_bias,
        o_bias=False if family == "qwen2" else attention_bias,
        mlp_bias=_flag(config, "mlp_bias", config_path),
        qk_norm=family == "qwen3",
        sliding_windows=_sliding_windows(config, family, layers, config_path),
        eos_token_ids=eos,
        checkpoint_dtype=dtype if isinstance(dtype, str) else None,
    )


def weight_files(directory: Path) -> list[Path]:
    """The checkpoint's safetensors files: the index's shards, else every ``*.safetensors``.

    :raises CheckpointError: no weights, or the index names a missing shard.
    """
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index, "model.safetensors.index.json").get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: no weight_map")
        bad = next(
            (
                (key, name)
                for key, name in weight_map.items()
                if not isinstance(name, str) or not name or Path(name).name != name
            ),
            None,
        )
        if bad is not None:
            raise CheckpointError(
                f"{index}: weight_map[{bad[0]!r}] must be the file name of a shard in the "
                f"checkpoint directory, got {bad[1]!r}"
            )
        files = [directory / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index}: missing shard(s) {', '.join(missing)}")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory}: no *.safetensors weights")
    return files


def iter_weights(directory: str | Path) -> Iterator[tuple[str, torch.Tensor, Path]]:
    """Every tensor of the checkpoint as ``(name, tensor, file)``, shard by shard, on CPU."""
    from safetensors import SafetensorError, safe_open

    for file in weight_files(Path(directory)):
        try:
            with safe_open(str(file), framework="pt") as reader:
                names = list(reader.keys())
            for name in names:
                # One mapping of the file per tensor: the pages a copy reads stay resident
                # while the file is mapped, so one mapping for a whole shard would hold
                # its every byte beside the model's own copy at the end of loading.
                with safe_open(str(file), framework="pt") as reader:
                    tensor = reader.get_tensor(name)
                yield name, tensor, file
                del tensor
        except SafetensorError as exc:
            raise CheckpointError(f"{file}: unreadable safetensors file ({exc})") from exc
