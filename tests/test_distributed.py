"Data parallelism: a 2-process CPU (gloo) update equals the single-process update on the same global batch."
import socket
import subprocess
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from conftest import clean_env

SCRIPT = Path(__file__).parent / "ddp_update.py"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(), timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]


def test_two_processes_equal_one(tiny_path, tmp_path):
    one, two = tmp_path / "one.safetensors", tmp_path / "two.safetensors"
    run([sys.executable, str(SCRIPT), str(one), str(tiny_path)])
    run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
         "--master_port", str(free_port()), str(SCRIPT), str(two), str(tiny_path)])
    a, b = load_file(one), load_file(two)
    assert a.keys() == b.keys() and len(a) > 0
    moved = 0
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), (k, (a[k] - b[k]).abs().max())
        moved += int("lora_B" in k and a[k].abs().max() > 0)
    assert moved > 0  # the update did something
    with safe_open(one, "pt") as f1, safe_open(two, "pt") as f2:
        assert (f1.metadata()["num_processes"], f2.metadata()["num_processes"]) == ("1", "2")
        assert f1.metadata()["reward_std"] == f2.metadata()["reward_std"]  # batch statistics were gathered
