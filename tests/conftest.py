"""Shared fixtures: tiny models, the offline Qwen tokenizer, generated media, a real Redis server.

The builders live in ``cosmos_primitives.testing`` so that users can test their own components
the same way; this file only scopes them for pytest.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

import cosmos_primitives as cp
from cosmos_primitives import testing as cpt
from cosmos_primitives.queue.local_redis import live_servers

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("COSMOS_NO_PROGRESS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HAS_CUDA = torch.cuda.is_available()


# The longest modules (minutes each on 2 CPU cores), run first so that a parallel run
# (the Makefile's ``pytest -n auto --dist loadfile --no-loadscope-reorder``) does not end with one
# worker still training while the other idles; then the other modules with a slow test.
LONGEST_MODULES = ("test_grpo_learning.py", "test_qwen3_vl_learning.py", "test_gpu_suite.py")


def _module_rank(item: pytest.Item, slow_modules: set[str]) -> int:
    name = item.path.name
    if name in LONGEST_MODULES:
        return LONGEST_MODULES.index(name)
    return len(LONGEST_MODULES) + (0 if name in slow_modules else 1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is visible on this machine")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
    # a stable sort: modules keep their tests together and in file order
    slow_modules = {item.path.name for item in items if "slow" in item.keywords}
    items.sort(key=lambda item: _module_rank(item, slow_modules))


def _share_cores_among_workers() -> None:
    """Under pytest-xdist, give each worker's torch (and the recipes it launches, through
    ``OMP_NUM_THREADS``) its share of the cores rather than every worker starting one OpenMP thread
    per core: the tiny models are overhead-bound and oversubscribed threads wait on each other."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers <= 1:
        return
    # an OMP_NUM_THREADS the caller set wins
    threads = int(os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 1) // workers))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


_share_cores_among_workers()


_LEFT_IN_WORKERS: list[int] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist's controller: collect the count each worker's session finish reported."""
    _LEFT_IN_WORKERS.append(getattr(node, "workeroutput", {}).get("leftover_redis_servers", 0))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    leftover = live_servers()
    for server in leftover:
        server.close()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its exit status is not the run's, the controller's is
        workeroutput["leftover_redis_servers"] = len(leftover)
    count = len(leftover) + sum(_LEFT_IN_WORKERS)
    if count:
        session.exitstatus = 1
        print(f"\nERROR: {count} redis-server process(es) were left running by tests and were stopped")


@pytest.fixture(scope="session")
def qwen_tokenizer():
    return cpt.qwen_tokenizer()


@pytest.fixture(scope="session")
def tiny_vl_processor():
    return cpt.tiny_qwen2_5_vl_processor()


@pytest.fixture
def tiny_vl_model():
    return cpt.tiny_qwen2_5_vl(seed=0)


@pytest.fixture(scope="session")
def tiny_qwen3_vl_processor():
    return cpt.tiny_qwen3_vl_processor()


TINY_VL_MODELS = {"qwen2_5_vl": cpt.tiny_qwen2_5_vl, "qwen3_vl": cpt.tiny_qwen3_vl}


@pytest.fixture(params=sorted(TINY_VL_MODELS))
def vl_family(request) -> str:
    """Each Qwen-VL family in turn. A module that overrides ``tiny_vl_model`` / ``tiny_vl_processor``
    with :func:`family_vl_model` / :func:`family_vl_processor` runs its VL tests once per family."""
    return request.param


@pytest.fixture
def family_vl_model(vl_family):
    return TINY_VL_MODELS[vl_family](seed=0)


@pytest.fixture
def family_vl_processor(vl_family, tiny_vl_processor, tiny_qwen3_vl_processor):
    return {"qwen2_5_vl": tiny_vl_processor, "qwen3_vl": tiny_qwen3_vl_processor}[vl_family]


@pytest.fixture(scope="session")
def tiny_vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny Qwen2.5-VL + processor, loadable with ``from_pretrained`` (do not modify)."""
    return cpt.save_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny_vl") / "model")


@pytest.fixture
def tiny_qwen2_model():
    return cpt.tiny_qwen2(seed=0)


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cpt.save_tiny_qwen2(tmp_path_factory.mktemp("tiny_qwen2") / "model")


@pytest.fixture
def tiny_wan():
    return cpt.tiny_wan_transformer(seed=0)


@pytest.fixture
def tiny_vae():
    return cpt.tiny_wan_vae(seed=0)


@pytest.fixture(scope="session")
def video_clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """mp4 clips of several lengths, frame rates and resolutions, plus a corrupt and a missing one."""
    root = tmp_path_factory.mktemp("clips")
    return {
        "short": cpt.write_mp4(root / "short.mp4", num_frames=8, fps=8.0, size=(48, 64)),
        "medium": cpt.write_mp4(root / "medium.mp4", num_frames=30, fps=10.0, size=(64, 64)),
        "long_hd": cpt.write_mp4(root / "long_hd.mp4", num_frames=31, fps=30.0, size=(240, 320)),
        "corrupt": cpt.write_corrupt_mp4(root / "corrupt.mp4"),
        "missing": root / "does_not_exist.mp4",
    }


@pytest.fixture(scope="session")
def color_images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("images")
    return {name: cpt.write_image(root / f"{name}.png", cpt.color_image(name)) for name in cpt.COLOURS}


@pytest.fixture(scope="session")
def redis_server():
    """One real redis-server for the session (flushed per test by ``redis_url``)."""
    with cp.queue.RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server) -> str:
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture
def own_redis_server():
    """A redis-server owned by one test (for restart / kill scenarios)."""
    with cp.queue.RedisServer() as server:
        yield server


@pytest.fixture
def standin_vllm(monkeypatch: pytest.MonkeyPatch):
    """The documented-API vLLM stand-in from ``tests/standins``, removed from ``sys.modules`` after."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "standins"))
    sys.modules.pop("vllm", None)
    import vllm

    vllm.reset()
    # the engine sets VLLM_ENABLE_V1_MULTIPROCESSING / launcher variables; monkeypatch puts them back
    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    yield vllm
    sys.modules.pop("vllm", None)


@pytest.fixture(scope="session")
def grpo_assets(tmp_path_factory: pytest.TempPathFactory):
    """``config path -> overrides`` pointing a GRPO recipe config at a tiny random Qwen2.5-VL and 16
    colour-MCQ items (written once per config and session)."""
    from cosmos_primitives.testing.demo_assets import ensure_demo_assets

    made: dict[Path, list[str]] = {}

    def overrides_for(config: Path) -> list[str]:
        if config not in made:
            root = tmp_path_factory.mktemp("grpo_assets")
            paths = [f"policy.model_name_or_path={root / 'model'}",
                     f"train.train_policy.dataset.name={root / 'colour_mcq' / 'train.jsonl'}"]
            demo = [path.replace("=", "=demo:", 1) for path in paths]  # asks for the assets there
            ensure_demo_assets(cp.load_config(config, [*demo, "custom.demo_items=16"]))
            made[config] = [*paths, "custom={}"]
        return made[config]

    return overrides_for
