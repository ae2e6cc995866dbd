"""Write a small random Llama, Qwen2 or Qwen3 checkpoint with transformers.

``python -m tiny_engine.make_checkpoint DIR --arch llama|qwen2|qwen3 [--layers N
--hidden N --heads N --kv-heads N --head-dim N --intermediate N --vocab N
--max-positions N --seed N --init-std X --tie --rope-scaling JSON --shard-size SIZE]``

The demo and the tests need no download: the checkpoint is written by
``save_pretrained(safe_serialization=True)`` exactly as a published one is
(``config.json``, ``generation_config.json``, safetensors, sharded with an
index when ``--shard-size`` is small enough).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["main", "make_checkpoint"]

ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}


def make_checkpoint(
    directory: str | Path,
    *,
    arch: str = "llama",
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int | None = None,
    intermediate: int | None = None,
    vocab: int = 256,
    max_positions: int = 512,
    seed: int = 0,
    init_std: float = 0.02,
    tie: bool = False,
    rope_scaling: dict[str, Any] | None = None,
    shard_size: str | None = None,
    eos_token_id: int | list[int] = 2,
    norm_std: float = 0.0,
    config_overrides: dict[str, Any] | None = None,
) -> Path:
    """Write a random checkpoint to ``directory`` and return its path.

    ``rope_scaling`` is the Hub's dict (``{"rope_type": "llama3", "factor": 8.0,
    ...}``). ``shard_size`` (such as ``"20KB"``) splits the weights into shards.
    ``norm_std`` > 0 draws the norms' weights around 1 with that deviation
    (transformers leaves them at 1, which hides a norm applied in the wrong
    place). ``config_overrides`` are further config fields (``attention_bias``,
    ``rope_theta``, ``sliding_window``, ``layer_types``, ...).

    :raises ValueError: an unknown ``arch``.
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown --arch {arch!r}; choose one of: {', '.join(ARCHS)}")
    import torch
    import transformers

    config_name, model_name = ARCHS[arch]
    kwargs: dict[str, Any] = {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": intermediate or 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": max_positions,
        "initializer_range": init_std,
        "tie_word_embeddings": tie,
        "bos_token_id": 1,
        "eos_token_id": eos_token_id,
    }
    # hidden / heads unless given (transformers' Qwen3 would default to 128 whatever the width)
    kwargs["head_dim"] = head_dim if head_dim is not None else hidden // heads
    if rope_scaling is not None:
        kwargs["rope_scaling"] = dict(rope_scaling)
    kwargs.update(config_overrides or {})
    config = getattr(transformers, config_name)(**kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).eval()
    if norm_std > 0:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.normal_(1.0, norm_std)
    path = Path(directory)
    save: dict[str, Any] = {"safe_serialization": True}
    if shard_size is not None:
        save["max_shard_size"] = shard_size
    model.save_pretrained(path, **save)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tiny_engine.make_checkpoint",
        description="Write a small random Hugging Face checkpoint (needs transformers).",
    )
    parser.add_argument("directory", type=Path, help="where to write the checkpoint")
    parser.add_argument(
        "--arch", choices=sorted(ARCHS), default="llama", help="model family (default: llama)"
    )
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (default: 2)")
    parser.add_argument("--hidden", type=int, default=64, help="hidden size (default: 64)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (default: 4)")
    parser.add_argument(
        "--kv-heads", type=int, default=2, help="key/value heads, dividing --heads (default: 2)"
    )
    parser.add_argument(
        "--head-dim", type=int, default=None, help="head size (default: hidden / heads)"
    )
    parser.add_argument(
        "--intermediate", type=int, default=None, help="MLP width (default: 2 x hidden)"
    )
    parser.add_argument("--vocab", type=int, default=256, help="vocabulary size (default: 256)")
    parser.add_argument(
        "--max-positions",
        type=int,
        default=512,
        help="max_position_embeddings, the longest sequence (default: 512)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument(
        "--init-std",
        type=float,
        default=0.02,
        help="weights' standard deviation; larger spreads the logits (default: 0.02)",
    )
    parser.add_argument("--tie", action="store_true", help="tie the LM head to the embedding")
    parser.add_argument(
        "--rope-scaling",
        type=json.loads,
        default=None,
        metavar="JSON",
        help='rope scaling, as in \'{"rope_type": "linear", "factor": 2.0}\'',
    )
    parser.add_argument(
        "--shard-size", default=None, help="write sharded weights of at most this size (20KB)"
    )
    args = parser.parse_args(argv)
    try:
        path = make_checkpoint(
            args.directory,
            arch=args.arch,
            layers=args.layers,
            hidden=args.hidden,
            heads=args.heads,
            kv_heads=args.kv_heads,
            head_dim=args.head_dim,
            intermediate=args.intermediate,
            vocab=args.vocab,
            max_positions=args.max_positions,
            seed=args.seed,
            init_std=args.init_std,
            tie=args.tie,
            rope_scaling=args.rope_scaling,
            shard_size=args.shard_size,
        )
    except ImportError as exc:
        print(
            f"error: make_checkpoint needs transformers ({exc}); pip install transformers",
            file=sys.stderr,
        )
        return 2
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
