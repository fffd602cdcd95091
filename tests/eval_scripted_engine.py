"""A rollout engine with scripted completions, shared by the cp.eval tests (not collected: no test_ prefix)."""

from __future__ import annotations

from collections.abc import Sequence

from cosmos_primitives.data.records import Completion, Prompt, RolloutGroup, SamplingParams


class ScriptedEngine:
    """Returns ``script[prompt_id]`` (a string, or a list consumed one call at a time); records every call."""

    def __init__(self, script: dict[str, str | list[str]], fail_on_call: int | None = None) -> None:
        self.script = {k: list(v) if isinstance(v, list) else v for k, v in script.items()}
        self.fail_on_call = fail_on_call
        self.calls: list[list[str]] = []
        self.prompts: list[Prompt] = []
        self.params: list[SamplingParams] = []
        self.weight_version = 0

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[RolloutGroup]:
        if self.fail_on_call is not None and len(self.calls) + 1 == self.fail_on_call:
            raise RuntimeError("simulated crash of the rollout engine")
        self.calls.append([p.prompt_id for p in prompts])
        self.prompts.extend(prompts)
        self.params.append(params)
        groups = []
        for p in prompts:
            entry = self.script[p.prompt_id]
            text = entry.pop(0) if isinstance(entry, list) else entry
            completion = Completion(text=text, token_ids=[1, 2, 3], logprobs=[-0.1] * 3, finish_reason="stop")
            groups.append(RolloutGroup(prompt=p, prompt_token_ids=[7] * 11, completions=[completion],
                                       weight_version=self.weight_version))
        return groups

    def update_weights(self, named_tensors, version: int) -> None:
        self.weight_version = version

    @property
    def called_ids(self) -> list[str]:
        return [pid for call in self.calls for pid in call]
