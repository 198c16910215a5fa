"Data parallelism: 2-process CPU (gloo) updates and fits equal the single-process ones on the same global batch."
import pytest
import socket
import subprocess
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from conftest import clean_env

from glm_grpo_nb.config import DIT_OBJECTIVES

SCRIPT = Path(__file__).parent / "ddp_update.py"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(), timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]


@pytest.mark.parametrize("objective", DIT_OBJECTIVES + ("flow_grpo+gardo",))
def test_two_processes_equal_one(tiny_path, tmp_path, objective):
    one, two = tmp_path / "one.safetensors", tmp_path / "two.safetensors"
    run([sys.executable, str(SCRIPT), str(one), str(tiny_path), objective])
    run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
         "--master_port", str(free_port()), str(SCRIPT), str(two), str(tiny_path), objective])
    a, b = load_file(one), load_file(two)
    assert a.keys() == b.keys() and len(a) > 0
    grads = [k for k in a if k.startswith("grad/")]
    assert any("vision_language_encoder" in k for k in grads) and any("transformer" in k for k in grads)
    for k in grads:   # the all-reduced gradients: the same sums in another order, equal to float32's rounding
        scale = a[k].abs().max().item()   # 0 for lora_A at the first step (B starts at zero): then exactly 0 on both
        assert (a[k] - b[k]).abs().max() <= 1e-4 * scale, (k, (a[k] - b[k]).abs().max(), scale)   # seen: 2.3e-6
    assert sum(int(a[k].abs().max() > 0) for k in grads) >= len(grads) // 2   # lora_B's gradients are not zero
    moved = 0
    for k in a:   # weights after the steps (a smooth function of the gradients), and the objective's own adapters
        assert torch.allclose(a[k], b[k], atol=1e-6), (k, (a[k] - b[k]).abs().max())
        moved += int("lora_B" in k and not k.startswith("grad/") and a[k].abs().max() > 0)
    assert moved > 0  # the update did something
    own = {"nft": "old_dit/", "awm": "ema_dit/", "dgpo": "ema_dit/"}.get(objective)   # the objective's adapter agrees too
    assert {k.split("/")[0] + "/" for k in a if "/" in k} == {"grad/"} | ({own} if own else set())
    with safe_open(one, "pt") as f1, safe_open(two, "pt") as f2:
        assert (f1.metadata()["num_processes"], f2.metadata()["num_processes"]) == ("1", "2")
        assert f1.metadata()["reward_std"] == f2.metadata()["reward_std"]  # batch statistics were gathered
        assert f1.metadata()["gate_share"] == f2.metadata()["gate_share"]  # GARDO's gate: over the whole batch
        assert (f1.metadata()["gate_share"] != "None") == objective.endswith("gardo")


FIT = Path(__file__).parent / "ddp_fit.py"


