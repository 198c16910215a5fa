"""Benchmark: Flow-GRPO DiT steps on the tiny GLM-Image. Per-step forward and forward+backward time, update time for a
window of k of S stochastic steps, guidance on vs off; sampling with Euler after the window against MixGRPO-Flash
(`ode_solver="flash"`). Run from the repository root: python -m bench.dit"""
import tempfile
from pathlib import Path

import torch

from bench._bench import timed
from glm_grpo_nb.tiny import make_tiny_glm_image
from glm_grpo_nb.policy import GlmImagePolicy


if __name__ == "__main__":
    torch.set_num_threads(2)
    policy = GlmImagePolicy.from_pretrained(make_tiny_glm_image(Path(tempfile.mkdtemp()) / "tiny"), dit_lora=8, verbose=False)
    S, N, size = 16, 8, 128
    roll = policy.sample_tokens(["a red 'HI' sign on a blue wall"], N, size, size, seed=0)
    for scale in (1.5, 1.0):
        sample = timed(lambda: policy.sample_latents(roll, num_steps=S, sde_window=[0], guidance_scale=scale, seed=0), 3)
        print(f"{size}x{size}, N={N}, guidance {scale}: sampling {S} steps {sample:.3f} s ({sample / S * 1000:.1f} ms per step)")
        for k in (1, 2, 4, 8, 16):
            traj = policy.sample_latents(roll, num_steps=S, sde_window=range(k), guidance_scale=scale, seed=0)
            with torch.no_grad(): fwd = timed(lambda: policy.latent_logprobs(traj))
            def update():
                policy.latent_logprobs(traj).sum().backward(); policy.zero_grad(set_to_none=True)
            upd = timed(update)
            print(f"  window {k:2d}/{S}: recompute forward {fwd:.3f} s ({fwd / k * 1000:.1f} ms/step), "
                  f"forward+backward {upd:.3f} s ({upd / k * 1000:.1f} ms/step)")

    for scale in (1.5, 1.0):   # the ODE after a 2-step window: the pipeline's Euler against MixGRPO-Flash
        for S in (10, 20):
            kw = dict(num_steps=S, sde_window=[0, 1], guidance_scale=scale, seed=0)
            euler = timed(lambda: policy.sample_latents(roll, **kw), 3)
            flash = timed(lambda: policy.sample_latents(roll, **kw, ode_solver="flash"), 3)
            steps = policy.sample_latents(roll, **kw, ode_solver="flash").num_steps
            print(f"{size}x{size}, N={N}, guidance {scale}, {S} steps, window [0, 1]: Euler {euler:.3f} s ({S} DiT steps), "
                  f"Flash {flash:.3f} s ({steps} DiT steps), {euler / flash:.2f}x")
