"""Benchmark: per-phase time of one GRPO step on the tiny GLM-Image (joint and decoupled).
Run from the repository root: python -m bench.trainer"""
import tempfile
from pathlib import Path

import torch

from glm_grpo_nb.rewards import RednessReward
from glm_grpo_nb.tiny import make_tiny_glm_image
from glm_grpo_nb.trainer import GRPOTrainer
from glm_grpo_nb.policy import GlmImagePolicy

PHASES = ["sample_ar", "sample_dit", "decode", "reward", "prepare", "update_ar", "update_dit", "optimizer"]

if __name__ == "__main__":
    torch.set_num_threads(2)
    path = make_tiny_glm_image(Path(tempfile.mkdtemp()) / "tiny")
    prompts = ["a red square on a blue background", "a green field", "a gradient from yellow to navy", "a 'HI' sign"]
    for mode in ("joint", "decoupled"):
        policy = GlmImagePolicy.from_pretrained(path, ar_lora=8, dit_lora=8, verbose=False)
        t = GRPOTrainer(policy, RednessReward(), prompts, group_size=8, prompts_per_step=2, height=64, width=64,
                        num_inference_steps=10, mode=mode, micro_batch_size=8)
        t.fit(1, progress=False)  # warm up
        hist = t.fit(5, progress=False)
        sec = {p: sum(h[f"seconds/{p}"] for h in hist) / len(hist) for p in PHASES}
        total = sum(sec.values())
        print(f"{mode} (2 prompts x G=8, 64x64, 10 denoising steps, window 2): {total:.2f} s per step; " +
              ", ".join(f"{p} {v:.3f} s ({v / total:.0%})" for p, v in sec.items()))
