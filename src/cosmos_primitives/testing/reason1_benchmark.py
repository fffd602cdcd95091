"""A generated benchmark in the Cosmos-Reason1 guide's ``--data_dir`` layout (tiny mp4 clips), to test
evaluation the way the guide runs it (``cosmos_primitives.eval.benchmark_dir``)."""

from __future__ import annotations

import json
from pathlib import Path

from cosmos_primitives.testing.media import write_mp4


def write_reason1_benchmark(data_dir: str | Path, dataset: str, clips: int = 2) -> Path:
    """Write ``<data_dir>/benchmark/<dataset>/clips/clip<i>.mp4`` and
    ``<data_dir>/benchmark/<dataset>/<dataset>_benchmark_qa_pairs.json``; returns the JSON's path.

    Rows are as downloaded: ``{"video": "clips/clip<i>.mp4", "qa_pairs": ...}``; clip 0 carries one
    QA pair as a dict, the others a list of two (``index2ans`` choices, ``answer`` letters), so the
    file holds ``1 + 2 * (clips - 1)`` items.
    """
    folder = Path(data_dir) / "benchmark" / dataset
    rows = []
    for i in range(clips):
        write_mp4(folder / "clips" / f"clip{i}.mp4", num_frames=8, fps=8.0, size=(56, 56))
        pairs = [{"question": f"What happens in clip {i} ({k})?", "index2ans": {"A": "it moves", "B": "nothing"},
                  "answer": "AB"[(i + k) % 2]} for k in range(1 if i == 0 else 2)]
        rows.append({"video": f"clips/clip{i}.mp4", "qa_pairs": pairs[0] if i == 0 else pairs})
    path = folder / f"{dataset}_benchmark_qa_pairs.json"
    path.write_text(json.dumps(rows, indent=1))
    return path
