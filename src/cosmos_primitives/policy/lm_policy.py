"""A trainable language / vision-language policy: HF backbone + chunked log-prob head in one module.

``CausalLMPolicy`` owns a Hugging Face model (``.hf_model``, still ``save_pretrained``-able) and its
``forward`` returns per-token log-probs instead of logits. It is the module to shard with FSDP2:
the embeddings, final norm and (tied) LM head belong to the root unit, whose parameters are only
gathered while the root's ``forward`` runs, so computing hidden states with ``hf_model.model(...)``
and the head outside of it would read sharded weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate

from cosmos_primitives.algo.fused_logprob_loss import TokenLoss, token_loss_from_hidden, weighted_logprobs_from_hidden
from cosmos_primitives.algo.logprobs import ScoredPositions, TokenLogProbs, scored_positions, token_logprobs_from_hidden
from cosmos_primitives.algo.sampling_distribution import filtered_token_logprobs_from_hidden, filtering_active
from cosmos_primitives.parallel.varlen_attention import (
    no_mask_mapping,
    packed_attention_kwargs,
    varlen_attention_enabled,
)
from cosmos_primitives.policy.cp_logprobs import context_parallel_token_logprobs

# Batch keys forwarded to the backbone; anything else in a batch (labels, sample ids, ...) is not.
# Qwen2.5-VL (transformers 5) builds its 3-D mRoPE positions from ``mm_token_type_ids`` when no
# ``position_ids`` are given; without it, it silently falls back to 1-D text positions.
MODEL_INPUT_KEYS = (
    "attention_mask",
    "position_ids",
    "mm_token_type_ids",
    "pixel_values",
    "image_grid_thw",
    "pixel_values_videos",
    "video_grid_thw",
    "second_per_grid_ts",
    "rope_deltas",
)


def backbone_of(hf_model: torch.nn.Module) -> torch.nn.Module:
    """The HF base model that returns ``last_hidden_state`` (``model`` of ``*ForCausalLM`` /
    ``Qwen2_5_VLForConditionalGeneration``; it merges image / video features itself)."""
    prefix = getattr(hf_model, "base_model_prefix", "")
    backbone = getattr(hf_model, prefix, None) if prefix else None
    if backbone is None:
        raise TypeError(
            f"{type(hf_model).__name__} has no base model attribute (base_model_prefix={prefix!r}); "
            "expected a Hugging Face *ForCausalLM or *ForConditionalGeneration model"
        )
    return backbone


def _head_weight(hf_model: torch.nn.Module) -> torch.Tensor:
    head = hf_model.get_output_embeddings()
    if head is None or not isinstance(getattr(head, "weight", None), torch.Tensor):
        raise TypeError(f"{type(hf_model).__name__} has no output embedding (LM head) weight")
    if getattr(head, "bias", None) is not None:
        raise NotImplementedError(f"{type(hf_model).__name__}: an LM head with a bias is not supported")
    weight = head.weight
    if isinstance(weight, DTensor):
        if not all(isinstance(p, Replicate) for p in weight.placements):
            raise NotImplementedError(
                f"LM head weight is sharded ({weight.placements}); the chunked head needs it replicated "
                "inside forward (call through the FSDP root module, and do not tensor-parallelise the LM head)"
            )
        weight = weight.to_local()
    return weight


def hf_token_logprobs(
    hf_model: torch.nn.Module,
    input_ids: torch.Tensor,
    *,
    labels: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    loss_weights: torch.Tensor | None = None,
    token_loss: TokenLoss | None = None,
    positions: ScoredPositions | None = None,
    cp_group: dist.ProcessGroup | None = None,
    **model_inputs: Any,
) -> TokenLogProbs:
    """Backbone forward, then the chunked log-prob head (see :class:`CausalLMPolicy.forward`)."""
    filtered = filtering_active(top_k, top_p)
    if filtered and loss_weights is not None:
        raise ValueError(f"loss_weights (the fused log-prob loss) cannot be combined with top_k = {top_k} / "
                         f"top_p = {top_p}; score the unfiltered distribution (top_k = -1, top_p = 1)")
    if loss_weights is not None and with_entropy:
        raise ValueError("loss_weights (the fused log-prob loss) cannot be combined with with_entropy=True")
    if loss_weights is not None and token_loss is not None:
        raise ValueError("pass loss_weights or token_loss, not both (loss_weights is the token loss w * logprobs)")
    model_inputs.pop("use_cache", None)
    if cp_group is not None and dist.get_world_size(cp_group) > 1:
        if filtered:
            raise NotImplementedError(f"top_k = {top_k} / top_p = {top_p} (the sampling distribution) is not "
                                      "available with context parallelism; sample with top_k = -1, top_p = 1")
        if token_loss is not None:
            raise NotImplementedError("token_loss (the fused per-token loss) is not available with context "
                                      "parallelism; compute the log-probs and the loss separately")
        return context_parallel_token_logprobs(
            hf_model, backbone_of(hf_model), _head_weight(hf_model), input_ids, cp_group, labels=labels, mask=mask,
            chunk_size=chunk_size, with_entropy=with_entropy, temperature=temperature, loss_weights=loss_weights,
            **model_inputs)
    out = backbone_of(hf_model)(input_ids=input_ids, use_cache=False, **model_inputs)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    if temperature != 1.0:
        hidden = hidden / temperature  # logits / T = (hidden / T) @ W^T
    weight = _head_weight(hf_model)
    if filtered:
        out = filtered_token_logprobs_from_hidden(hidden, weight, input_ids, top_k=top_k, top_p=top_p, labels=labels,
                                                  mask=mask, positions=positions, chunk_size=chunk_size,
                                                  with_entropy=with_entropy)
        if token_loss is None:
            return out
        # the per-token loss on the filtered log-probs, differentiated by autograd rather than in the head
        found = positions if positions is not None else scored_positions(input_ids, labels=labels, mask=mask)
        flat_lp = out.logprobs.reshape(-1).index_select(0, found.index.to(out.logprobs.device))
        flat_ent = None if out.entropy is None else out.entropy.reshape(-1).index_select(
            0, found.index.to(out.entropy.device))
        total = token_loss(flat_lp, flat_ent, slice(0, flat_lp.shape[0])).sum()
        return TokenLogProbs(out.logprobs.detach(), None if out.entropy is None else out.entropy.detach(), total)
    if loss_weights is not None:
        return weighted_logprobs_from_hidden(hidden, weight, input_ids, loss_weights, labels=labels, mask=mask,
                                             positions=positions, chunk_size=chunk_size)
    if token_loss is not None:
        return token_loss_from_hidden(hidden, weight, input_ids, token_loss, labels=labels, mask=mask,
                                      positions=positions, chunk_size=chunk_size, with_entropy=with_entropy)
    return token_logprobs_from_hidden(hidden, weight, input_ids, labels=labels, mask=mask, positions=positions,
                                      chunk_size=chunk_size, with_entropy=with_entropy)


class CausalLMPolicy(torch.nn.Module):
    """A HF causal LM or VLM whose forward gives per-token log-probs (and entropy).

    Args:
        hf_model: e.g. ``Qwen2ForCausalLM`` or ``Qwen2_5_VLForConditionalGeneration``
            (:func:`cosmos_primitives.policy.load_hf_model`). Exposed as ``.hf_model``.
        chunk_size: default tokens per LM-head chunk (``[policy] logprob_chunk_size``).
        cp_group: context-parallel group (``mesh.group("cp")``): the decoder runs on this rank's
            slice of every row (:mod:`cosmos_primitives.policy.cp_logprobs`); every rank of the group
            gets the same batch and returns the same full ``[B, T]`` log-probs. None: no splitting.
    """

    def __init__(self, hf_model: torch.nn.Module, *, chunk_size: int = 1024,
                 cp_group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        self.hf_model = hf_model
        self.chunk_size = chunk_size
        self.cp_group = cp_group

    @property
    def config(self) -> Any:
        return self.hf_model.config

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        labels: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        with_entropy: bool = False,
        chunk_size: int | None = None,
        temperature: float = 1.0,
        top_k: int = -1,
        top_p: float = 1.0,
        loss_weights: torch.Tensor | None = None,
        token_loss: TokenLoss | None = None,
        positions: ScoredPositions | None = None,
        **model_inputs: Any,
    ) -> TokenLogProbs:
        """Per-token log-probs of ``input_ids`` under the model.

        Args:
            input_ids: ``[B, T]`` int64.
            labels: ``[B, T]`` HF labels (-100 = not scored); scored positions are ``labels != -100``.
            mask: ``[B, T]`` positions to score when there are no labels (e.g. completion mask);
                neither given: every position t >= 1.
            with_entropy: also return the per-token entropy (with gradient).
            chunk_size: tokens per LM-head chunk (default: the constructor's).
            temperature: score the distribution of ``logits / temperature`` (as sampled by a
                rollout engine at that temperature).
            top_k, top_p: score the sampling distribution after top-k / top-p filtering and
                renormalisation (:mod:`~cosmos_primitives.algo.sampling_distribution`; what the
                engines report), ``-1`` / ``1.0``: unfiltered. The head then runs in float32 with
                per-chunk recomputation instead of the fused chunked head.
            loss_weights: ``[B, T]`` constant weights ``w``: also compute the loss
                ``sum(w * logprobs)`` and its gradient in this forward pass (fewer LM-head GEMMs;
                e.g. ``cp.algo.sft_token_weights``); returned as ``weighted_sum``, with
                ``logprobs`` detached. Not with ``with_entropy``.
            token_loss: per-token loss contributions ``token_loss(logprobs [n], entropy [n] or None,
                rows) -> [n]`` (:data:`~cosmos_primitives.algo.fused_logprob_loss.TokenLoss`, e.g.
                ``cp.algo.grpo_token_loss``): also compute their sum and its gradient in this forward
                pass; returned as ``weighted_sum``, with ``logprobs`` and ``entropy`` detached. Not
                with context parallelism.
            positions: the scored positions (:func:`~cosmos_primitives.algo.logprobs.scored_positions`),
                found beforehand on the host; ``labels`` / ``mask`` are then not read by the head.
            **model_inputs: passed to the backbone: ``attention_mask`` ``[B, T]`` (omit for packed
                rows), ``position_ids`` ``[B, T]`` or ``[3 or 4, B, T]`` (mRoPE), ``pixel_values``,
                ``image_grid_thw``, ``pixel_values_videos``, ``video_grid_thw``, ``second_per_grid_ts``.

        Returns:
            :class:`~cosmos_primitives.algo.logprobs.TokenLogProbs`: ``logprobs`` ``[B, T]``
            float32 with ``logprobs[:, t] = log p(input_ids[:, t] | < t)``, 0 at t = 0 and on
            unscored positions; ``entropy`` likewise or None; ``weighted_sum`` with ``loss_weights``.
        """
        return hf_token_logprobs(
            self.hf_model, input_ids, labels=labels, mask=mask, with_entropy=with_entropy,
            chunk_size=self.chunk_size if chunk_size is None else chunk_size, temperature=temperature,
            top_k=top_k, top_p=top_p, loss_weights=loss_weights, token_loss=token_loss, positions=positions,
            cp_group=self.cp_group,
            **model_inputs,
        )


def token_logprobs(
    model: torch.nn.Module,
    batch: Mapping[str, Any],
    *,
    chunk_size: int | None = None,
    with_entropy: bool = False,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    loss_weights: torch.Tensor | None = None,
    token_loss: TokenLoss | None = None,
    positions: ScoredPositions | None = None,
) -> TokenLogProbs:
    """Per-token log-probs of a collated batch (``cp.data`` packed or padded).

    The positions to score are found where the batch's ``input_ids`` / ``labels`` / ``mask`` are,
    before they are moved: on the host for a loader's CPU batch, so that a GPU forward and backward
    make no host sync (a batch already on the GPU costs one, unless ``positions`` are given).

    Args:
        model: a :class:`CausalLMPolicy` (sharded or not; called through its ``forward``) or a
            plain, unsharded HF model.
        batch: ``input_ids`` ``[B, T]``, optional ``labels`` ``[B, T]`` (scored where != -100) and
            the model inputs of :data:`MODEL_INPUT_KEYS`; other keys are ignored. Tensors are moved
            to the model's device. A batch without ``attention_mask`` for a model with
            :data:`~cosmos_primitives.parallel.varlen_attention.VARLEN_ATTENTION` also gets its
            sample offsets (:func:`~cosmos_primitives.parallel.packed_attention_kwargs`), computed
            before the move.
        chunk_size: tokens per LM-head chunk (default: the policy's, or 1024).
        with_entropy: also return the per-token entropy.
        mask: ``[B, T]`` positions to score when the batch has no labels.
        temperature: score ``logits / temperature`` (GRPO: the rollout's sampling temperature).
        top_k, top_p: score the top-k / top-p filtered, renormalised distribution (GRPO: the
            rollout's; what the engines report); ``-1`` / ``1.0``: unfiltered.
        loss_weights: ``[B, T]`` constants: also return ``weighted_sum = sum(loss_weights *
            logprobs)`` with its gradient computed in the forward pass (see
            :meth:`CausalLMPolicy.forward`); SFT passes ``cp.algo.sft_token_weights(labels)``.
        token_loss: per-token loss contributions whose sum and gradient the head computes in the
            forward (see :meth:`CausalLMPolicy.forward`); GRPO passes ``cp.algo.grpo_token_loss(...)``.
        positions: the scored positions, found beforehand (``cp.algo.scored_positions``).
    """
    device = next(model.parameters()).device

    def to_device(value: Any) -> Any:
        return value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value

    if positions is None:
        ids = batch["input_ids"]
        labels = batch.get("labels")
        positions = scored_positions(ids, labels=None if labels is None else labels.to(ids.device),
                                     mask=None if mask is None else mask.to(ids.device))
    inputs = {k: to_device(batch[k]) for k in MODEL_INPUT_KEYS if batch.get(k) is not None}
    if batch.get("attention_mask") is None and varlen_attention_enabled(model):
        # sample offsets from the loader's CPU positions: the device never waits for them
        kwargs = packed_attention_kwargs(batch["input_ids"], batch.get("position_ids"))
        inputs.update({k: to_device(v) for k, v in kwargs.items()})
        mapping = no_mask_mapping(model)
        if mapping is not None:  # the offsets replace the mask: skip transformers' mask builder (a sync)
            inputs["attention_mask"] = mapping
    input_ids, labels, mask = to_device(batch["input_ids"]), to_device(batch.get("labels")), to_device(mask)
    loss_weights, positions = to_device(loss_weights), positions.to(device)
    if isinstance(model, CausalLMPolicy):
        return model(input_ids, labels=labels, mask=mask, with_entropy=with_entropy, chunk_size=chunk_size,
                     temperature=temperature, top_k=top_k, top_p=top_p, loss_weights=loss_weights,
                     token_loss=token_loss, positions=positions, **inputs)
    return hf_token_logprobs(model, input_ids, labels=labels, mask=mask, with_entropy=with_entropy,
                             chunk_size=chunk_size or 1024, temperature=temperature, top_k=top_k, top_p=top_p,
                             loss_weights=loss_weights,
                             token_loss=token_loss, positions=positions, **inputs)
