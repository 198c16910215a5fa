import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
