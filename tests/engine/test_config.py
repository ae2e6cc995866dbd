"""Filling the engine config from a checkpoint, and reading checkpoints of both formats."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from tiny_engine import CheckpointError, engine_config_for, read_checkpoint

from hwplug import ConfigError

pytest.importorskip("transformers")


def test_model_section_comes_from_config_json(llama: Path) -> None:
    cfg = engine_config_for(read_checkpoint(llama), {"model": {"enforce_eager": True}})
    m = cfg.model
    assert (m.num_layers, m.num_attention_heads, m.num_kv_heads, m.head_size, m.hidden_size) == (
        2,
        4,
        2,
        16,
        64,
    )
    assert m.max_model_len == 256 and m.sliding_window is None
    assert m.enforce_eager is True and m.dtype == "auto"


def test_user_choices_win_where_they_may(llama: Path) -> None:
    cfg = engine_config_for(
        read_checkpoint(llama), {"model": {"max_model_len": 100, "dtype": "bfloat16"}}
    )
    assert cfg.model.max_model_len == 100 and cfg.model.dtype == "bfloat16"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_layers", 3, "num_hidden_layers gives 2"),
        ("num_kv_heads", 4, "num_key_value_heads gives 2"),
        ("head_size", 32, "head_dim gives 16"),
        ("max_model_len", 1000, "max_position_embeddings=256"),
    ],
)
def test_user_values_contradicting_the_checkpoint_are_errors(
    llama: Path, field: str, value: int, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        engine_config_for(read_checkpoint(llama), {"model": {field: value}})
    assert f"model.{field}" in str(info.value)


def test_the_callers_config_is_not_changed(llama: Path) -> None:
    from hwplug.core.config import EngineConfig

    mine = EngineConfig.from_dict({"model": {"enforce_eager": True}})
    engine_config_for(read_checkpoint(llama), mine)
    assert mine.model.num_layers == 16  # the default, untouched


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_transformers_4_rope_spelling_reads_the_same(llama: Path, tmp_path: Path) -> None:
    """Hub checkpoints spell rope as rope_theta + rope_scaling (transformers 4)."""
    path = _copy(llama, tmp_path / "v4")
    config = json.loads((path / "config.json").read_text())
    config.pop("rope_parameters", None)  # transformers 5 writes this spelling
    config["rope_theta"] = 500000.0
    config["rope_scaling"] = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    (path / "config.json").write_text(json.dumps(config))
    rope = read_checkpoint(path).rope
    assert rope.theta == 500000.0 and rope.rope_type == "llama3" and rope.factor == 8.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"architectures": ["MistralForCausalLM"]}, "unsupported architecture"),
        (
            {"rope_parameters": {"rope_type": "longrope", "factor": 2.0}},
            "rope_parameters.rope_type 'longrope' is not supported",
        ),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"num_attention_heads": 3}, "not a multiple"),
    ],
)
def test_unsupported_models_are_checkpoint_errors(
    llama: Path, tmp_path: Path, change: dict, message: str
) -> None:
    path = _copy(llama, tmp_path / "bad")
    config = json.loads((path / "config.json").read_text())
    config.update(change)
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        read_checkpoint(path)


def test_missing_files_are_checkpoint_errors(llama: Path, tmp_path: Path) -> None:
    from tiny_engine import LLM

    with pytest.raises(CheckpointError, match="does not exist"):
        read_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        read_checkpoint(tmp_path / "empty")
    path = _copy(llama, tmp_path / "noweights")
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors"):
        LLM(path, config={"model": {"dtype": "float32", "enforce_eager": True}})


def test_eos_comes_from_generation_config_first(llama: Path, tmp_path: Path) -> None:
    path = _copy(llama, tmp_path / "eos")
    assert read_checkpoint(path).eos_token_ids == (2,)
    gen = json.loads((path / "generation_config.json").read_text())
    gen["eos_token_id"] = [5, 6]
    (path / "generation_config.json").write_text(json.dumps(gen))
    assert read_checkpoint(path).eos_token_ids == (5, 6)
    (path / "generation_config.json").unlink()
    assert read_checkpoint(path).eos_token_ids == (2,)


@pytest.mark.parametrize(
    ("rope_scaling", "message"),
    [
        ({"rope_type": "yarn", "factor": 4.0, "beta_fast": "x"}, "rope_scaling.beta_fast"),
        ({"rope_type": "yarn", "factor": 4.0, "truncate": "yes"}, "truncate must be true or false"),
        ({"rope_type": "yarn"}, "rope_scaling.factor is needed by rope_type 'yarn'"),
        ({"rope_type": "longrope", "factor": 4.0}, "rope_type 'longrope' is not supported"),
        ({"rope_type": "default", "partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
    ],
)
def test_rope_scalings_that_cannot_be_served_are_checkpoint_errors(
    llama: Path, tmp_path: Path, rope_scaling: dict[str, object], message: str
) -> None:
    import json
    import shutil

    from tiny_engine import CheckpointError, read_checkpoint

    target = tmp_path / "rope"
    shutil.copytree(llama, target)
    config = json.loads((target / "config.json").read_text())
    config.pop("rope_parameters", None)
    config["rope_scaling"] = rope_scaling
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=re.escape(message)):
        read_checkpoint(target)


def test_dynamic_rope_is_served_within_its_original_context(llama: Path, tmp_path: Path) -> None:
    import json
    import shutil

    from tiny_engine import LLM

    target = tmp_path / "dynamic"
    shutil.copytree(llama, target)
    config = json.loads((target / "config.json").read_text())
    config.pop("rope_parameters", None)
    config["rope_scaling"] = {
        "rope_type": "dynamic",
        "factor": 2.0,
        "original_max_position_embeddings": 64,
    }
    (target / "config.json").write_text(json.dumps(config))
    llm = LLM(target, config={"model": {"dtype": "float32", "enforce_eager": True}})
    assert llm.config.model.max_model_len == 64
    llm.close()
