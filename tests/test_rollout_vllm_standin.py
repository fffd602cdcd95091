"""VLLMRolloutEngine against the vLLM stand-in in ``tests/standins/vllm``, which models the real
engine's documented behaviours (engine process, launcher env, prefix cache, sleep mode, vLLM's fused
parameter names); vLLM itself cannot run here."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos_primitives import testing as cpt
from cosmos_primitives.data.records import Prompt, SamplingParams
from cosmos_primitives.rollout.base import RolloutEngine
from cosmos_primitives.utils.extras import MissingExtraError

STANDINS = str(Path(__file__).parent / "standins")
HI = Prompt(conversation=[{"role": "user", "content": "hi"}], prompt_id="a")


# the prefixes of vLLM's hf_to_vllm_mapper that apply to transformers 5's in-memory names, copied from
# vllm/model_executor/models/qwen2_5_vl.py and qwen3_vl.py (text models keep their names)
VLLM_PREFIXES = {
    model_type: (("model.language_model.", "language_model.model."), ("model.visual.", "visual."),
                 ("lm_head.", "language_model.lm_head."))
    for model_type in ("qwen2_5_vl", "qwen3_vl")
}
# VL families as the stand-in tests build them: (builder, config kwargs); Qwen3-VL tied (2B) and untied (8B)
VL_FAMILIES = {
    "qwen2_5_vl": (cpt.tiny_qwen2_5_vl, {}),
    "qwen3_vl_tied": (cpt.tiny_qwen3_vl, {}),
    "qwen3_vl_untied": (cpt.tiny_qwen3_vl, {"tie_word_embeddings": False}),
}


def tiny_model(variant: str, seed: int):
    """A tiny ``"qwen2"`` or VL model (a :data:`VL_FAMILIES` variant)."""
    if variant == "qwen2":
        return cpt.tiny_qwen2(seed=seed)
    build, kwargs = VL_FAMILIES[variant]
    return build(seed=seed, **kwargs)


def save_tiny(variant: str, path: Path, seed: int) -> Path:
    """:func:`tiny_model` and the Qwen tokenizer in ``path`` (what the stand-in loads); a Qwen2.5-VL
    variant with its processor (the stand-in processes its media)."""
    tiny_model(variant, seed).save_pretrained(path)
    cpt.qwen_tokenizer().save_pretrained(path)
    if variant == "qwen2_5_vl":
        cpt.tiny_qwen2_5_vl_processor().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory):
    """``(variant, seed) -> folder`` of :func:`save_tiny`, each written once per module (do not modify)."""
    made: dict[tuple[str, int], Path] = {}

    def folder(variant: str, seed: int) -> str:
        if (variant, seed) not in made:
            made[variant, seed] = save_tiny(variant, tmp_path_factory.mktemp(variant) / str(seed), seed)
        return str(made[variant, seed])

    return folder


def _renamed(name: str, model_type: str) -> str:
    for old, new in VLLM_PREFIXES.get(model_type, ()):
        if name.startswith(old):
            return new + name[len(old):]
    return name


def _vllm_names(model) -> dict[str, torch.Tensor]:
    """A HF model's weights as vLLM's in-memory model holds them: renamed by the model's
    ``hf_to_vllm_mapper``, q/k/v and gate/up fused on dim 0, a tied head left out."""
    model_type = model.config.model_type
    return {_renamed(n, model_type): p for n, p in _fused(model).items()}


def _fused(model) -> dict[str, torch.Tensor]:
    """``model``'s parameters under HF names with q/k/v and gate/up fused (a tied head left out)."""
    out = {}
    params = dict(model.named_parameters())
    for name, p in params.items():
        if ".k_proj." in name or ".v_proj." in name or ".up_proj." in name:
            continue
        if ".q_proj." in name:
            out[name.replace(".q_proj.", ".qkv_proj.")] = torch.cat(
                [params[name.replace(".q_proj.", f".{x}_proj.")] for x in "qkv"])
        elif ".gate_proj." in name:
            out[name.replace(".gate_proj.", ".gate_up_proj.")] = torch.cat(
                [p, params[name.replace(".gate_proj.", ".up_proj.")]])
        else:
            out[name] = p
    if model.config.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


