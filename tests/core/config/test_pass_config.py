"""PassConfig: fusion switches and a stable uuid."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from hwplug.core.config import PassConfig
from hwplug.core.errors import ConfigError


def test_defaults() -> None:
    passes = PassConfig()
    assert passes.to_dict() == {
        "enable_fusion": False,
        "enable_attn_fusion": False,
        "enable_noop": False,
        "enable_sequence_parallelism": False,
        "enable_async_tp": False,
        "enable_fi_allreduce_fusion": False,
        "fi_allreduce_fusion_max_token_num": 16384,
        "dump_graph_stages": [],
        "dump_graph_dir": ".",
    }
    assert passes.dump_graph_dir == Path(".")


def test_uuid_is_a_sha256_hex_that_depends_on_the_switches_only() -> None:
    base = PassConfig().uuid()
    assert re.fullmatch(r"[0-9a-f]{64}", base)
    assert PassConfig().uuid() == base
    assert PassConfig(dump_graph_stages=["before_fusion"], dump_graph_dir=Path("/tmp")).uuid() == (
        base
    )
    changed = {
        PassConfig(enable_fusion=True).uuid(),
        PassConfig(enable_noop=True).uuid(),
        PassConfig(enable_async_tp=True).uuid(),
        PassConfig(fi_allreduce_fusion_max_token_num=1024).uuid(),
    }
    assert base not in changed
    assert len(changed) == 4


def test_fusion_without_noop_elimination_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="hwplug.config"):
        PassConfig(enable_fusion=True)
        PassConfig(enable_fusion=True, enable_noop=True)
    assert len(caplog.records) == 1
    assert "enable_noop" in caplog.records[0].getMessage()


def test_unknown_field_names_the_path_and_allowed_fields() -> None:
    with pytest.raises(ConfigError) as info:
        PassConfig(enable_fuson=True)  # type: ignore[call-arg]
    message = str(info.value)
    assert "compilation.pass_config.enable_fuson" in message
    assert "did you mean 'enable_fusion'" in message
    assert "enable_async_tp" in message


def test_max_token_num_must_be_positive() -> None:
    with pytest.raises(ValueError, match="fi_allreduce_fusion_max_token_num"):
        PassConfig(fi_allreduce_fusion_max_token_num=0)
