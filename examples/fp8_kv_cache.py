"""An fp8 KV cache, end to end, sized for a simulated NVIDIA H100 and run on the CPU.

1. Resolve an engine config with ``cache.cache_dtype="fp8"`` on a simulated
   H100: the platform fills in the block size and says what ``fp8`` means.
2. Size the cache with ``hwplug.core.kv_cache.num_blocks`` (80 GB x 0.9),
   then allocate a few of those blocks, enough for the demo, in CPU memory.
3. Write a batch of bfloat16 keys and values with per-tensor scales
   (``calculate_kv_scales``), read it back, and report the error and the
   memory an fp8 cache saves against bfloat16.

Run: ``python examples/fp8_kv_cache.py [--profile h100] [--tokens 200]``.
"""

from __future__ import annotations

import argparse

import torch

import hwplug
from hwplug.core.config import CacheConfig, EngineConfig, ModelConfig
from hwplug.core.kv_cache import KVCacheSpec, num_blocks
from hwplug.kernels import compute_kv_scales, gather_kv_cache, write_kv_cache
from hwplug.platforms.cuda import CudaPlatform

GiB = 1 << 30
DEMO_BLOCK_CAP = 64
"""At most this many blocks are allocated in CPU memory for the demo."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fp8 KV cache on a simulated GPU")
    parser.add_argument("--profile", default="h100", help="simulated CUDA device profile")
    parser.add_argument("--tokens", type=int, default=200, help="tokens in the batch")
    args = parser.parse_args(argv)

    platform = CudaPlatform.simulate(args.profile)
    model = ModelConfig(
        num_layers=8,
        num_attention_heads=16,
        num_kv_heads=4,
        head_size=64,
        hidden_size=1024,
        max_model_len=4096,
        dtype="bfloat16",
    )
    config = EngineConfig(model=model, cache=CacheConfig(cache_dtype="fp8"))
    config = hwplug.resolve(config, platform=platform).config
    spec = KVCacheSpec.from_config(config, platform)
    blocks = num_blocks(config, platform)
    bf16_spec = KVCacheSpec(
        spec.num_layers, spec.num_kv_heads, spec.head_size, spec.block_size, torch.bfloat16
    )
    print(f"device: {platform.get_device_name()} (simulated), fp8 = {spec.dtype}")
    print(
        f"cache: {blocks} blocks of {spec.block_size} tokens, "
        f"{spec.bytes_per_block} bytes per block over {spec.num_layers} layers"
    )

    # One layer's key and value caches, capped so that the demo fits in memory.
    demo_blocks = min(blocks, max(DEMO_BLOCK_CAP, -(-args.tokens // spec.block_size)))
    shape = (demo_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)
    key_cache = torch.zeros(shape, dtype=spec.dtype)
    value_cache = torch.zeros(shape, dtype=spec.dtype)

    gen = torch.Generator().manual_seed(0)
    batch = (args.tokens, spec.num_kv_heads, spec.head_size)
    key = torch.randn(batch, generator=gen).to(torch.bfloat16)
    value = (torch.randn(batch, generator=gen) * 4).to(torch.bfloat16)
    slots = torch.randperm(demo_blocks * spec.block_size, generator=gen)[: args.tokens]
    k_scale, v_scale = compute_kv_scales(key, value, spec.dtype)
    write_kv_cache(key, value, key_cache, value_cache, slots, k_scale, v_scale)
    got_key, got_value = gather_kv_cache(
        key_cache, value_cache, slots, k_scale, v_scale, dtype=torch.bfloat16
    )

    key_err = (got_key.float() - key.float()).abs().max().item()
    value_err = (got_value.float() - value.float()).abs().max().item()
    rel = max(
        key_err / key.float().abs().max().item(), value_err / value.float().abs().max().item()
    )
    print(
        f"wrote {args.tokens} tokens: max abs error key {key_err:.4f}, value {value_err:.4f} "
        f"(at most {rel:.2%} of the largest value)"
    )
    fp8_bytes = blocks * spec.bytes_per_block
    bf16_bytes = blocks * bf16_spec.bytes_per_block
    saved = bf16_bytes - fp8_bytes
    print(
        f"memory: {fp8_bytes / GiB:.2f} GiB in fp8 vs {bf16_bytes / GiB:.2f} GiB in bfloat16 "
        f"for the same {blocks * spec.block_size} tokens: saved {saved / GiB:.2f} GiB "
        f"({saved / bf16_bytes:.0%})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