def test_missing_vllm_names_the_extra(monkeypatch: pytest.MonkeyPatch, qwen_tokenizer) -> None:
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(MissingExtraError, match=r"cosmos_primitives\[vllm\]"):
        VLLMRolloutEngine("/nowhere", qwen_tokenizer)


def test_generate_and_in_process_weight_update(standin_vllm, tiny_qwen2_dir, qwen_tokenizer) -> None:
    """Item 1: the engine core runs in this process, so weights reach the model without being serialised."""
    from cosmos_primitives.rollout.vllm_engine import WORKER_EXTENSION, VLLMRolloutEngine

    engine = VLLMRolloutEngine(str(tiny_qwen2_dir), qwen_tokenizer, seed=3, dtype="float32")
    assert isinstance(engine, RolloutEngine)
    llm_kwargs = standin_vllm.CALLS[0][1]
    assert llm_kwargs["worker_extension_cls"] == WORKER_EXTENSION
    assert llm_kwargs["logprobs_mode"] == "processed_logprobs"
    assert engine.llm.in_process, "LLM() was built with VLLM_ENABLE_V1_MULTIPROCESSING on"
    prompts = [HI, Prompt(conversation=[{"role": "user", "content": "bye"}], prompt_id="b")]
    groups = engine.generate(prompts, SamplingParams(num_samples_per_prompt=3, temperature=0.7, max_response_length=4,
                                                     seed=1))
    assert [g.prompt.prompt_id for g in groups] == ["a", "b"]
    for g in groups:
        assert len(g.completions) == 3 and g.weight_version == 0
        assert g.prompt_token_ids[-3:] == qwen_tokenizer.encode("<|im_start|>assistant\n")
        for c in g.completions:
            assert len(c.token_ids) == len(c.logprobs) and all(lp <= 0 for lp in c.logprobs)
            assert c.finish_reason in ("stop", "length")

    new = cpt.tiny_qwen2(seed=5)
    engine.update_weights(new.state_dict().items(), version=4)
    assert engine.weight_version == 4
    assert standin_vllm.SERIALIZED == [], "weights went through the engine-process serializer"
    held = dict(engine.llm.worker.model_runner.model.named_parameters())
    expected = _vllm_names(new)
    assert sorted(held) == sorted(expected)
    for name, value in expected.items():
        assert torch.equal(held[name], value), name


def _launch(folder: str):
    """One torchrun rank: an engine on rank 1 only is refused; one on every rank says where it landed."""
    sys.path.insert(0, STANDINS)
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    try:
        VLLMRolloutEngine(folder, None, seed=0, dtype="float32", engine_ranks=[1])
        refused = ""
    except ValueError as error:
        refused = str(error)
    llm = VLLMRolloutEngine(folder, None, seed=0, dtype="float32").llm
    return refused, (llm.backend, llm.device_index, llm.world_size, llm.worker.device)


