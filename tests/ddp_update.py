"""One GRPO update on a fixed global batch, under however many processes this is launched with (torchrun or plain
python). Writes the gradients of the first optimiser step after the all-reduce (`grad/...`), the resulting LoRA
tensors and the objective's own adapters (DiffusionNFT's old one, AWM's and DGPO's EMA) to argv[1]; argv[3] is the
DiT's objective. Used by test_distributed.py.

Adam's epsilon is 1e-4 here, not 1e-8: a step then moves each weight by a smooth function of its gradient (at most
lr / eps times the gradient's own change), where with 1e-8 a gradient element near 1e-8, whose value rounding in a
different summation order changes by a large fraction, moves its weight by anything up to lr. The objectives keep
their own settings; only their number of noise levels is small, for time."""
import sys

import numpy as np
import torch
from accelerate import Accelerator
from safetensors.torch import save_file

from glm_grpo_nb.rewards import RednessReward
from glm_grpo_nb.trainer import GRPOTrainer
from glm_grpo_nb.policy import GlmImagePolicy

PROMPTS = ["a red square on a blue background", "a green field", "a gradient from yellow to navy", "a 'HI' sign"]
# each objective's own settings: its noise levels, its extra state, two inner epochs where an epoch's start matters
OWN = {"nft": dict(nft_timesteps=2, nft_decay_rate=0.3), "grpo_guard": dict(num_inner_epochs=2),
       "flow_dppo": dict(num_inner_epochs=2, dppo_threshold=1e-7),   # the second epoch drops steps past tau
       "awm": dict(awm_timesteps=2, awm_ema_coef=0.1, ema_decay_rate=0.3, num_inner_epochs=2),
       "dgpo": dict(dgpo_timesteps=2, ema_decay_rate=0.3, num_inner_epochs=2),
       # DPO of both halves: a micro-batch holds whole groups, so each pair is in one
       "dpo": dict(dpo_timesteps=2, ar_objective="dpo", micro_batch_size=2, num_inner_epochs=2),
       # GARDO: the gate over the whole batch, the KL on the gated rows of each optimiser step wherever they are, the
       # novelty-weighted advantages (its own advantages: no batch std)
       "flow_grpo+gardo": dict(guard="gardo", gate_fraction=0.2, advantage_scale="none", updates_per_batch=2,
                               gate_rewards={"blue": lambda images, prompts, targets=None, sources=None: torch.tensor(
                                   [float(np.asarray(im.convert("RGB"))[..., 2].mean()) for im in images])})}

if __name__ == "__main__":
    out, model, objective = sys.argv[1], sys.argv[2], sys.argv[3]
    acc = Accelerator(cpu=True)
    torch.set_num_threads(1)
    policy = GlmImagePolicy.from_pretrained(model, ar_lora=4, dit_lora=4, device="cpu", verbose=False)
    n_local = len(PROMPTS) // acc.num_processes
    trainer = GRPOTrainer(policy, RednessReward(), PROMPTS, group_size=2, prompts_per_step=n_local, height=64, width=64,
                          num_inference_steps=4, sde_window=(0, 2), lr=1e-3, kl_coef=0.05, accelerator=acc,
                          dit_objective=objective.split("+")[0], adam_epsilon=1e-4,
                          **{"micro_batch_size": 3, "advantage_scale": "batch", **OWN.get(objective, {})})
    trainable = [(n, p) for n, p in policy.named_parameters() if p.requires_grad]
    grads, step = {}, trainer.optimizer.step
    def first_step(*a, **k):   # the gradients the first optimiser step sees: all-reduced (and clipped)
        if not grads: grads.update({f"grad/{n}": p.grad.detach().clone() for n, p in trainable if p.grad is not None})
        return step(*a, **k)
    trainer.optimizer.step = first_step
    full = trainer.sample(PROMPTS, seed=1234)          # the same global batch on every process
    G = trainer.config.group_size
    mine = full.select(range(acc.process_index * n_local * G, (acc.process_index + 1) * n_local * G))
    metrics, *_ = trainer.update(mine)
    assert not metrics["skipped"]
    if acc.is_main_process:
        old = {f"{f}/{n}": w.contiguous() for o in trainer.objectives.values()   # e.g. NFT's old adapter
               for f, tensors in o.checkpoint_tensors().items() for n, w in tensors.items()}
        save_file({**{n: p.detach().contiguous() for n, p in trainable}, **old, **grads}, out,
                  metadata={"reward_std": str(metrics["reward_std"]), "num_processes": str(acc.num_processes),
                            "gate_share": str(metrics.get("gate/share"))})
    acc.wait_for_everyone()
    if torch.distributed.is_initialized(): torch.distributed.destroy_process_group()   # gloo's threads end before the interpreter does
