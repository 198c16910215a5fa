"""Benchmark: the 4-bit AR's training forward, its parameters besides the NF4 weights in float32 (peft's k-bit
preparation, what the policy did before) or in the compute dtype (bf16, now). Tiny GLM-Image, CPU, bf16 compute,
NF4 + rank-8 LoRA, the bf16 sampling copy drawing the tokens: 2 prompts x G = 4 at 64² (the grid plus its preview).
Prints the dtype of the logits, the bytes autograd keeps, seconds per forward+backward (median of 5) and the largest
|log-prob of the sampling copy - log-prob of the training forward| and its mean (`ar/sampler_gap`).
Run from the repository root: python -m bench.ar_4bit_dtype [--upcast]"""
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from peft import prepare_model_for_kbit_training

from bench._bench import KeptForBackward
from glm_grpo_nb.policy import GlmImagePolicy
from glm_grpo_nb.tiny import make_tiny_glm_image

if __name__ == "__main__":
    torch.set_num_threads(2)
    tiny = make_tiny_glm_image(Path(tempfile.mkdtemp()) / "tiny")
    for upcast in (True, False):
        pol = GlmImagePolicy.from_pretrained(tiny, load_in_4bit=True, ar_lora=8, torch_dtype=torch.bfloat16,
                                             sampling_copy=True, verbose=False)
        if upcast:   # the earlier behaviour: every parameter but the NF4 weights in float32
            prepare_model_for_kbit_training(pol.ar, use_gradient_checkpointing=False)
            for n, p in pol.ar.named_parameters(): p.requires_grad_("lora_" in n)
        roll = pol.sample_tokens(["a red square", "a blue circle on green"], 4, 64, 64, seed=0)
        with KeptForBackward() as saved:
            lp = pol.token_logprobs(roll)
        logits_dtype = pol.ar.lm_head.weight.dtype
        diff = (lp.detach().float() - roll.logprobs.float()).abs()[roll.completion_mask]
        gap, mean_gap = diff.max().item(), diff.mean().item()
        def step():
            pol.token_logprobs(roll).sum().backward(); pol.zero_grad(set_to_none=True)
        step(); times = []
        for _ in range(5):
            t = time.perf_counter(); step(); times.append(time.perf_counter() - t)
        others = {p.dtype for n, p in pol.ar.named_parameters() if "lora_" not in n and p.__class__.__name__ != "Params4bit"}
        print(f"{'float32 (before)' if upcast else 'bf16 (now)':<18} other parameters {sorted(map(str, others))}, head "
              f"{logits_dtype}: kept for backward {saved.bytes / 2 ** 20:.2f} MB, forward+backward "
              f"{statistics.median(times):.3f} s, sampler gap mean {mean_gap:.4f} largest {gap:.4f}")
