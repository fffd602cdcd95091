"""Context parallel (Ulysses) for diffusers' ``CosmosTransformer3DModel`` (Cosmos-Predict2 / 2.5): each
rank of the cp group runs the transformer blocks on ``N / cp`` of the ``N`` video tokens.

Diffusers 0.42.1 gives this class no ``_cp_plan`` and attention processors that take no parallel
config, so the split is ours. The model's forward stays diffusers'; hooks cut it where it is per token:

- every block's inputs (a forward pre-hook): the hidden states ``[B, N, C]`` (only block 0 gets all
  ``N``; later blocks already get ``N / cp``), the rotary ``(cos, sin)`` ``[N, D_head]`` each, the
  learnable position embedding ``[B, N, C]`` (``extra_pos_embed_type = "learnable"``), the time
  embeddings when they are per token (``[B, N, C]``, from a ``[B, 1, T, 1, 1]`` timestep) and a
  controlnet residual ``[B, N, C]`` are narrowed to this rank's contiguous tokens
  ``[r N / cp, (r + 1) N / cp)``; the text (``encoder_hidden_states``, its mask, the image context)
  stays whole;
- the output norm's per-token time embeddings the same way (``norm_out`` pre-hook);
- ``proj_out``'s output ``[B, N / cp, P]`` is all-gathered to ``[B, N, P]`` before the unpatchify, so
  every cp rank returns the whole velocity;
- self-attention (``attn1``) gets :class:`CosmosUlyssesSelfAttention`: q / k / v projections, the
  per-head q / k RMS norm and rope on the local tokens (all heads), an all-to-all that trades the token
  split for a head split (``[B, H, N / cp, D] -> [B, H / cp, N, D]``), attention over the whole
  sequence, and the inverse all-to-all. Cross-attention (``attn2``) keeps diffusers' processor: local
  queries against the whole text need no communication.

Patch embedding, rope, the learnable position table and the time embedding run whole on every rank
(cheap next to the blocks). The condition mask of image- / video-to-world is an input channel,
patch-embedded with the latents, so it is split with the tokens.

Gradients: every cp rank computes the same loss from the gathered output; the gather's backward keeps
this rank's token slice of the output gradient, times cp
(:class:`~cosmos_primitives.parallel.context_parallel.GatherSequence`). Each rank's parameter gradients
are then cp times its own tokens' share (the all-to-alls carry the attention terms between ranks), so
an average over the cp group (FSDP2 over ``dp_shard x cp``, or
:func:`~cosmos_primitives.parallel.context_parallel.all_reduce_context_parallel_grads`) is the full
gradient, as for the Wan path and the language-model context parallel.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.distributed as dist

from cosmos_primitives.parallel.context_parallel import GatherSequence, heads_to_seq, seq_to_heads

_PER_TOKEN_BLOCK_INPUTS = ("hidden_states", "embedded_timestep", "temb", "extra_pos_emb", "controlnet_residual")
"""``CosmosTransformerBlock.forward`` arguments that are ``[B, N, C]`` per video token (when 3-D)."""


def is_cosmos_transformer(transformer: Any) -> bool:
    """Whether ``transformer`` is a diffusers ``CosmosTransformer3DModel`` (also after FSDP2 wrapped its class)."""
    return any(c.__name__ == "CosmosTransformer3DModel" for c in type(transformer).__mro__)


class CosmosUlyssesSelfAttention:
    """Self-attention processor for a Cosmos block's ``attn1`` under context parallel.

    Called with ``hidden_states`` ``[B, N / cp, C]`` (this rank's tokens) and ``image_rotary_emb``
    ``(cos, sin)`` ``[N / cp, D_head]`` each (already narrowed by the block pre-hook); returns
    ``[B, N / cp, C]``, what diffusers' ``CosmosAttnProcessor2_0`` returns for those tokens when it sees
    all ``N``. Collective over ``group`` (two all-to-alls forward, two backward).
    """

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group

    def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None,
                 image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        from diffusers.models.attention_dispatch import dispatch_attention_fn
        from diffusers.models.embeddings import apply_rotary_emb

        if encoder_hidden_states is not None or attention_mask is not None:
            raise ValueError("CosmosUlyssesSelfAttention is for self-attention without a mask (a Cosmos block's attn1)")
        q, k, v = (proj(hidden_states).unflatten(2, (attn.heads, -1)).transpose(1, 2)
                   for proj in (attn.to_q, attn.to_k, attn.to_v))  # [B, H, N / cp, D]
        q, k = attn.norm_q(q), attn.norm_k(k)
        if image_rotary_emb is not None:
            q = apply_rotary_emb(q, image_rotary_emb, use_real=True, use_real_unbind_dim=-2)
            k = apply_rotary_emb(k, image_rotary_emb, use_real=True, use_real_unbind_dim=-2)
        q, k, v = (seq_to_heads(x, self.group).transpose(1, 2) for x in (q, k, v))  # [B, N, H / cp, D]
        out = dispatch_attention_fn(q, k, v, dropout_p=0.0, is_causal=False)  # [B, N, H / cp, D]
        out = heads_to_seq(out.transpose(1, 2), self.group)  # [B, H, N / cp, D]
        out = out.transpose(1, 2).flatten(2, 3).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


def _narrow_tokens(x: Any, full: int, rank: int, size: int, dim: int) -> Any:
    """``x`` narrowed to this rank's tokens along ``dim`` when it holds all ``full`` tokens there."""
    if isinstance(x, torch.Tensor) and x.dim() == dim + 2 and x.shape[dim] == full:
        return x.narrow(dim, rank * (full // size), full // size)
    return x


def split_cosmos_tokens(transformer: torch.nn.Module, group: dist.ProcessGroup) -> None:
    """Split ``transformer``'s video tokens over ``group`` (in place; see the module docstring).

    Use :func:`cosmos_primitives.policy.diffusion_cp.enable_transformer_context_parallel`, which checks
    heads and tokens against cp first. Every rank of ``group`` must then call the transformer with the
    same inputs; each gets the whole output ``[B, C, T, H, W]``.
    """
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    blocks = list(transformer.transformer_blocks)
    block_signature = inspect.signature(blocks[0].forward)  # CosmosTransformerBlock's; bound per call
    norm_signature = inspect.signature(transformer.norm_out.forward)

    def slice_block_inputs(block: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict]:
        bound = block_signature.bind(*args, **kwargs)
        rope = bound.arguments.get("image_rotary_emb")
        if rope is None:
            raise ValueError("a Cosmos block was called without image_rotary_emb; its token count is unknown")
        full = rope[0].shape[0]
        bound.arguments["image_rotary_emb"] = tuple(_narrow_tokens(x, full, rank, size, 0) for x in rope)
        for name in _PER_TOKEN_BLOCK_INPUTS:
            if name in bound.arguments:
                bound.arguments[name] = _narrow_tokens(bound.arguments[name], full, rank, size, 1)
        return bound.args, bound.kwargs

    def slice_norm_inputs(norm: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict]:
        bound = norm_signature.bind(*args, **kwargs)
        full = bound.arguments["hidden_states"].shape[1] * size
        for name in ("embedded_timestep", "temb"):
            if name in bound.arguments:
                bound.arguments[name] = _narrow_tokens(bound.arguments[name], full, rank, size, 1)
        return bound.args, bound.kwargs

    def gather_tokens(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return GatherSequence.apply(output, group)

    for block in blocks:
        block.attn1.set_processor(CosmosUlyssesSelfAttention(group))
        block.register_forward_pre_hook(slice_block_inputs, with_kwargs=True)
    transformer.norm_out.register_forward_pre_hook(slice_norm_inputs, with_kwargs=True)
    transformer.proj_out.register_forward_hook(gather_tokens)
