"""The decoder-only transformer of Llama, Qwen2 and Qwen3, written for paged attention.

One ``forward(input_ids, positions)`` serves every step: the tokens of all
sequences in the batch are laid end to end (``[num_tokens]``), and attention
finds each sequence's keys and values in the paged KV cache through the step's
metadata (:mod:`tiny_engine.attention`). Nothing here depends on batch
composition, so the same graph serves prefill, decode and mixed batches, and
``torch.compile`` sees one opaque attention op per layer.

Projections are fused (q/k/v into one matrix, gate/up into one) as serving
engines do; :func:`load_weights` fuses the checkpoint's separate matrices.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import cast

import torch
from torch import nn

from hwplug.attention import AttentionMetadata, unified_attention
from hwplug.core import distributed
from hwplug.kernels import linear
from tiny_engine.checkpoint import CheckpointError, ModelSpec

__all__ = ["CausalLM", "Sharding", "Stage", "load_weights", "pipeline_problem", "stage_layers"]


class Sharding:
    """This rank's part of a tensor-parallel model (SPEC 14).

    Attention heads are split across the ``size`` ranks (key/value heads
    replicated when there are fewer of them than ranks), the q/k/v and
    gate/up projections column-parallel, the output and down projections
    row-parallel (one all-reduce each), the embedding and the output head
    vocabulary-parallel (the vocabulary padded to a multiple of ``size``).
    Collectives run through hwplug's ops on the communicator registered as
    ``group``; with one rank there are none.
    """

    def __init__(self, spec: ModelSpec, rank: int = 0, size: int = 1, group: str = "tp") -> None:
        self.rank, self.size, self.group = rank, size, group
        problem = sharding_problem(spec, size)
        if problem is not None:
            raise CheckpointError(problem)
        self.num_heads = spec.num_heads // size
        if spec.num_kv_heads >= size:
            self.num_kv_heads = spec.num_kv_heads // size
            self.first_kv_head = rank * self.num_kv_heads
        else:  # more ranks than key/value heads: each rank keeps one, shared by several
            self.num_kv_heads = 1
            self.first_kv_head = rank * spec.num_kv_heads // size
        self.first_head = rank * self.num_heads
        self.intermediate = spec.intermediate_size // size
        self.padded_vocab = -(-spec.vocab_size // size) * size
        self.vocab_per_rank = self.padded_vocab // size
        self.first_token = rank * self.vocab_per_rank

    @property
    def parallel(self) -> bool:
        return self.size > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return distributed.all_reduce(x, self.group) if self.parallel else x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return distributed.all_gather(x, -1, self.group) if self.parallel else x


def sharding_problem(spec: ModelSpec, size: int) -> str | None:
    """Why ``spec``'s model cannot be split over ``size`` tensor-parallel ranks, or None."""
    if size == 1:
        return None
    where = f"parallel.tensor_parallel_size={size}"
    if spec.num_heads % size:
        return (
            f"{where} does not divide the checkpoint's {spec.num_heads} attention heads; "
            "use a size that does"
        )
    kv = spec.num_kv_heads
    if kv % size and size % kv:
        return (
            f"{where} neither divides nor is a multiple of the checkpoint's {kv} key/value "
            "heads; use a size that does one or the other"
        )
    if spec.intermediate_size % size:
        return (
            f"{where} does not divide the checkpoint's intermediate_size "
            f"{spec.intermediate_size}; use a size that does"
        )
    return None


