"""A user's cosmos-rl dataset script, in the shape of Cosmos-Reason1's ``tools/dataset/cosmos_grpo.py``
(``setup(config, tokenizer)``, ``__len__``, ``__getitem__`` -> conversation, ``get_reference_answer``,
and a reward ``fn(to_be_evaluated, reference, *args, **kwargs)``), reading a local JSONL of
``qa_pairs`` rows instead of the Hub dataset. It imports nothing from cosmos_primitives: the
recipes run it through their plug-in path (``--dataset reason1_style:CosmosGRPODataset --reward
reason1_style:custom_reward_fn``)."""

from __future__ import annotations

import json
import os
import re

FPS = 1
MAX_PIXELS = 81920


class CosmosGRPODataset:
    def setup(self, config, tokenizer, *args, **kwargs):
        self.config = config
        self.tokenizer = tokenizer
        path = config.train.train_policy.dataset.name
        self.column = config.train.train_policy.prompt_column_name or "qa_pairs"
        with open(path) as f:
            self.dataset = [json.loads(line) for line in f if line.strip()]
        self.root = os.path.dirname(path)

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, idx: int):
        payload = self.dataset[idx]
        choices = payload[self.column]["index2ans"]
        user_prompt = (payload[self.column]["question"] + "\n"
                       + "\n".join(f"({i}) {choice}" for i, choice in choices.items()))
        user_prompt += "\nAnswer with the option's letter from the given choices directly."
        user_prompt += ("\nPlease answer the question in the following format: <think> your reasoning </think> "
                        "<answer> your answer </answer>.")
        user_conv = [{"type": "text", "text": user_prompt}]
        if "video" in payload:
            user_conv.insert(0, {"type": "video", "video": os.path.join(self.root, payload["video"]),
                                 "max_pixels": MAX_PIXELS, "fps": FPS})
        elif "image" in payload:
            user_conv.insert(0, {"type": "image", "image": os.path.join(self.root, payload["image"])})
        return [{"role": "system", "content": ""}, {"role": "user", "content": user_conv}]

    def get_reference_answer(self, idx: int) -> str:
        return self.dataset[idx][self.column]["answer"]


def custom_reward_fn(to_be_evaluated: str, reference: str | None = None, *args, **kwargs) -> float:
    match = re.search(r"<answer>\s*\(?([A-Za-z])\)?\s*</answer>", to_be_evaluated)
    correct = float(bool(match) and reference is not None and match.group(1).upper() == reference.upper())
    well_formed = float(bool(re.fullmatch(r"\s*<think>.*</think>\s*<answer>.*</answer>\s*", to_be_evaluated, re.S)))
    return correct + well_formed
