"""Plain string prompts are the model's input text as they are (no chat template), as TRL and
cosmos-rl's text models take them; a list of messages goes through the chat template. Checked on
the token ids every consumer uses: the HF engine, the vLLM stand-in, the training batch, and a queue
record's round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosmos_primitives import testing as cpt
from cosmos_primitives.data import ColumnPromptDataset, CosmosRLPromptDataset, encode_prompts, render_prompt
from cosmos_primitives.data.records import Prompt, SamplingParams
from cosmos_primitives.data.rollout_batch import collate_rollouts
from cosmos_primitives.queue.record import decode_record, encode_record, record_from_group
from cosmos_primitives.queue.record_groups import check_trainable, group_from_record
from cosmos_primitives.rollout.hf_engine import HFRolloutEngine

TEXT = "Question: what is 2 + 3?\nAnswer:"
MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]
PARAMS = SamplingParams(num_samples_per_prompt=2, temperature=1.0, max_response_length=4, seed=0)


def _expected(tokenizer) -> list[list[int]]:
    """``tokenizer(text)`` for the string; the template's own tokenization for the messages."""
    templated = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    templated = templated["input_ids"] if hasattr(templated, "keys") else templated
    return [tokenizer(TEXT)["input_ids"], list(templated)]


def test_token_ids_through_the_hf_engine_batch_and_queue(qwen_tokenizer) -> None:
    prompts = [Prompt(conversation=TEXT, prompt_id="plain"), Prompt(conversation=MESSAGES, prompt_id="chat")]
    plain_ids, chat_ids = _expected(qwen_tokenizer)
    assert "<|im_start|>" not in qwen_tokenizer.decode(plain_ids)
    assert qwen_tokenizer.decode(chat_ids).endswith("<|im_start|>assistant\n")
    assert render_prompt(qwen_tokenizer, prompts[0]) == TEXT

    groups = HFRolloutEngine(cpt.tiny_qwen3(seed=0), qwen_tokenizer).generate(prompts, PARAMS)
    assert [g.prompt_token_ids for g in groups] == [plain_ids, chat_ids]

    batch = collate_rollouts(groups, qwen_tokenizer)  # re-encodes the prompts: raises when the ids differ
    for row, (group, completion) in enumerate((g, c) for g in groups for c in g.completions):
        ids = group.prompt_token_ids + completion.token_ids
        assert batch.inputs["input_ids"][row, :len(ids)].tolist() == ids
        assert batch.completion_mask[row].sum() == len(completion.token_ids)

    record = decode_record(encode_record(record_from_group(groups[0], [1.0, 0.0], [1.0, -1.0])))
    assert record.conversation == TEXT and record.media == []
    rebuilt = group_from_record(record)
    assert rebuilt.prompt.conversation == TEXT
    check_trainable(record, rebuilt, qwen_tokenizer, num_samples_per_prompt=2)
    assert collate_rollouts([rebuilt], qwen_tokenizer).inputs["input_ids"].tolist() == \
        collate_rollouts(groups[:1], qwen_tokenizer).inputs["input_ids"].tolist()


def test_token_ids_through_the_vllm_standin(standin_vllm, tiny_qwen2_dir, qwen_tokenizer) -> None:
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    engine = VLLMRolloutEngine(str(tiny_qwen2_dir), qwen_tokenizer, dtype="float32")
    groups = engine.generate([Prompt(conversation=TEXT), Prompt(conversation=MESSAGES)], PARAMS)
    assert [g.prompt_token_ids for g in groups] == _expected(qwen_tokenizer)


def test_encoding_left_pads_without_changing_the_callers_tokenizer() -> None:
    tokenizer = cpt.qwen_tokenizer()
    assert tokenizer.padding_side == "right"
    short, long = Prompt(conversation="2 + 3?"), Prompt(conversation=TEXT)
    batch = encode_prompts(tokenizer, [short, long])
    assert tokenizer.padding_side == "right"
    short_ids = tokenizer("2 + 3?")["input_ids"]
    pad = batch["input_ids"].shape[1] - len(short_ids)
    assert pad > 0
    assert batch["attention_mask"][0].tolist() == [0] * pad + [1] * len(short_ids)
    assert batch["input_ids"][0, pad:].tolist() == short_ids
    assert batch["attention_mask"][1].all()


def test_plain_text_with_media_is_refused(qwen_tokenizer) -> None:
    with pytest.raises(ValueError, match="plain text with images or videos"):
        render_prompt(qwen_tokenizer, Prompt(conversation=TEXT, prompt_id="p", images=[object()]))


def test_column_and_cosmos_rl_datasets_keep_string_prompts_plain(tmp_path: Path) -> None:
    image = cpt.write_image(tmp_path / "a.png", cpt.color_image("red", size=(56, 56)))
    rows = [{"q": TEXT, "a": "5"}, {"q": "Which colour?", "a": "red", "image": str(image)},
            {"q": MESSAGES, "a": "5"}]
    plain, pictured, chat = (ColumnPromptDataset(rows, "q", "a")[i] for i in range(3))
    assert plain.conversation == TEXT and plain.reference == "5"
    assert pictured.conversation[0]["content"][0]["type"] == "image" and len(pictured.images) == 1
    assert chat.conversation == MESSAGES
    # an empty system prompt (a cosmos-rl file's default) leaves plain text plain; a real one asks for the template
    assert ColumnPromptDataset(rows, "q", "a", system_prompt="")[0].conversation == TEXT
    assert ColumnPromptDataset(rows, "q", "a", system_prompt="Be brief.")[0].conversation == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": TEXT}]}]

    class Script:  # cosmos-rl's dataset method shape, returning raw text as its text-model datasets do
        def setup(self, config, tokenizer):
            self.rows = rows[:1]

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, idx):
            return self.rows[idx]["q"]

        def get_reference_answer(self, idx):
            return self.rows[idx]["a"]

    item = CosmosRLPromptDataset(Script(), name="script")[0]
    assert item.conversation == TEXT and item.reference == "5"

