"""Peak memory (RSS) and time of sampling a clip the qwen-vl-utils way vs decoding the whole clip.

Each measurement runs in a fresh Python process and reports its own peak RSS
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``), so earlier runs do not inflate later ones. This
parent process imports only the standard library and writes the clip in a child too: Linux folds
the parent's RSS at fork time into the child's ``ru_maxrss``, so a big parent would hide the
children's figures.

- ``import``: only the imports (the floor every mode pays);
- ``whole clip (decord)`` / ``whole clip (PyAV)``: every frame decoded at native size and kept
  (what a naive "load the video, then pick frames" pipeline holds at its peak);
- ``qwen-vl-utils (decord)``: what qwen-vl-utils' decord reader then ``fetch_video`` hold: every
  sampled frame at native size, then a float32 copy of them all for the resize;
- ``sample_video (decord)`` / ``sample_video (PyAV)``: :func:`cosmos_primitives.data.sample_video`
  at ``--fps`` with ``--max-pixels``, ``--min-pixels`` and ``--max-frames`` (the same frames and
  pixels, decoded and resized a chunk at a time).

Run: ``.venv/bin/python benchmarks/bench_video_sampling.py`` (writes a test clip once to ``--clip``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
mode, path = sys.argv[1], sys.argv[2]
fps, max_pixels, max_frames, min_pixels = float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
keys = dict(fps=fps, max_pixels=max_pixels, max_frames=max_frames, min_pixels=min_pixels or None)
import decord, av, torch
from cosmos_primitives.data.video_sampling import sample_video
from cosmos_primitives.data.qwen_vl_sizing import plan_video
start = time.perf_counter()
held = 0
if mode == "whole_decord":
    reader = decord.VideoReader(path, num_threads=1)
    frames = reader.get_batch(list(range(len(reader)))).asnumpy()
    held = frames.nbytes
elif mode == "whole_pyav":
    with av.open(path) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    held = sum(f.nbytes for f in frames)
elif mode == "qwen_vl_utils_decord":
    reader = decord.VideoReader(path, num_threads=1)
    h, w = reader[0].shape[:2]
    chosen = plan_video(len(reader), reader.get_avg_fps(), h, w, **keys)
    video = torch.tensor(reader.get_batch(chosen.indices).asnumpy()).permute(0, 3, 1, 2)
    frames = torch.nn.functional.interpolate(video.float(), size=list(chosen.size), mode="bicubic",
                                             align_corners=False, antialias=True).clamp(0, 255).round()
    held = frames.numel() * frames.element_size() + video.numel()
elif mode.startswith("sample_"):
    out = sample_video(path, **keys, backend=mode[len("sample_"):])
    held = out.frames.nbytes
elapsed = time.perf_counter() - start
print(json.dumps({"maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "seconds": elapsed,
                  "held_mb": held / 2**20}))
"""

MODES = [("import", "import"), ("whole_decord", "whole clip (decord)"), ("whole_pyav", "whole clip (PyAV)"),
         ("qwen_vl_utils_decord", "qwen-vl-utils (decord)"), ("sample_decord", "sample_video (decord)"),
         ("sample_pyav", "sample_video (PyAV)")]


def run(mode: str, clip: Path, args: argparse.Namespace) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(clip), str(args.fps), str(args.max_pixels),
                          str(args.max_frames), str(args.min_pixels)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clip", type=Path, default=Path("/tmp/cosmos_bench_clips/clip_540p_300f.mp4"))
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--size", type=int, nargs=2, default=(540, 960), metavar=("H", "W"))
    parser.add_argument("--source-fps", type=float, default=30.0)
    parser.add_argument("--fps", type=float, default=2.0)
    parser.add_argument("--max-pixels", type=int, default=81920)
    parser.add_argument("--max-frames", type=int, default=768)
    parser.add_argument("--min-pixels", type=int, default=0, help="0: qwen-vl-utils' default (128 x 28 x 28)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per mode; the lowest time is reported")
    args = parser.parse_args()

    if not args.clip.is_file():
        print(f"writing {args.clip} ({args.frames} frames, {args.size[0]}x{args.size[1]}, {args.source_fps} fps)")
        writer = ("import sys; from cosmos_primitives.testing import write_mp4; "
                  "write_mp4(sys.argv[1], num_frames=int(sys.argv[2]), fps=float(sys.argv[3]), "
                  "size=(int(sys.argv[4]), int(sys.argv[5])))")
        subprocess.run([sys.executable, "-c", writer, str(args.clip), str(args.frames), str(args.source_fps),
                        *map(str, args.size)], check=True)
    whole_mb = args.frames * args.size[0] * args.size[1] * 3 / 2**20
    print(f"clip: {args.frames} frames of {args.size[0]}x{args.size[1]} ({whole_mb:.0f} MiB as RGB); sampling at "
          f"{args.fps} fps, max_pixels {args.max_pixels}, min_pixels {args.min_pixels or 'default'}, "
          f"max_frames {args.max_frames}")

    results = {}
    for mode, label in MODES:
        runs = [run(mode, args.clip, args) for _ in range(args.repeats)]
        best = min(runs, key=lambda r: r["seconds"])
        best["maxrss_mb"] = max(r["maxrss_mb"] for r in runs)
        results[mode] = best
        print(f"{label:>22}: peak RSS {best['maxrss_mb']:7.1f} MiB, frames held {best['held_mb']:7.1f} MiB, "
              f"{best['seconds']:.3f} s")
    floor = results["import"]["maxrss_mb"]
    print(f"peak RSS above the import floor ({floor:.0f} MiB):")
    for mode, label in MODES[1:]:
        print(f"  {label:>22}: {results[mode]['maxrss_mb'] - floor:7.1f} MiB")
    for backend in ("decord", "pyav"):
        whole, sampled = results[f"whole_{backend}"], results[f"sample_{backend}"]
        extra_whole = whole["maxrss_mb"] - floor
        extra_sampled = max(sampled["maxrss_mb"] - floor, 0.1)
        print(f"{backend}: memory above floor, whole / sampled = {extra_whole / extra_sampled:.1f}x; "
              f"time whole / sampled = {whole['seconds'] / sampled['seconds']:.1f}x; sampled frames "
              f"{sampled['held_mb']:.2f} MiB vs {extra_sampled:.1f} MiB above floor")
    qwen = results["qwen_vl_utils_decord"]["maxrss_mb"] - floor
    print(f"decord: memory above floor, qwen-vl-utils' way / sample_video = "
          f"{qwen / max(results['sample_decord']['maxrss_mb'] - floor, 0.1):.1f}x")


if __name__ == "__main__":
    main()