def stage_layers(num_layers: int, size: int, index: int) -> tuple[int, int]:
    """The decoder layers ``[start, end)`` of pipeline stage ``index`` of ``size``:
    contiguous, their counts differing by at most one, the extra layers on the stages
    before the last (which also computes the head), as the reference engine splits."""
    counts = [num_layers // size] * size
    for i in range(num_layers % size):
        counts[-2 - i if size > 1 else 0] += 1
    start = sum(counts[:index])
    return start, start + counts[index]


def pipeline_problem(spec: ModelSpec, size: int) -> str | None:
    """Why ``spec``'s model cannot be split into ``size`` pipeline stages, or None."""
    if size > spec.num_layers:
        return (
            f"parallel.pipeline_parallel_size={size} is more stages than the checkpoint's "
            f"{spec.num_layers} decoder layers; use at most {spec.num_layers}"
        )
    return None


class Stage:
    """This rank's pipeline stage (SPEC 15): the decoder layers ``[start, end)`` it
    holds, the embedding on the first stage, the final norm and the head on the last.
    With one stage it is the whole model."""

    def __init__(self, spec: ModelSpec, index: int = 0, size: int = 1) -> None:
        problem = pipeline_problem(spec, size)
        if problem is not None:
            raise CheckpointError(problem)
        self.index, self.size = index, size
        self.start, self.end = stage_layers(spec.num_layers, size, index)

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.size - 1

    def holds_layer(self, layer: int) -> bool:
        return self.start <= layer < self.end

    def __repr__(self) -> str:
        return f"Stage({self.index} of {self.size}: layers {self.start}..{self.end - 1})"


class MissingLayer(nn.Module):
    """The place of a decoder layer another pipeline stage holds: no parameters, never
    called (the checkpoint's names keep their layer numbers)."""


class RMSNorm(nn.Module):
    """Root-mean-square layer norm, computed in float32 as transformers does."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Rotary(nn.Module):
    """Rotary position embedding from a precomputed float32 cos/sin table."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, spec: ModelSpec, max_positions: int) -> None:
        super().__init__()
        inv_freq = spec.rope.inv_freq(spec.head_dim, spec.max_position_embeddings)
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        scaling = spec.rope.attention_scaling()  # YaRN scales cos and sin
        self.register_buffer("cos", emb.cos() * scaling, persistent=False)
        self.register_buffer("sin", emb.sin() * scaling, persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos = self.cos[positions].to(q.dtype).unsqueeze(1)
        sin = self.sin[positions].to(q.dtype).unsqueeze(1)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class SelfAttention(nn.Module):
    """Fused q/k/v projection, optional q/k norms (Qwen3), rotary, paged attention.

    Attention runs through ``hwplug::unified_attention`` with the resolved
    backend; the layer's KV cache and fp8 scales are buffers the engine fills
    in once it has sized the cache.
    """

    key_cache: torch.Tensor
    value_cache: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor

    def __init__(
        self,
        spec: ModelSpec,
        layer_index: int,
        rotary: Rotary,
        backend: str,
        shard: Sharding | None = None,
    ) -> None:
        super().__init__()
        shard = shard or Sharding(spec)
        self.shard = shard
        self.num_heads = shard.num_heads
        self.num_kv_heads = shard.num_kv_heads
        self.head_dim = spec.head_dim
        self.scale = spec.head_dim**-0.5
        self.q_size = self.num_heads * spec.head_dim
        self.kv_size = self.num_kv_heads * spec.head_dim
        self.qkv_proj = Linear(spec.hidden_size, self.q_size + 2 * self.kv_size, bias=spec.qkv_bias)
        self.o_proj = RowParallelLinear(self.q_size, spec.hidden_size, spec.o_bias, shard)
        self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None
        self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None
        self.rotary = rotary
        self.backend = backend
        self.sliding_window = spec.sliding_windows[layer_index]
        empty = torch.empty(0, 1, self.num_kv_heads, spec.head_dim)
        self.register_buffer("key_cache", empty, persistent=False)
        self.register_buffer("value_cache", empty.clone(), persistent=False)
        self.register_buffer("k_scale", torch.ones((), dtype=torch.float32), persistent=False)
        self.register_buffer("v_scale", torch.ones((), dtype=torch.float32), persistent=False)
        self.calculate_scales = False
        """Set for one eager step: derive the fp8 scales from that step's keys and values."""

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q)
            k = self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        k = k.contiguous()
        v = v.contiguous()
        if self.calculate_scales:
            from hwplug.kernels import compute_kv_scales

            k_scale, v_scale = compute_kv_scales(k, v, self.key_cache.dtype)
            self.k_scale.copy_(k_scale)
            self.v_scale.copy_(v_scale)
            self.calculate_scales = False
        q = q.contiguous()
        # The output buffer is made here, inside the compiled piece before the op, so
        # under piecewise graphs the next piece reads the same memory on every replay.
        out = unified_attention(
            q,
            k,
            v,
            self.key_cache,
            self.value_cache,
            metadata,
            backend=self.backend,
            scale=self.scale,
            sliding_window=self.sliding_window,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
            out=torch.empty_like(q),
        )
        return self.o_proj(out.reshape(-1, self.q_size))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))`` with gate and up fused."""

    def __init__(self, spec: ModelSpec, shard: Sharding | None = None) -> None:
        super().__init__()
        shard = shard or Sharding(spec)
        self.intermediate = shard.intermediate
        self.gate_up_proj = Linear(spec.hidden_size, 2 * self.intermediate, bias=spec.mlp_bias)
        self.down_proj = RowParallelLinear(
            self.intermediate, spec.hidden_size, spec.mlp_bias, shard
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(nn.functional.silu(gate) * up)


class Linear(nn.Linear):
    """``nn.Linear`` multiplied on the platform's GEMM (:func:`hwplug.kernels.linear`
    with ``gemm``, the platform's ``linear_backend``), from the weight itself: its
    parameters, state dict and hooks are ``nn.Linear``'s, and an update of the
    weight is seen by the next call."""

    gemm: str = "torch"

    def reset_parameters(self) -> None:
        """No random initialisation: every weight comes from the checkpoint
        (:func:`load_weights` checks that each one is given), so the parameters stay
        uninitialised, untouched memory until it writes them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, backend=self.gemm)


