"""`trainer.evaluate()` under however many processes this is launched with: each process scores its share of the
prompts (5 prompts: uneven shares), in chunks of `argv[3]` samples; writes the result as JSON to argv[1]."""
import json
import sys

import torch
from accelerate import Accelerator

from glm_grpo_nb.policy import GlmImagePolicy
from glm_grpo_nb.rewards import RednessReward, combine
from glm_grpo_nb.trainer import GRPOTrainer

PROMPTS = ["a red square", "a green field", "a gradient from yellow to navy", "a 'HI' sign", "a blue circle"]

if __name__ == "__main__":
    out, model, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
    acc = Accelerator(cpu=True)
    torch.set_num_threads(1)
    policy = GlmImagePolicy.from_pretrained(model, ar_lora=4, dit_lora=4, device="cpu", verbose=False)
    trainer = GRPOTrainer(policy, RednessReward(), PROMPTS, group_size=2, height=64, width=64, num_inference_steps=4,
                          accelerator=acc, eval_prompts=PROMPTS, eval_reward=combine({"redness": 0.5}),
                          ar_sample_batch=batch, dit_sample_batch=batch)
    res = trainer.evaluate()
    if acc.is_main_process: open(out, "w").write(json.dumps(res))
    acc.wait_for_everyone()
    if torch.distributed.is_initialized(): torch.distributed.destroy_process_group()
