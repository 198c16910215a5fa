"""Two processes in `fit()`; SIGTERM reaches only the last process, while it samples its second step. Each process
writes what it saw (exit code, step) to argv[2].RANK.json. Used by test_distributed.py."""
import json
import os
import signal
import sys

import torch
from accelerate import Accelerator

from glm_grpo_nb.policy import GlmImagePolicy
from glm_grpo_nb.rewards import RednessReward
from glm_grpo_nb.trainer import GRPOTrainer, TrainingStopped

PROMPTS = ["a red square on a blue background", "a green field", "a gradient from yellow to navy", "a cyan field"]


class SignalOnSecondCall(RednessReward):
    name = "redness"
    def __init__(self, on: bool): self.on, self.calls = on, 0
    def score(self, images, prompts, targets=None, sources=None):
        self.calls += 1
        if self.on and self.calls == 2: os.kill(os.getpid(), signal.SIGTERM)
        return super().score(images, prompts)


if __name__ == "__main__":
    model, report, run_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    acc = Accelerator(cpu=True)
    torch.set_num_threads(1)
    policy = GlmImagePolicy.from_pretrained(model, ar_lora=4, dit_lora=4, device="cpu", verbose=False)
    last = acc.process_index == acc.num_processes - 1
    trainer = GRPOTrainer(policy, SignalOnSecondCall(last), PROMPTS, group_size=2, prompts_per_step=1, height=64,
                          width=64, num_inference_steps=4, sde_window=(0, 2), lr=1e-4, accelerator=acc, output_dir=run_dir)
    try:
        trainer.fit(5, progress=False)
        code = 0
    except TrainingStopped as e:
        code = e.code
    with open(f"{report}.{acc.process_index}.json", "w") as f: json.dump({"code": code, "step": trainer.step_count}, f)
    if torch.distributed.is_initialized(): torch.distributed.destroy_process_group()   # gloo's threads end before the interpreter does