class RowParallelLinear(Linear):
    """A linear layer whose input features are split across the ranks: each rank
    multiplies its part, the partial results are summed (one all-reduce), then
    the bias is added. With one rank it is :class:`Linear`."""

    def __init__(self, in_features: int, out_features: int, bias: bool, shard: Sharding) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.shard = shard

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.shard.parallel:
            return super().forward(x)
        out = self.shard.all_reduce(linear(x, self.weight, backend=self.gemm))
        return out if self.bias is None else out + self.bias


class VocabEmbedding(nn.Embedding):
    """The token embedding, its rows split across the ranks (the vocabulary padded
    to a multiple of their number): each rank looks up the tokens it holds, the
    others give zeros, and one all-reduce sums them."""

    def __init__(self, spec: ModelSpec, shard: Sharding) -> None:
        super().__init__(shard.vocab_per_rank, spec.hidden_size)
        self.shard = shard

    def reset_parameters(self) -> None:
        """No random initialisation (as :meth:`Linear.reset_parameters`)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        shard = self.shard
        if not shard.parallel:
            return super().forward(ids)
        local = ids - shard.first_token
        held = (local >= 0) & (local < shard.vocab_per_rank)
        rows = nn.functional.embedding(local.clamp(0, shard.vocab_per_rank - 1), self.weight)
        return shard.all_reduce(rows * held.unsqueeze(-1).to(rows.dtype))


class DecoderLayer(nn.Module):
    def __init__(
        self,
        spec: ModelSpec,
        index: int,
        rotary: Rotary,
        backend: str,
        shard: Sharding | None = None,
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = SelfAttention(spec, index, rotary, backend, shard)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = MLP(spec, shard)

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        x = x + self.self_attn(positions, self.input_layernorm(x), metadata)
        return x + self.mlp(self.post_attention_layernorm(x))


class CausalLM(nn.Module):
    """Embedding, decoder layers, final norm; :meth:`logits` applies the LM head.

    ``backend`` is the hwplug attention backend every layer runs; ``shard`` this
    rank's part of a tensor-parallel model (default: the whole model);
    ``linear_backend`` the GEMM of its linear layers (the platform's
    ``linear_backend``; see :func:`hwplug.kernels.linear`).
    """

    embed_tokens: VocabEmbedding | None
    norm: RMSNorm | None
    lm_head: Linear | None

    def __init__(
        self,
        spec: ModelSpec,
        backend: str,
        max_positions: int,
        shard: Sharding | None = None,
        *,
        linear_backend: str = "torch",
        stage: Stage | None = None,
    ) -> None:
        super().__init__()
        shard = shard or Sharding(spec)
        stage = stage or Stage(spec)
        self.spec = spec
        self.shard = shard
        self.stage = stage
        self.embed_tokens = VocabEmbedding(spec, shard) if stage.is_first else None
        # One rotary table shared by every layer (not a parameter: no weight in checkpoints).
        rotary = Rotary(spec, max_positions)
        layers: list[nn.Module] = [
            DecoderLayer(spec, i, rotary, backend, shard)
            if stage.holds_layer(i)
            else MissingLayer()
            for i in range(spec.num_layers)
        ]
        self.layers = nn.ModuleList(layers)
        self._own = [layer for layer in layers if isinstance(layer, DecoderLayer)]
        self._attention = [layer.self_attn for layer in self._own]
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps) if stage.is_last else None
        self.lm_head = (
            Linear(spec.hidden_size, shard.vocab_per_rank, bias=False) if stage.is_last else None
        )
        for module in self.modules():
            if isinstance(module, Linear):
                module.gemm = linear_backend

    def forward(
        self,
        inputs: torch.Tensor,
        positions: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        block_table: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> torch.Tensor:
        """This stage's output ``[num_tokens, hidden_size]``: the hidden states after the
        final norm on the last stage, else after the stage's last layer.

        ``inputs`` are the token ids on the first stage, the previous stage's hidden
        states on the others. The last four arguments are the step's attention
        metadata (SPEC 12).
        """
        metadata = AttentionMetadata(query_start_loc, seq_lens, block_table, slot_mapping)
        x = self.embed_tokens(inputs) if self.embed_tokens is not None else inputs
        for layer in self._own:
            x = layer(positions, x, metadata)
        return self.norm(x) if self.norm is not None else x

    def attention_layers(self) -> list[SelfAttention]:
        """The attention of every layer this stage holds, in order."""
        return list(self._attention)

    @property
    def hidden_dtype(self) -> torch.dtype:
        """The dtype of the hidden states that travel between stages."""
        return self._own[0].input_layernorm.weight.dtype

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits ``[rows, vocab_size]`` of the given hidden states (every rank
        gathers the whole vocabulary); the last stage only."""
        if self.lm_head is None:
            raise RuntimeError(f"{self.stage!r} has no head: the last stage computes the logits")
        local = self.lm_head(hidden).float()
        if not self.shard.parallel:
            return local
        return self.shard.all_gather(local)[:, : self.spec.vocab_size]


