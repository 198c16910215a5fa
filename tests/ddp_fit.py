"""`fit()` for two steps on a global batch of four prompts, under however many processes this is launched with
(torchrun or plain python), writing checkpoints and metrics to argv[3]. Writes the final LoRA tensors to argv[1].
Used by test_distributed.py."""
import sys

import torch
from accelerate import Accelerator
from safetensors.torch import save_file

from glm_grpo_nb.policy import GlmImagePolicy
from glm_grpo_nb.rewards import RednessReward
from glm_grpo_nb.trainer import GRPOTrainer

PROMPTS = ["a red square on a blue background", "a green field", "a gradient from yellow to navy", "a 'HI' sign",
           "a cyan field", "green on the left, black on the right"]

if __name__ == "__main__":
    out, model, run_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    acc = Accelerator(cpu=True)
    torch.set_num_threads(1)
    policy = GlmImagePolicy.from_pretrained(model, ar_lora=4, dit_lora=4, device="cpu", verbose=False)
    trainer = GRPOTrainer(policy, RednessReward(), PROMPTS, group_size=2, prompts_per_step=4 // acc.num_processes,
                          height=64, width=64, num_inference_steps=4, sde_window=(0, 2), lr=1e-4, kl_coef=0.05, save_every=1,
                          accelerator=acc, output_dir=run_dir)
    trainer.fit(2, progress=False)
    if acc.is_main_process:
        save_file({n: p.detach().contiguous() for n, p in policy.named_parameters() if p.requires_grad}, out,
                  metadata={"num_processes": str(acc.num_processes),
                            "rewards": " ".join(f"{h['reward_mean']:.7f}" for h in trainer.history)})
    acc.wait_for_everyone()
    if torch.distributed.is_initialized(): torch.distributed.destroy_process_group()   # gloo's threads end before the interpreter does