def test_two_process_fit_equals_one(tiny_path, tmp_path):
    "fit(): each process samples its share of the global batch (seeded by global sample index); same adapters."
    import json
    one, two = tmp_path / "one.safetensors", tmp_path / "two.safetensors"
    run([sys.executable, str(FIT), str(one), str(tiny_path), str(tmp_path / "run1")])
    run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
         "--master_port", str(free_port()), str(FIT), str(two), str(tiny_path), str(tmp_path / "run2")])
    a, b = load_file(one), load_file(two)
    assert a.keys() == b.keys() and len(a) > 0
    for k in a: assert torch.allclose(a[k], b[k], atol=1e-6), (k, (a[k] - b[k]).abs().max())
    assert max(a[k].abs().max() for k in a if "lora_B" in k) > 1e-5   # two steps moved the adapters
    with safe_open(one, "pt") as f1, safe_open(two, "pt") as f2:
        r1 = [float(x) for x in f1.metadata()["rewards"].split()]
        r2 = [float(x) for x in f2.metadata()["rewards"].split()]
    assert len(r1) == 2 and all(abs(x - y) < 1e-5 for x, y in zip(r1, r2)), (r1, r2)   # the same samples
    for d in ("run1", "run2"):   # checkpoints and metrics written once, by the main process
        rows = [json.loads(l) for l in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [0, 1]
        assert sorted(p.name for p in (tmp_path / d / "checkpoints").iterdir()) == ["step-000001", "step-000002"]
        assert not (tmp_path / d / "run.lock").exists()   # released when the run ended


def test_signal_to_one_process_stops_all_after_the_same_step(tiny_path, tmp_path):
    "SIGTERM reaching one of two processes: both finish the step, agree, stop after it; one checkpoint, written once."
    import json
    script = Path(__file__).parent / "ddp_signal.py"
    run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
         "--master_port", str(free_port()), str(script), str(tiny_path), str(tmp_path / "seen"), str(tmp_path / "run")])
    seen = [json.loads((tmp_path / f"seen.{r}.json").read_text()) for r in (0, 1)]
    assert seen == [{"code": 143, "step": 2}] * 2, seen
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step-000002"]
    assert [json.loads(l)["step"] for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    assert not (tmp_path / "run" / "run.lock").exists()


def test_accelerate_launch_of_the_cli_equals_one_process(glm_grpo, tiny_path, tmp_path):
    "`accelerate launch` with the shipped multi-GPU config, 2 processes (on the CPU, over gloo), equals one process."
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "p.txt").write_text("a red square\na blue field\na green circle\na yellow sun\n")
    common = ["train", "--model", str(tiny_path), "--prompts", str(tmp_path / "p.txt"), "--reward", "redness", "--steps", "2",
              "--group-size", "2", "--num-inference-steps", "4", "--ar-lora", "4", "--dit-lora", "4", "--lr", "3e-3",
              "--adam-epsilon", "1e-4",   # a smooth step: see ddp_update.py
              "--updates-per-batch", "1"]   # one prompt per process has one group to share out (ddp_update runs 2)
    run([glm_grpo, *common, "--prompts-per-step", "2", "--out", str(tmp_path / "one")])
    accelerate = str(Path(sys.executable).parent / "accelerate")
    run([accelerate, "launch", "--config_file", str(root / "examples" / "accelerate" / "multi_gpu.yaml"), "--num_processes", "2",
         "--main_process_port", str(free_port()), glm_grpo, *common, "--prompts-per-step", "1", "--out", str(tmp_path / "two")])
    import json
    assert json.loads((tmp_path / "two" / "run_config.json").read_text())["num_processes"] == 2
    for half, f in (("ar", "adapter_model.safetensors"), ("dit", "pytorch_lora_weights.safetensors")):
        a, b = (load_file(tmp_path / d / "adapters" / half / f) for d in ("one", "two"))
        assert a.keys() == b.keys() and len(a) > 0
        for k in a: assert torch.allclose(a[k], b[k], atol=1e-6), (k, (a[k] - b[k]).abs().max())
    rows = lambda d: [json.loads(l) for l in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
    assert [round(r["reward_mean"], 5) for r in rows("one")] == [round(r["reward_mean"], 5) for r in rows("two")]
    assert (tmp_path / "two" / "adapters" / "README.md").is_file()   # written once, by the main process


def test_evaluate_shares_prompts_and_equals_one_process(tiny_path, tmp_path):
    "evaluate(): 2 processes, each its share of 5 prompts, in chunks of 2, give one process's numbers in one batch."
    import json
    script = Path(__file__).parent / "ddp_eval.py"
    run([sys.executable, str(script), str(tmp_path / "one.json"), str(tiny_path), "8"])
    run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
         "--master_port", str(free_port()), str(script), str(tmp_path / "two.json"), str(tiny_path), "2"])
    one, two = (json.loads((tmp_path / f).read_text()) for f in ("one.json", "two.json"))
    assert set(one) == set(two) >= {"eval/reward", "eval/redness", "eval/heldout"}, (one, two)
    for k in one: assert abs(one[k] - two[k]) < 1e-6, (k, one[k], two[k])
    assert one["eval/heldout"] != 0 and abs(one["eval/heldout"] - 0.5 * one["eval/reward"]) < 1e-6   # the held-out reward, scored
