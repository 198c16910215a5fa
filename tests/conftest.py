import os
import shutil
import sys
from pathlib import Path

import pytest

# One thread per test process (and its subprocesses, which inherit it), set before torch loads: the tiny model's
# operations are too small to share between threads (a step takes 1.0 s on one thread, 1.2 s on two), and two
# processes of two threads on two cores take 4.7 s a step each. With `pytest -n auto` each core runs its own tests.
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    "`pytest -n auto` shares tests out a module at a time (xdist's loadscope): a module-scoped fixture that takes minutes "
    "(the released width's script) runs once, on one worker, instead of once on each worker that got one of its tests."
    if getattr(config.option, "dist", "no") == "load": config.option.dist = "loadscope"


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory):
    from glm_grpo_nb.tiny import make_tiny_glm_image
    return make_tiny_glm_image(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def glm_grpo():
    "The installed console script, next to the running interpreter."
    exe = Path(sys.executable).parent / "glm-grpo"
    found = str(exe) if exe.exists() else shutil.which("glm-grpo")
    assert found, "glm-grpo is not installed; run pip install -e '.[dev]'"
    return found


def clean_env():
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env
