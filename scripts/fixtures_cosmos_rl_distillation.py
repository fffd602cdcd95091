"""Write ``tests/data/cosmos_rl_distillation.json``: cosmos-rl's own on-policy distillation advantages
(``GRPOTrainer.compute_teacher_kl_advantages``, ``compute_teacher_topk_jsd_kl_advantages`` and
``post_process_teacher_kl_advantages``) on seeded inputs, the reference ``tests/test_distillation.py``
compares ``cosmos_primitives.algo.distillation`` with.

Run it with the interpreter of an environment holding cosmos-rl 0.4.7::

    /work/venvs/cosmos-rl/bin/python scripts/fixtures_cosmos_rl_distillation.py

The trainer module cannot be imported outside cosmos-rl's pinned torch (its package ``__init__``
patches torch internals), so the three methods are taken from its source file by name, compiled
alone and called on a stand-in ``self`` holding ``config.distillation`` and ``device``: the code that
runs is cosmos-rl's, unchanged.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import types
from importlib.metadata import version
from pathlib import Path

import torch
import torch.nn.functional as F

METHODS = ("compute_teacher_kl_advantages", "compute_teacher_topk_jsd_kl_advantages",
           "post_process_teacher_kl_advantages")
OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "cosmos_rl_distillation.json"


def load_methods() -> dict[str, types.FunctionType]:
    root = Path(importlib.util.find_spec("cosmos_rl").submodule_search_locations[0])
    source = (root / "policy" / "trainer" / "llm_trainer" / "grpo_trainer.py").read_text()
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name in METHODS:
            module = ast.Module(body=[node], type_ignores=[])
            namespace = {"torch": torch, "F": F}
            exec(compile(module, "cosmos_rl/policy/trainer/llm_trainer/grpo_trainer.py", "exec"), namespace)
            found[node.name] = namespace[node.name]
    missing = set(METHODS) - set(found)
    if missing:
        raise SystemExit(f"cosmos-rl's grpo_trainer.py has no {sorted(missing)}: another version?")
    return found


def trainer(methods: dict[str, types.FunctionType], **distillation: float) -> types.SimpleNamespace:
    self = types.SimpleNamespace(config=types.SimpleNamespace(distillation=types.SimpleNamespace(**distillation)),
                                 device=torch.device("cpu"))
    for name, fn in methods.items():
        setattr(self, name, types.MethodType(fn, self))
    return self


def case(methods, gen: torch.Generator, *, top_k: int, beta: float, coef: float, gamma: float) -> dict:
    lengths = [5, 3, 6]
    width = 7
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for row, n in enumerate(lengths):
        mask[row, width - n:] = True  # completions right-aligned, as a prompt precedes them
    advantages = torch.randn(len(lengths), generator=gen).unsqueeze(1).expand(-1, width).contiguous()
    k = max(top_k, 1)
    teacher = torch.log_softmax(torch.randn(len(lengths), width, 12, generator=gen), -1)[..., :k]
    student = torch.log_softmax(torch.randn(len(lengths), width, 12, generator=gen), -1)[..., :k]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    self = trainer(methods, jsd_beta=beta, kl_penalty_coef=coef, kl_discount_factor=gamma)
    packed_student = student[mask]  # [n_tokens, k]
    if top_k > 0:
        out, metrics = self.compute_teacher_topk_jsd_kl_advantages(
            current_logprobs=packed_student, teacher_logprobs=teacher, current_advantages=advantages,
            logprob_masks=mask, cu_seqlens=cu)
    else:
        out, metrics = self.compute_teacher_kl_advantages(
            current_logprobs=packed_student.squeeze(-1), teacher_logprobs=teacher.squeeze(-1),
            current_advantages=advantages, logprob_masks=mask, cu_seqlens=cu)
    return {"top_k": top_k, "jsd_beta": beta, "kl_penalty_coef": coef, "kl_discount_factor": gamma,
            "mask": mask.int().tolist(), "advantages": advantages[:, 0].tolist(),
            "student_logprobs": student.tolist(), "teacher_logprobs": teacher.tolist(),
            "packed_advantages": out.tolist(), "metrics": {k: float(v) for k, v in metrics.items()}}


def main() -> None:
    methods = load_methods()
    gen = torch.Generator().manual_seed(0)
    cases = [case(methods, gen, top_k=top_k, beta=beta, coef=coef, gamma=gamma)
             for top_k, beta in ((0, 0.5), (4, 0.0), (4, 0.5), (4, 1.0), (4, 0.1))
             for coef, gamma in ((1.0, 0.0), (0.5, 0.9))]
    OUT.write_text(json.dumps({"cosmos_rl": version("cosmos_rl"), "cases": cases}, indent=1) + "\n")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
