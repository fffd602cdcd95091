"""The CPU test builders of cosmos_primitives.testing work as advertised."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives import testing as cpt
from cosmos_primitives.queue.local_redis import live_servers


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); read its state
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_redis_server_starts_real_server_and_tears_down() -> None:
    import redis

    server = cp.queue.RedisServer().start()
    pid = server.pid
    assert pid is not None and _alive(pid)
    client = redis.Redis.from_url(server.url)
    assert client.ping() is True
    client.set("k", "v")
    assert client.get("k") == b"v"
    assert "redis_version" in client.info("server")
    client.close()
    server.close()
    assert not _alive(pid)
    assert server not in live_servers()


def test_redis_restart_keeps_port(own_redis_server) -> None:
    import redis

    port, old_pid = own_redis_server.port, own_redis_server.pid
    own_redis_server.restart()
    assert own_redis_server.port == port and own_redis_server.pid != old_pid
    assert redis.Redis.from_url(own_redis_server.url).ping()


def test_session_redis_fixture_is_flushed(redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    assert client.dbsize() == 0
    client.set("leftover", 1)


def test_tiny_vl_model_runs_image_and_video(tiny_vl_model, tiny_vl_processor) -> None:
    conv = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which colour?"}]}]
    text = tiny_vl_processor.apply_chat_template(conv, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n") and "<|vision_start|><|image_pad|><|vision_end|>" in text
    batch = tiny_vl_processor(text=[text], images=[cpt.color_image("red")], return_tensors="pt")
    n_image_tokens = int((batch["input_ids"] == cpt.tokenizer.IMAGE_PAD_ID).sum())
    assert n_image_tokens == int(batch["image_grid_thw"].prod()) // 4
    logits = tiny_vl_model(**batch).logits
    assert logits.shape == (1, batch["input_ids"].shape[1], 151936)
    video = np.stack([cpt.frame_index_pattern(i, (56, 56)) for i in range(4)])
    vconv = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]}]
    vtext = tiny_vl_processor.apply_chat_template(vconv, add_generation_prompt=True)
    vbatch = tiny_vl_processor(text=[vtext], videos=[video], return_tensors="pt")
    assert torch.isfinite(tiny_vl_model(**vbatch).logits).all()


def test_tokenizer_has_vision_specials(qwen_tokenizer) -> None:
    ids = qwen_tokenizer.convert_tokens_to_ids(["<|vision_start|>", "<|image_pad|>", "<|video_pad|>", "<|im_end|>"])
    assert ids == [151652, 151655, 151656, 151645]
    assert len(qwen_tokenizer) >= 151665


def test_saved_tiny_vl_loads_with_from_pretrained(tiny_vl_dir) -> None:
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(tiny_vl_dir)
    reference = cpt.tiny_qwen2_5_vl(seed=0)
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(a, b), name
    processor = AutoProcessor.from_pretrained(tiny_vl_dir)
    assert processor.tokenizer.convert_tokens_to_ids("<|image_pad|>") == 151655


def test_tiny_qwen2_and_wan_models(tiny_qwen2_model, tiny_wan, tiny_vae) -> None:
    ids = torch.randint(0, 1000, (2, 7))
    assert tiny_qwen2_model(input_ids=ids).logits.shape == (2, 7, 151936)
    video = torch.rand(1, 3, 5, 32, 32) * 2 - 1
    latents = tiny_vae.encode(video).latent_dist.mode()
    assert latents.shape == (1, 4, 5, 16, 16)
    assert tiny_vae.decode(latents).sample.shape == video.shape
    v = tiny_wan(hidden_states=latents, timestep=torch.tensor([500.0]),
                 encoder_hidden_states=torch.randn(1, 8, 32), return_dict=False)[0]
    assert v.shape == latents.shape
    sched = cpt.tiny_flow_scheduler()
    sched.set_timesteps(10)
    assert float(sched.sigmas[0]) == pytest.approx(1.0) and float(sched.sigmas[-1]) == 0.0


def test_mp4_clips_decode_to_their_frame_indices(video_clips) -> None:
    import av

    with av.open(str(video_clips["medium"])) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == 30
    assert [cpt.decode_frame_index(f) for f in frames] == list(range(30))
    with av.open(str(video_clips["long_hd"])) as container:
        stream = container.streams.video[0]
        assert (stream.height, stream.width) == (240, 320)
        assert float(stream.average_rate) == pytest.approx(30.0)
    assert not video_clips["missing"].exists()
    with pytest.raises(av.error.InvalidDataError), av.open(str(video_clips["corrupt"])):
        pass


def test_color_images(color_images) -> None:
    from PIL import Image

    red = np.asarray(Image.open(color_images["red"]))
    assert red.shape == (56, 56, 3) and tuple(red[0, 0]) == cpt.COLOURS["red"]


def test_run_distributed_timeout_kills_children() -> None:
    import multiprocessing

    with pytest.raises(RuntimeError, match="timed out"):
        cpt.run_distributed(_sleep_forever, 2, timeout_s=8)
    assert multiprocessing.active_children() == []


def _sleep_forever() -> None:
    signal.pause()


def test_initializer_range_sets_the_std_of_every_module() -> None:
    default = cpt.tiny_qwen2_5_vl(seed=0, hidden_size=128)
    scaled = cpt.tiny_qwen2_5_vl(seed=0, hidden_size=128, initializer_range=128**-0.5)
    for model, std in ((default, 0.02), (scaled, 128**-0.5)):
        for weight in (model.model.language_model.layers[0].mlp.up_proj.weight,
                       model.model.language_model.embed_tokens.weight,
                       model.model.visual.blocks[0].attn.qkv.weight):
            assert abs(float(weight.detach().std()) - std) < 0.1 * std


def test_colour_mcq_sft_rows_follow_an_imperfect_teacher() -> None:
    rows = cpt.colour_mcq_rows(400, seed=0)
    exact = cpt.colour_mcq_sft_rows(rows)
    noisy = cpt.colour_mcq_sft_rows(rows, {"blue": "green"}, mistake_rate=0.5, seed=3)
    assert noisy == cpt.colour_mcq_sft_rows(rows, {"blue": "green"}, mistake_rate=0.5, seed=3)  # reproducible
    changed = 0
    for row, good, taught in zip(rows, exact, noisy):
        answer = taught["conversations"][1]["content"]
        assert taught["conversations"][0] == good["conversations"][0]  # same image and prompt
        if answer == good["conversations"][1]["content"]:
            assert answer == f"<think>The image is {row['colour']}.</think>\n\n<answer>{row['answer']}</answer>"
        else:
            changed += 1
            assert row["colour"] == "blue"
            assert answer == "<think>The image is green.</think>\n\n<answer>B</answer>"  # green is choice B
    blue = sum(r["colour"] == "blue" for r in rows)
    assert 0.35 * blue < changed < 0.65 * blue
    with pytest.raises(ValueError, match="'purple'"):
        cpt.colour_mcq_sft_rows(rows, {"blue": "purple"}, mistake_rate=0.5)
    with pytest.raises(ValueError, match="mistake_rate"):
        cpt.colour_mcq_sft_rows(rows, {"blue": "green"}, mistake_rate=1.5)


def test_each_qwen_tokenizer_is_its_own_copy() -> None:
    """``qwen_tokenizer()`` copies the loaded tokenizer (sharing only its construction-time vocabulary
    and merges): adding a token or changing padding on one copy leaves the next copy as loaded."""
    first = cpt.qwen_tokenizer()
    first.add_tokens(["<only_in_the_first_copy>"])
    first.padding_side = "left"
    second = cpt.qwen_tokenizer()
    assert len(first) == len(second) + 1 and second.padding_side == "right"
    assert second("hi <only_in_the_first_copy>")["input_ids"] != first("hi <only_in_the_first_copy>")["input_ids"]
    assert second("hello world")["input_ids"] == [14990, 1879]


def test_kill_tree_reaches_workers_in_sessions_of_their_own(tmp_path) -> None:
    """A launcher that starts its worker in a new session, as torchrun's does: ``kill_tree`` stops
    both, where a signal to the launcher's process group would leave the worker running."""
    import subprocess
    import sys
    import time

    from cosmos_primitives.testing.recipe_runs import descendants, kill_tree

    worker_pid = tmp_path / "worker.pid"
    launcher = ("import subprocess, sys, time\n"
                "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
                f"open({str(worker_pid)!r}, 'w').write(str(w.pid))\n"
                "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", launcher], start_new_session=True)
    deadline = time.monotonic() + 30
    while not (worker_pid.exists() and worker_pid.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None, "the launcher never started its worker"
        time.sleep(0.02)
    worker = int(worker_pid.read_text())
    assert descendants(proc.pid) == [worker]
    assert os.getpgid(worker) != proc.pid  # out of the launcher's group
    kill_tree(proc)
    assert proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while _alive(worker):  # reparented to init (or a subreaper), which reaps it
        assert time.monotonic() < deadline, "the worker outlived kill_tree"
        time.sleep(0.02)