@pytest.mark.slow
def test_one_engine_per_local_gpu_under_torchrun(tiny_qwen2_dir) -> None:
    """Item 2: inside a torchrun job every rank's engine takes its own LOCAL_RANK's GPU through vLLM's
    external launcher (the uni-process executor would put them all on device 0); an engine on only
    some ranks of the job (disaggregated) is refused before vLLM builds groups over the trainers too."""
    got = cpt.run_distributed(_launch, 2, args=(str(tiny_qwen2_dir),), env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
    placed = [where for _, where in got]
    assert placed == [("external_launcher", 0, 2, "cuda:0"), ("external_launcher", 1, 2, "cuda:1")]
    for refused, _ in got:
        assert "rollout ranks [1]" in refused and "all 2 ranks" in refused


def test_an_engine_core_left_in_another_process_is_refused(standin_vllm, tiny_qwen2_dir, qwen_tokenizer,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM caches its environment variables once read: if multiprocessing stayed on, say so at once."""
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    monkeypatch.setattr(standin_vllm, "_env_flag", lambda name, default: True)  # the value read before
    with pytest.raises(RuntimeError, match=r"SyncMPClient, i\.e\. in another process"):
        VLLMRolloutEngine(str(tiny_qwen2_dir), qwen_tokenizer, dtype="float32")


def test_single_process_engine_uses_the_uniproc_executor(standin_vllm, tiny_qwen2_dir, qwen_tokenizer) -> None:
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    engine = VLLMRolloutEngine(str(tiny_qwen2_dir), qwen_tokenizer, dtype="float32")
    assert "distributed_executor_backend" not in standin_vllm.CALLS[0][1]
    assert engine.llm.device_index == 0 and engine.llm.world_size == 1


@pytest.mark.parametrize("variant", ["qwen2", *sorted(VL_FAMILIES)])
def test_weight_update_resets_the_prefix_cache(variant: str, standin_vllm, qwen_tokenizer, tiny_dirs) -> None:
    """Item 3: after an update, a prompt seen before is computed with the new weights, not from the
    KV its prefix had under the old ones: the updated engine generates what one started from the new
    weights does (for the VL families, the whole model arrives under transformers 5's names)."""
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    params = SamplingParams(num_samples_per_prompt=1, temperature=1.0, max_response_length=4, seed=2)
    engine = VLLMRolloutEngine(tiny_dirs(variant, 0), qwen_tokenizer, dtype="float32")
    before = engine.generate([HI], params)[0].completions[0]  # fills the prefix cache with the old weights' KV
    engine.update_weights(tiny_model(variant, seed=5).state_dict().items(), version=1)
    after = engine.generate([HI], params)[0].completions[0]
    fresh = VLLMRolloutEngine(tiny_dirs(variant, 5), qwen_tokenizer, dtype="float32")
    expected = fresh.generate([HI], params)[0].completions[0]
    assert after.token_ids == expected.token_ids
    assert after.logprobs == pytest.approx(expected.logprobs, abs=1e-5)
    assert before.logprobs != pytest.approx(expected.logprobs, abs=1e-5)  # the update changed something


@pytest.mark.parametrize("variant", sorted(VL_FAMILIES))
def test_vl_sync_into_the_engine_is_bitwise_under_vllms_names(variant: str, standin_vllm, tiny_dirs) -> None:
    """A VL trainer's weights in the checkpoint names vLLM's ``load_weights`` takes land, bit for bit, in
    the tensors vLLM's Qwen2.5-VL / Qwen3-VL model holds (language model renamed and fused, vision tower
    kept, a separate ``lm_head`` only when untied); the family's ``"vllm"`` layout names exactly those."""
    import cosmos_primitives as cp
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    engine = VLLMRolloutEngine(tiny_dirs(variant, 0), None, dtype="float32")
    trainer = tiny_model(variant, seed=5)
    held = dict(engine.llm.worker.model_runner.model.named_parameters())
    names = [n for n, _ in trainer.named_parameters()]
    tied = trainer.config.tie_word_embeddings
    family = cp.models.get_family(trainer.config.model_type)
    assert {s.name for s in cp.models.map_names(names, "vllm", family, tied=tied)} == set(held)
    assert ("language_model.lm_head.weight" in held) != tied
    sync = cp.sync.InProcessSync(trainer, engine, layout="hf_checkpoint")
    for version in (1, 2):
        assert sync.sync(version=version).verified == (version == 1)
        expected = _vllm_names(trainer)
        assert sorted(held) == sorted(expected)
        for name, value in expected.items():
            assert cp.sync.bitwise_equal(held[name], value.detach()), name
        with torch.no_grad():
            for p in trainer.parameters():
                p.add_(torch.randn_like(p) * 1e-2)


def test_colocated_engine_sleeps_between_rollouts(standin_vllm, tiny_qwen2_dir, qwen_tokenizer) -> None:
    """Beside a resident trainer the engine sleeps after each rollout; an update wakes the weights only
    (the KV cache stays freed while the trainer steps), the next rollout wakes the rest."""
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    engine = VLLMRolloutEngine(str(tiny_qwen2_dir), qwen_tokenizer, dtype="float32", sleep_level=1)
    assert standin_vllm.CALLS[0][1]["enable_sleep_mode"] is True
    engine.generate([HI], SamplingParams(num_samples_per_prompt=1, max_response_length=2))
    assert engine.llm.asleep == {"weights", "kv_cache"}
    del standin_vllm.CALLS[:]
    engine.update_weights(cpt.tiny_qwen2(seed=5).state_dict().items(), version=1)
    assert engine.llm.asleep == {"kv_cache"}
    engine.generate([HI], SamplingParams(num_samples_per_prompt=1, max_response_length=2))
    assert [c for c in standin_vllm.CALLS if c[0] not in ("video_fps", "encoder_outputs")] == [
        ("wake_up", ["weights"]), ("collective_rpc", "cosmos_load_weights"), ("reset_prefix_cache", None),
        ("reset_encoder_cache", None), ("wake_up", ["kv_cache"]), ("generate", 1), ("sleep", 1)]


def test_requests_carry_per_video_fps_and_vllm_sampling_defaults(standin_vllm, tiny_qwen2_dir,
                                                                 qwen_tokenizer) -> None:
    """Item 5: each video keeps its own fps; top_k off is vLLM's 0; aborted completions are dropped
    (issue 29: they are not samples of the policy) and counted."""
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    engine = VLLMRolloutEngine(str(tiny_qwen2_dir), qwen_tokenizer, dtype="float32")
    frames = [np.zeros((4, 28, 28, 3), dtype=np.uint8), np.zeros((2, 28, 28, 3), dtype=np.uint8)]
    two = Prompt(conversation=[{"role": "user", "content": "compare"}], prompt_id="v", videos=frames,
                 video_fps=[2.0, 4.0])
    engine.generate([two, HI], SamplingParams(num_samples_per_prompt=1, max_response_length=2, top_k=-1))
    assert [c[1] for c in standin_vllm.CALLS if c[0] == "video_fps"] == [[[2.0, 4.0], []]]
    # a video read from a file goes with its source timing, as the trainer's processor gets it
    timed = Prompt(conversation=[{"role": "user", "content": "when?"}], prompt_id="t", videos=frames[:1],
                   video_fps=[2.0], video_metadata=[{"fps": 8.0, "frames_indices": [0, 3, 6, 9],
                                                     "total_num_frames": 10}])
    _, metadata = VLLMRolloutEngine._request("when?", timed)["multi_modal_data"]["video"]
    assert metadata == {"total_num_frames": 10, "fps": 8.0, "duration": 10 / 8.0, "frames_indices": [0, 3, 6, 9]}
    sent = engine._sampling_params(SamplingParams(num_samples_per_prompt=1, top_k=-1))
    assert sent.top_k == 0
    assert engine._sampling_params(SamplingParams(num_samples_per_prompt=1, top_k=7)).top_k == 7

    standin_vllm.ABORT_AFTER_TOKENS = 1
    assert engine.generate([HI], SamplingParams(num_samples_per_prompt=2, max_response_length=5, temperature=1.0,
                                                seed=3)) == []
    assert engine.dropped == {"abort": 2}


# issue 29: the second pass against vLLM's source ----------------------------------------------------

IMAGE = np.arange(28 * 28 * 3, dtype=np.uint8).reshape(28, 28, 3)
FRAMES = np.zeros((4, 28, 28, 3), dtype=np.uint8)


def _video_prompt(fps: float = 2.0) -> Prompt:
    content = [{"type": "video"}, {"type": "text", "text": "what happens?"}]
    return Prompt(conversation=[{"role": "user", "content": content}], prompt_id="v", videos=[FRAMES], video_fps=[fps])


@pytest.mark.parametrize("release", ["0.30.0", "0.31.0"])
def test_qwen2_5_vl_video_fps_reaches_the_processor_or_is_refused(release: str, standin_vllm, tiny_dirs,
                                                                  tiny_vl_processor) -> None:
    """Defect a: before vLLM 0.31 Qwen2.5-VL's parser drops the video metadata and transformers takes 24 fps,
    so rollout positions would differ from the trainer's: the engine refuses videos there, and from 0.31
    each video is processed at its own fps."""
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    standin_vllm.__version__ = release
    engine = VLLMRolloutEngine(tiny_dirs("qwen2_5_vl", 0), tiny_vl_processor, dtype="float32")
    params = SamplingParams(num_samples_per_prompt=1, max_response_length=2, seed=1)
    if release == "0.30.0":
        with pytest.raises(ValueError, match=r"0\.31"):
            engine.generate([_video_prompt()], params)
        engine.generate([HI], params)  # text (and images) still work
    else:
        engine.generate([_video_prompt(4.0)], params)
        assert [c[1] for c in standin_vllm.CALLS if c[0] == "video_fps"] == [[[4.0]]]


def test_weight_update_resets_the_encoder_cache(standin_vllm, tiny_dirs, tiny_vl_processor) -> None:
    """Defect b: with sleep_level = 0 a repeated image is embedded again after an update, with the new
    weights (the stand-in's encoder cache keys on the image only, as vLLM's mm_hash)."""
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    content = [{"type": "image"}, {"type": "text", "text": "what is it?"}]
    seen = Prompt(conversation=[{"role": "user", "content": content}], prompt_id="i", images=[IMAGE])
    params = SamplingParams(num_samples_per_prompt=1, max_response_length=2, seed=1)

    def embedded_with(engine) -> list[list[float]]:
        engine.generate([seen], params)
        return [c[1] for c in standin_vllm.CALLS if c[0] == "encoder_outputs"][-1]

    engine = VLLMRolloutEngine(tiny_dirs("qwen2_5_vl", 0), tiny_vl_processor, dtype="float32")
    old = embedded_with(engine)
    engine.update_weights(tiny_model("qwen2_5_vl", seed=5).state_dict().items(), version=1)
    after = embedded_with(engine)
    fresh = embedded_with(VLLMRolloutEngine(tiny_dirs("qwen2_5_vl", 5), tiny_vl_processor, dtype="float32"))
    assert after == fresh and after != old


def test_cuda_cache_is_emptied_before_every_wake_up(standin_vllm, tiny_qwen2_dir, qwen_tokenizer,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect c: vLLM 0.20 - 0.26 do not empty torch's CUDA cache before waking up, so memory the trainer
    freed is still held by torch's allocator when vLLM maps its pool back."""
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: standin_vllm.CALLS.append(("empty_cache", None)))
    engine = VLLMRolloutEngine(str(tiny_qwen2_dir), qwen_tokenizer, dtype="float32", sleep_level=1)
    engine.generate([HI], SamplingParams(num_samples_per_prompt=1, max_response_length=2))
    engine.update_weights(cpt.tiny_qwen2(seed=5).state_dict().items(), version=1)
    engine.generate([HI], SamplingParams(num_samples_per_prompt=1, max_response_length=2))
    order = [c[0] for c in standin_vllm.CALLS]
    wakes = [i for i, name in enumerate(order) if name == "wake_up"]
    assert len(wakes) == 2 and all(order[i - 1] == "empty_cache" for i in wakes), order


def _peak_bf16_bytes_during_loads(standin_vllm, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records, at every ``load_weights`` call of the stand-in, the bytes of bf16 tensors alive in the
    process (the trainer and the engine are float32 here: every bf16 tensor is a staging copy)."""
    import gc

    peaks: list[int] = []
    real = standin_vllm._VLLMModel.load_weights

    def counting(self, weights):
        weights = list(weights)
        storages = {}
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor) and obj.dtype == torch.bfloat16:
                storage = obj.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        peaks.append(sum(storages.values()))
        return real(self, weights)

    monkeypatch.setattr(standin_vllm._VLLMModel, "load_weights", counting)
    return peaks


def _many_layers(seed: int):
    """A Qwen2 model whose weights are spread over many tensors (small vocabulary, 8 layers), so that a
    bucket is a small part of the model (the Qwen vocabulary's embedding alone would be most of it)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False))


def test_sync_streams_bucket_by_bucket(standin_vllm, tmp_path, qwen_tokenizer,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect d: an FSDP2 / float32 trainer's weights reach the engine in bf16 one bucket at a time: the
    extra memory at any moment is at most a bucket (plus one tensor), not a bf16 copy of the whole model
    kept for the run."""
    import cosmos_primitives as cp
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    _many_layers(0).save_pretrained(tmp_path)
    bucket = 128 << 10
    engine = VLLMRolloutEngine(str(tmp_path), qwen_tokenizer, dtype="float32", update_bucket_bytes=bucket)
    trainer = _many_layers(5)
    whole = sum(p.numel() * 2 for p in trainer.parameters())
    largest = max(p.numel() * 2 for p in trainer.parameters())
    peaks = _peak_bf16_bytes_during_loads(standin_vllm, monkeypatch)
    sync = cp.sync.InProcessSync(trainer, engine, layout="hf_checkpoint", dtype=torch.bfloat16)
    assert sync.sync(version=1).verified
    assert max(peaks) <= bucket + largest < whole / 3, (peaks, whole)
    sent = [n for method, n in standin_vllm.RPC_TENSOR_BYTES if method == "cosmos_load_weights"]
    assert sum(sent) == whole and len(sent) > 3 and max(sent) <= bucket + largest
    sync.sync(version=2)  # nothing is kept between syncs either
    assert max(peaks) <= bucket + largest


def test_every_request_and_sample_has_its_own_seed(standin_vllm, tiny_qwen2_dir, qwen_tokenizer) -> None:
    """Defect e: two copies of one prompt in a call must not draw the same noise (vLLM seeds each request,
    and child k of a request with seed + k); the seeds of every (rank, prompt, sample) are distinct."""
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine, request_seed

    engine = VLLMRolloutEngine(str(tiny_qwen2_dir), qwen_tokenizer, dtype="float32")
    twin = Prompt(conversation=HI.conversation, prompt_id="twin")
    groups = engine.generate([HI, twin], SamplingParams(num_samples_per_prompt=2, temperature=1.0,
                                                        max_response_length=8, seed=1))
    first, second = ([c.token_ids for c in g.completions] for g in groups)
    assert first != second
    # the examples pass seed = run * 1_000_003 + step * 1009 + rank: no child seed is used twice
    used = set()
    for step in range(3):
        for rank in range(4):
            for index in range(8):
                base = request_seed(7 * 1_000_003 + step * 1009 + rank, rank, index, n=4)
                children = {base + k for k in range(4)}
                assert not used & children
                used |= children


def test_rollout_config_bounds_vllm_start_up_profiling(standin_vllm, tiny_qwen2_dir, qwen_tokenizer) -> None:
    """Defect f: [rollout] max_num_batched_tokens, limit_mm_per_prompt and mm_processor_kwargs reach LLM()."""
    import cosmos_primitives as cp

    cfg = cp.load_config(overrides=["rollout.backend=vllm", "rollout.max_num_batched_tokens=2048"]).rollout
    cfg.limit_mm_per_prompt = {"image": 2, "video": 1}
    cfg.mm_processor_kwargs = {"max_pixels": 200704}
    cp.rollout.build_rollout_engine(cfg, str(tiny_qwen2_dir), qwen_tokenizer, dtype="float32")
    sent = standin_vllm.CALLS[0][1]
    assert sent["max_num_batched_tokens"] == 2048
    assert sent["limit_mm_per_prompt"] == {"image": 2, "video": 1}
    assert sent["mm_processor_kwargs"] == {"max_pixels": 200704}


@pytest.mark.parametrize("release", ["0.20.0", "0.21.0"])
def test_expandable_segments_with_sleep_mode_on_vllm_0_20_is_refused(release: str, standin_vllm, tiny_qwen2_dir,
                                                                     qwen_tokenizer,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect g: on 0.20 sleep mode fails with expandable segments; say so when the engine is built."""
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    standin_vllm.__version__ = release
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64,expandable_segments:True")
    if release == "0.20.0":
        with pytest.raises(ValueError, match=r"PYTORCH_CUDA_ALLOC_CONF.*expandable_segments"):
            VLLMRolloutEngine(str(tiny_qwen2_dir), qwen_tokenizer, dtype="float32", sleep_level=1)
        VLLMRolloutEngine(str(tiny_qwen2_dir), qwen_tokenizer, dtype="float32", sleep_level=0)  # no sleep: fine
    else:
        engine = VLLMRolloutEngine(str(tiny_qwen2_dir), qwen_tokenizer, dtype="float32", sleep_level=1)
        engine.generate([HI], SamplingParams(num_samples_per_prompt=1, max_response_length=2))


def test_repetition_is_kept_and_aborted_or_failed_completions_are_dropped(standin_vllm, tiny_qwen2_dir,
                                                                          qwen_tokenizer,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """Defect h: "repetition" is a finished completion; "abort" / "error" ones never reach training, and
    their number is logged."""
    import logging

    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    engine = VLLMRolloutEngine(str(tiny_qwen2_dir), qwen_tokenizer, dtype="float32")
    standin_vllm.FORCE_FINISH.update({0: "repetition", 1: "error"})
    prompts = [HI, Prompt(conversation=[{"role": "user", "content": "bye"}], prompt_id="b")]
    with caplog.at_level(logging.WARNING):
        groups = engine.generate(prompts, SamplingParams(num_samples_per_prompt=2, max_response_length=3, seed=1))
    assert [g.prompt.prompt_id for g in groups] == ["a"]
    assert [c.finish_reason for c in groups[0].completions] == ["repetition", "repetition"]
    assert "dropped 2 of 4 completions" in caplog.text and "'error': 2" in caplog.text


def test_weights_go_through_get_model_with_cuda_graphs(standin_vllm, tiny_qwen2_dir, qwen_tokenizer) -> None:
    """Defect i: with CUDA graphs on (enforce_eager = False) ``model_runner.model`` is vLLM's graph
    wrapper; the worker extension loads and reads through ``model_runner.get_model()``."""
    import cosmos_primitives as cp
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    engine = VLLMRolloutEngine(str(tiny_qwen2_dir), qwen_tokenizer, dtype="float32", enforce_eager=False)
    assert cp.sync.InProcessSync(cpt.tiny_qwen2(seed=5), engine, layout="hf_checkpoint").sync(version=1).verified


def test_first_sync_checksums_make_no_full_float64_copy(standin_vllm, tiny_qwen2_dir, qwen_tokenizer) -> None:
    """Defect j: the worker's checksums reduce in chunks: no float64 tensor larger than a chunk is made
    (the embedding here has ~10M elements), and the sums equal one float64 reduction."""
    from torch.overrides import TorchFunctionMode

    from cosmos_primitives.rollout.vllm_engine import CHECKSUM_CHUNK, VLLMRolloutEngine

    class LargestFloat64(TorchFunctionMode):
        largest = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.dtype == torch.float64:
                LargestFloat64.largest = max(LargestFloat64.largest, out.numel())
            return out

    engine = VLLMRolloutEngine(str(tiny_qwen2_dir), qwen_tokenizer, dtype="float32")
    held = dict(engine.llm.worker.model_runner.get_model().named_parameters())
    assert max(p.numel() for p in held.values()) > CHECKSUM_CHUNK
    with LargestFloat64():
        sums = engine.weight_checksums(list(held))
    assert 0 < LargestFloat64.largest <= CHECKSUM_CHUNK
    for name, p in held.items():
        assert sums[name] == pytest.approx(float(p.double().sum()), rel=1e-12, abs=1e-9), name


@pytest.mark.parametrize(("top_k", "top_p"), [(-1, 1.0), (20, 1.0), (-1, 0.8), (30, 0.7)])
def test_standin_reports_processed_logprobs_after_top_k_top_p(top_k: int, top_p: float, standin_vllm,
                                                              tiny_qwen2_dir, qwen_tokenizer) -> None:
    """Issue item 2, stand-in side: with logprobs_mode = "processed_logprobs" vLLM reports the log-prob
    under the distribution it sampled from: temperature, then top-k / top-p masking, renormalised. The
    expected values are recomputed here from a full forward of prompt + completion."""
    from cosmos_primitives.rollout.vllm_engine import VLLMRolloutEngine

    temperature = 0.7
    engine = VLLMRolloutEngine(str(tiny_qwen2_dir), qwen_tokenizer, dtype="float32")
    group = engine.generate([HI], SamplingParams(num_samples_per_prompt=2, temperature=temperature, top_k=top_k,
                                                 top_p=top_p,
                                                 max_response_length=6, seed=4))[0]
    model = engine.llm.hf_model
    for completion in group.completions:
        ids = group.prompt_token_ids + completion.token_ids
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].float() / temperature
        start = len(group.prompt_token_ids) - 1
        for i, token in enumerate(completion.token_ids):
            step = logits[start + i]
            keep = torch.ones_like(step, dtype=torch.bool)
            if top_k > 0:
                keep &= step >= torch.topk(step, top_k).values[-1]
            if top_p < 1.0:  # the nucleus of the distribution top-k left (vLLM masks top-k first)
                probs = torch.softmax(step.masked_fill(~keep, float("-inf")), -1)
                order = torch.argsort(probs, descending=True)
                mass_before = torch.cumsum(probs[order], 0) - probs[order]
                nucleus = torch.zeros_like(keep)
                nucleus[order[mass_before < top_p]] = True
                keep &= nucleus
            assert keep[token], f"token {i} was sampled outside the top-k / top-p set"
            expected = torch.log_softmax(step.masked_fill(~keep, float("-inf")), -1)[token]
            assert completion.logprobs[i] == pytest.approx(float(expected), abs=1e-4)