def _target(name: str, spec: ModelSpec) -> tuple[str, int | None] | None:
    """The engine parameter a checkpoint tensor goes to, and its slot in a fused matrix.

    Slots: 0/1/2 for q/k/v inside ``qkv_proj``, 0/1 for gate/up inside
    ``gate_up_proj``; None when the tensor is the whole parameter. Tensors the
    engine has no use for (rotary caches of old checkpoints) map to None.
    """
    if name.startswith("model."):
        name = name[len("model.") :]
    if name.endswith("rotary_emb.inv_freq"):
        return None
    for part, slot in (("q_proj", 0), ("k_proj", 1), ("v_proj", 2)):
        if f".self_attn.{part}." in name:
            return name.replace(part, "qkv_proj"), slot
    for part, slot in (("gate_proj", 0), ("up_proj", 1)):
        if f".mlp.{part}." in name:
            return name.replace(part, "gate_up_proj"), slot
    return name, None


def load_weights(
    model: CausalLM, weights: Iterable[tuple[str, torch.Tensor] | tuple[str, torch.Tensor, Path]]
) -> None:
    """Copy checkpoint tensors into ``model`` (fusing q/k/v and gate/up), in its dtype;
    a tensor-parallel rank keeps its own part of each (see :class:`Sharding`).

    ``weights`` yields ``(name, tensor)`` or ``(name, tensor, file)``; errors name the
    file when it is given (else the checkpoint directory).

    :raises CheckpointError: a tensor the model lacks, a shape that contradicts
        ``config.json``, a dtype that is not a float, or a parameter the checkpoint
        does not provide (``lm_head`` may come from the tied embedding).
    """
    spec, shard = model.spec, model.shard
    params = dict(model.named_parameters())
    loaded: dict[str, set[int | None]] = {}
    d = spec.head_dim
    q_local, kv_local = shard.num_heads * d, shard.num_kv_heads * d
    qkv_rows = {0: (0, q_local), 1: (q_local, q_local + kv_local)}
    qkv_rows[2] = (q_local + kv_local, q_local + 2 * kv_local)
    inter = shard.intermediate
    gate_up_rows = {0: (0, inter), 1: (inter, 2 * inter)}
    with torch.no_grad():
        for item in weights:
            name, tensor = item[0], item[1]
            where = item[2] if len(item) > 2 else spec.path  # type: ignore[misc]
            target = _target(name, spec)
            if target is None:
                continue
            pname, slot = target
            if pname == "embed_tokens.weight" and model.embed_tokens is None:
                if model.lm_head is None or not spec.tie_word_embeddings:
                    continue  # another stage's embedding
                pname = "lm_head.weight"  # the tied head of a last stage without the embedding
            param = params.get(pname)
            if param is None and _elsewhere(pname, model):
                continue  # a tensor another pipeline stage holds
            if param is None:
                raise CheckpointError(
                    f"{where}: checkpoint tensor {name!r} has no place in a "
                    f"{spec.architecture} with this config.json"
                )
            dest: torch.Tensor = param
            if slot is not None:
                rows = (qkv_rows if "qkv_proj" in pname else gate_up_rows)[slot]
                dest = param[rows[0] : rows[1]]
            if not (tensor.dtype.is_floating_point and tensor.dtype.itemsize >= 2):
                raise CheckpointError(
                    f"{where}: checkpoint tensor {name!r} is {tensor.dtype}; weights "
                    "must be 16- or 32-bit floats"
                )
            full = _full_shape(pname, slot, dest, spec)
            if tuple(tensor.shape) != full:
                raise CheckpointError(
                    f"{where}: checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, "
                    f"config.json implies {full}"
                )
            # (copy_ converts as it copies: one pass over the tensor, not a converted
            # copy first and then a second pass)
            dest.copy_(_local_part(pname, slot, tensor, shard, spec))
            loaded.setdefault(pname, set()).add(slot)
        if (
            "lm_head.weight" not in loaded
            and spec.tie_word_embeddings
            and model.lm_head is not None
            and model.embed_tokens is not None
        ):
            model.lm_head.weight = cast(nn.Parameter, model.embed_tokens.weight)
            loaded["lm_head.weight"] = {None}
    slots_needed = {"qkv_proj": {0, 1, 2}, "gate_up_proj": {0, 1}}
    missing = []
    for pname in params:
        needed = next((s for key, s in slots_needed.items() if key in pname), {None})
        if not needed <= loaded.get(pname, set()):
            missing.append(pname)
    if missing:
        raise CheckpointError(
            f"{spec.path}: the checkpoint lacks {len(missing)} weight(s) the model needs, "
            f"such as {missing[0]!r}"
        )


