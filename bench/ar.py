"""Benchmark: AR group sampling on the tiny GLM-Image (G = 8), batched vs sequential, and recompute vs sampling.
Run from the repository root: python -m bench.ar"""
import tempfile
from pathlib import Path

import torch

from bench._bench import timed
from glm_grpo_nb.tiny import make_tiny_glm_image
from glm_grpo_nb.policy import GlmImagePolicy


if __name__ == "__main__":
    torch.set_num_threads(2)
    policy = GlmImagePolicy.from_pretrained(make_tiny_glm_image(Path(tempfile.mkdtemp()) / "tiny"), ar_lora=8, verbose=False)
    G, prompt = 8, ["a red square on a blue background"]
    for size in (64, 128):
        kw = dict(height=size, width=size)
        policy.sample_tokens(prompt, G, seed=0, **kw)  # warm up
        batched = timed(lambda: policy.sample_tokens(prompt, G, seed=0, **kw))
        sequential = timed(lambda: [policy.sample_tokens(prompt, 1, seed=i, **kw) for i in range(G)])
        roll = policy.sample_tokens(prompt, G, seed=0, **kw)
        T = roll.completion.shape[1]
        with torch.no_grad(): no_grad = timed(lambda: policy.token_logprobs(roll))
        def fwd_bwd():
            policy.token_logprobs(roll).sum().backward(); policy.zero_grad(set_to_none=True)
        with_grad = timed(fwd_bwd)
        print(f"{size}x{size}, G={G}, {T} tokens per sample: batched {batched:.2f} s, sequential {sequential:.2f} s "
              f"({sequential / batched:.1f}x); recompute no-grad {no_grad:.3f} s, forward+backward {with_grad:.3f} s "
              f"({batched / with_grad:.1f}x faster than sampling)")
