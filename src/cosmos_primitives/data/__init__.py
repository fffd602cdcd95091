"""Dataset adapters, video sampling, Qwen-VL encoding (Qwen2.5-VL, Qwen3-VL; one ``vl_family`` description
each) with assistant-only labels, sequence packing and resumable samplers for VLM training; the rollout
record types (``Prompt``, ``SamplingParams``, ``Completion``, ``RolloutGroup``), prompt encoding and
rollout batches.

Names load on first use so that ``import cosmos_primitives.data`` stays cheap (no ``datasets``,
decoder or processor import until needed). See :mod:`cosmos_primitives.data.packing` for the batch
contract the trainer relies on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cosmos_primitives.utils.lazy_module import lazy_exports

_EXPORTS = {
    "Prompt": "records",
    "SamplingParams": "records",
    "Completion": "records",
    "RolloutGroup": "records",
    "render_prompt": "prompt_inputs",
    "encode_prompts": "prompt_inputs",
    "repeat_batch": "prompt_inputs",
    "RolloutBatch": "rollout_batch",
    "collate_rollouts": "rollout_batch",
    "token_budget_micro_batches": "token_budget",
    "pad_micro_batch_count": "token_budget",
    "padded_tokens": "token_budget",
    "ClipFolderDataset": "wfm_clips",
    "MockClipDataset": "wfm_clips",
    "HashingTextEmbedder": "wfm_clips",
    "build_wfm_dataset": "wfm_clips",
    "collate_clips": "wfm_clips",
    "negative_prompt_embedding": "wfm_clips",
    "read_clip": "wfm_clips",
    "resize_clip": "wfm_clips",
    "BadSampleError": "bad_samples",
    "BadSampleBudgetExceeded": "bad_samples",
    "BadSampleTracker": "bad_samples",
    "NoGoodSamplesError": "bad_samples",
    "bad_sample_boundary": "bad_samples",
    "ConversationSample": "conversation",
    "normalize_conversation": "conversation",
    "load_conversation": "conversation",
    "MediaSettings": "media",
    "load_image": "media",
    "SampledVideo": "video_sampling",
    "VideoDecodeError": "video_sampling",
    "sample_video": "video_sampling",
    "HFConversationDataset": "hf_conversations",
    "load_hf_dataset": "hf_conversations",
    "VideoFolderDataset": "video_folder",
    "MCQPromptDataset": "mcq",
    "CosmosRLPromptDataset": "plugins",
    "CosmosRLConversationDataset": "plugins",
    "ColumnPromptDataset": "plugins",
    "prompt_dataset": "plugins",
    "sft_plugin_dataset": "plugins",
    "load_plugin": "plugins",
    "make_plugin": "plugins",
    "call_setup": "plugins",
    "check_plugins_read": "plugins",
    "mcq_prompt_text": "mcq",
    "mcq_choices": "mcq",
    "answer_letter": "mcq",
    "MRopeSpec": "mrope",
    "mrope_position_ids": "mrope",
    "IGNORE_INDEX": "qwen_vl_encoding",
    "EncodedSample": "qwen_vl_encoding",
    "encode_conversation": "qwen_vl_encoding",
    "assistant_labels": "qwen_vl_encoding",
    "collate_packed": "packing",
    "collate_padded": "packing",
    "model_inputs": "packing",
    "padding_stats": "packing",
    "ResumableDistributedSampler": "sampler",
    "prompt_stream": "prompt_streaming",
    "SFTBatchLoader": "sft_loader",
    "all_ranks_have_batch": "sft_loader",
    "build_sft_dataset": "sft_loader",
    "build_sft_loader": "sft_loader",
    "IndexedSubset": "sft_validation",
    "split_validation": "sft_validation",
    "build_sft_datasets": "sft_validation",
    "build_sft_validation_loader": "sft_validation",
    "build_grpo_datasets": "grpo_validation",
    "precompute_clip_folder": "text_embeddings",
    "reason_text_embeddings": "text_embeddings",
    "WebDatasetClips": "wfm_webdataset",
    "list_shards": "wfm_webdataset",
    "build_wfm_webdataset": "wfm_webdataset",
    "WFMPromptSource": "wfm_prompts",
}

__all__ = [  # the public surface (tests/test_public_surface.py); the rest by module path
    "BadSampleError", "BadSampleTracker", "ColumnPromptDataset", "ConversationSample",
    "CosmosRLConversationDataset", "MCQPromptDataset", "MediaSettings", "Prompt", "RolloutBatch", "SamplingParams",
    "WFMPromptSource", "bad_sample_boundary", "build_grpo_datasets", "build_sft_loader", "check_plugins_read",
    "collate_clips", "collate_rollouts", "load_conversation", "load_image", "make_plugin", "mcq_prompt_text",
    "negative_prompt_embedding", "prompt_dataset", "prompt_stream", "sample_video",
]

if TYPE_CHECKING:  # pragma: no cover
    from cosmos_primitives.data.bad_samples import (
        BadSampleBudgetExceeded,
        BadSampleError,
        BadSampleTracker,
        NoGoodSamplesError,
        bad_sample_boundary,
    )
    from cosmos_primitives.data.conversation import (
        ConversationSample,
        load_conversation,
        normalize_conversation,
    )
    from cosmos_primitives.data.grpo_validation import build_grpo_datasets
    from cosmos_primitives.data.hf_conversations import HFConversationDataset, load_hf_dataset
    from cosmos_primitives.data.mcq import MCQPromptDataset, answer_letter, mcq_choices, mcq_prompt_text
    from cosmos_primitives.data.media import MediaSettings, load_image
    from cosmos_primitives.data.mrope import MRopeSpec, mrope_position_ids
    from cosmos_primitives.data.packing import collate_packed, collate_padded, model_inputs, padding_stats
    from cosmos_primitives.data.plugins import (
        ColumnPromptDataset,
        CosmosRLConversationDataset,
        CosmosRLPromptDataset,
        call_setup,
        check_plugins_read,
        load_plugin,
        make_plugin,
        prompt_dataset,
        sft_plugin_dataset,
    )
    from cosmos_primitives.data.prompt_inputs import encode_prompts, render_prompt, repeat_batch
    from cosmos_primitives.data.prompt_streaming import prompt_stream
    from cosmos_primitives.data.qwen_vl_encoding import (
        IGNORE_INDEX,
        EncodedSample,
        assistant_labels,
        encode_conversation,
    )
    from cosmos_primitives.data.records import Completion, Prompt, RolloutGroup, SamplingParams
    from cosmos_primitives.data.rollout_batch import RolloutBatch, collate_rollouts
    from cosmos_primitives.data.sampler import ResumableDistributedSampler
    from cosmos_primitives.data.sft_loader import (
        SFTBatchLoader,
        all_ranks_have_batch,
        build_sft_dataset,
        build_sft_loader,
    )
    from cosmos_primitives.data.sft_validation import (
        IndexedSubset,
        build_sft_datasets,
        build_sft_validation_loader,
        split_validation,
    )
    from cosmos_primitives.data.text_embeddings import precompute_clip_folder, reason_text_embeddings
    from cosmos_primitives.data.token_budget import pad_micro_batch_count, padded_tokens, token_budget_micro_batches
    from cosmos_primitives.data.video_folder import VideoFolderDataset
    from cosmos_primitives.data.video_sampling import SampledVideo, VideoDecodeError, sample_video
    from cosmos_primitives.data.wfm_prompts import WFMPromptSource
    from cosmos_primitives.data.wfm_webdataset import WebDatasetClips, build_wfm_webdataset, list_shards

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