def _elsewhere(pname: str, model: CausalLM) -> bool:
    """Whether parameter ``pname`` belongs to a part of the model another pipeline stage
    holds (a decoder layer outside this stage, the final norm or the head)."""
    if pname.startswith("layers."):
        index = pname.split(".", 2)[1]
        return (
            index.isdigit()
            and int(index) < model.spec.num_layers
            and not (model.stage.holds_layer(int(index)))
        )
    if pname.startswith("norm."):
        return model.norm is None
    if pname.startswith("lm_head."):
        return model.lm_head is None
    return False


def _full_shape(
    pname: str, slot: int | None, dest: torch.Tensor, spec: ModelSpec
) -> tuple[int, ...]:
    """The shape ``config.json`` implies for the checkpoint tensor that fills ``dest``."""
    d, hidden = spec.head_dim, spec.hidden_size
    tail = tuple(dest.shape[1:])
    if "qkv_proj" in pname:
        heads = spec.num_heads if slot == 0 else spec.num_kv_heads
        return (heads * d, *tail)
    if "gate_up_proj" in pname:
        return (spec.intermediate_size, *tail)
    if pname.endswith("o_proj.weight"):
        return (hidden, spec.num_heads * d)
    if pname.endswith("down_proj.weight"):
        return (hidden, spec.intermediate_size)
    if pname in ("embed_tokens.weight", "lm_head.weight"):
        return (spec.vocab_size, hidden)
    return tuple(dest.shape)


def _local_part(
    pname: str, slot: int | None, tensor: torch.Tensor, shard: Sharding, spec: ModelSpec
) -> torch.Tensor:
    """This rank's part of a whole checkpoint tensor (all of it with one rank)."""
    if not shard.parallel:
        return tensor
    d = spec.head_dim
    if "qkv_proj" in pname:
        if slot == 0:
            return tensor[shard.first_head * d : (shard.first_head + shard.num_heads) * d]
        first = shard.first_kv_head * d
        return tensor[first : first + shard.num_kv_heads * d]
    if "gate_up_proj" in pname:
        return tensor[shard.rank * shard.intermediate : (shard.rank + 1) * shard.intermediate]
    if pname.endswith("o_proj.weight"):
        return tensor[:, shard.first_head * d : (shard.first_head + shard.num_heads) * d]
    if pname.endswith("down_proj.weight"):
        return tensor[:, shard.rank * shard.intermediate : (shard.rank + 1) * shard.intermediate]
    if pname in ("embed_tokens.weight", "lm_head.weight"):
        rows = tensor[shard.first_token : shard.first_token + shard.vocab_per_rank]
        if rows.shape[0] < shard.vocab_per_rank:  # the padding past the vocabulary
            pad = rows.new_zeros(shard.vocab_per_rank - rows.shape[0], rows.shape[1])
            rows = torch.cat([rows, pad])
        return rows
    return tensor
