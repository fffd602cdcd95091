"""examples/wfm_rl.py on ``[wfm.data] kind = "webdataset"``: tar shards on S3 (moto's server mode, a real
HTTP server on loopback, reached through the seed's ``PROD_S3_CHECKPOINT_*`` variables), streamed
into the tiny FlowGRPO recipe; killed after a checkpoint and resumed, the run goes on at the saved
shard and sample with the bad samples already counted, ending bitwise where an uninterrupted run ends.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

import cosmos_primitives as cp
from cosmos_primitives.checkpoint import PAUSE_ENV
from cosmos_primitives.config import ConfigError
from cosmos_primitives.testing.recipe_runs import finish, kill_when, launch_recipe, only_run_dir
from test_wfm_webdataset import s3_endpoint, write_shard  # noqa: F401  (s3_endpoint: the moto fixture)

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "configs" / "wfm_flowgrpo_tiny.toml"
STEPS = 5  # 2 prompts a step, 8 good clips an epoch: step 5 reads into the second epoch
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # floats are compared bitwise
SMALL = [
    "logging.logger=[]", f"train.max_steps={STEPS}", "wfm.num_samples_per_prompt=2", "wfm.num_inference_steps=4",
    "wfm.eval_num_inference_steps=2", "wfm.sampler.sde_window_size=2", "wfm.sampler.sde_window_range=[0, 4]",
    "wfm.data.kind=webdataset", 'wfm.data.shards=["s3://clips/train/shard-{0000..0002}.tar"]',
    "wfm.data.text_dim=8", "wfm.data.max_tokens=4", "wfm.data.num_frames=1",
    "train.train_policy.dataset.bad_sample_budget=3", "train.ckpt.enable_checkpoint=true",
    "train.ckpt.max_keep=-1", "train.ckpt.export_safetensors=false", "train.ckpt.save_mode=async",
]


@pytest.fixture(scope="module")
def s3_env(s3_endpoint, tmp_path_factory) -> dict[str, str]:  # noqa: F811
    """Three shards of three clips under s3://clips/train/ (clip07 undecodable); the variables a run needs.

    With seed 0 every epoch reads shard 2 first (clip06, clip07, clip08), then shards 0 and 1."""
    import boto3

    env = {"PROD_S3_CHECKPOINT_ENDPOINT_URL": s3_endpoint, "PROD_S3_CHECKPOINT_ACCESS_KEY_ID": "testing",
           "PROD_S3_CHECKPOINT_SECRET_ACCESS_KEY": "testing", "PROD_S3_CHECKPOINT_REGION_NAME": "us-east-1",
           "AWS_ENDPOINT_URL": "", "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_DEFAULT_REGION": "",
           **ONE_THREAD}
    client = boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    client.create_bucket(Bucket="clips")
    tmp = tmp_path_factory.mktemp("shards")
    for s in range(3):
        keys = [f"clip{3 * s + i:02d}" for i in range(3)]
        shard = write_shard(tmp / f"shard{s}.tar", keys, tmp, corrupt={"clip07"})
        client.upload_file(str(shard), "clips", f"train/shard-{s:04d}.tar")
    return env


def launch(output_dir: Path, extra: list[str], log: Path, env: dict[str, str]):
    return launch_recipe("examples/wfm_rl.py", CONFIG, [*SMALL, f"train.output_dir={output_dir}", *extra], log,
                         cwd=REPO, env=env)


def records(run_dir: Path) -> dict[tuple[int, str], dict]:
    """``(step, "train" | "eval") -> values`` (without the time); a later record of a key replaces an earlier one."""
    out = {}
    for record in cp.logging.read_metrics(run_dir):
        values = {k: v for k, v in record.items() if k not in ("step", "time")}
        out[record["step"], "eval" if "eval/reward_mean" in values else "train"] = values
    return out


@pytest.mark.slow
def test_recipe_streams_s3_shards_and_resumes_at_the_saved_sample(s3_env, tmp_path: Path) -> None:
    log = tmp_path / "uninterrupted.log"
    finish(launch(tmp_path / "uninterrupted", ["train.ckpt.save_freq=0"], log, s3_env), log)
    expected = records(only_run_dir(tmp_path / "uninterrupted"))
    assert list(expected) == [(0, "eval"), *((s, "train") for s in range(1, STEPS + 1)), (STEPS, "eval")]
    # clip07 is met at step 1 and again at step 5, in the second epoch
    assert [expected[s, "train"]["bad_samples"] for s in range(1, STEPS + 1)] == [1, 1, 1, 1, 2]
    assert len({expected[s, "train"]["reward_mean"] for s in range(1, STEPS + 1)}) > 1  # the prompts differ

    extra = ["train.ckpt.save_freq=2"]
    log = tmp_path / "run.log"
    # the last step's save never completes, so the run is still alive whenever the kill comes
    proc = launch(tmp_path / "runs", extra, log, {**s3_env, PAUSE_ENV: str(STEPS)})
    kill_when(proc, lambda: any((tmp_path / "runs").glob("*/checkpoints/step_2/COMPLETE")), log,
              "checkpoint step_2 was complete")
    run_dir = only_run_dir(tmp_path / "runs")
    resume_log = tmp_path / "resume.log"
    text = finish(launch(tmp_path / "runs", [*extra, "train.resume=true"], resume_log, s3_env), resume_log)
    match = re.search(r"Resumed from \S+ \(step (\d+),", text)
    assert match and 2 <= int(match.group(1)) < STEPS, text[-3000:]
    # the resumed steps (rewards: of the prompts read; bad_samples: the count carried over) equal the
    # uninterrupted run's bitwise, and so does the final evaluation
    assert records(run_dir) == expected


def test_a_webdataset_without_shards_or_max_steps_is_refused_with_the_keys() -> None:
    cfg = cp.load_config(CONFIG, overrides=["wfm.data.kind=webdataset"])
    cfg = msgspec.structs.replace(cfg, train=msgspec.structs.replace(cfg.train, max_steps=None))  # run by epochs
    with pytest.raises(ConfigError) as info:
        cp.config.check_runnable(cfg, "recipe.toml")
    assert "wfm.data.shards" in str(info.value) and "train.max_steps" in str(info.value)
