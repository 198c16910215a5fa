"""Benchmark: the sampling copy's adapters kept apart (the default) or merged into its weights (`policy.sampling_merge`),
at GLM-Image's released width with one layer per stack, NF4 base weights, rank-16 LoRA, the copy in the compute dtype
(bf16 where the CPU has it natively, as on a GPU). The adapters' B factors are set to random values of a few scales
(a freshly trained adapter's size after about 1, 10 and 100 optimiser steps at lr 1e-4); for each, 8 sequences at
1024x1024 (1,280 tokens each) are sampled with the factors apart and merged from the same seeds, and each sample's
log-probs are recomputed by the training forward (NF4 + LoRA, exact). Reported per scale and mode: the sampler gap
(mean |sampled − recomputed| log-prob per token; the trainer's `ar/sampler_gap`), its mean (a bias), the k3 KL of the
sampler to the policy per token, the fraction of the delta lost when rounded into the weight (layer 0's q_proj), and
the seconds per token step on this CPU.

python -m bench.sampler_merge [--scales 1e-4,1e-3,1e-2] [--size 1024] [--out bench/results/sampler_merge_cpu.json]"""
import json
import sys
import time
from pathlib import Path


def _arg(name, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main():
    import torch
    from glm_grpo_nb.policy import GlmImagePolicy
    from glm_grpo_nb.sampling_copy import merged_weight
    from glm_grpo_nb.tiny import make_random_glm_image
    scales = [float(s) for s in _arg("--scales", "1e-4,1e-3,1e-2").split(",")]
    size, out = int(_arg("--size", 1024)), Path(_arg("--out", "bench/results/sampler_merge_cpu.json"))
    torch.manual_seed(0)
    parts = make_random_glm_image("cpu", layers=1, load_in_4bit=True)
    policy = GlmImagePolicy.from_components(parts, load_in_4bit=True, ar_lora=16, dit_lora=16, device="cpu", sampling_copy=True)
    del parts
    prompts = ["a lighthouse on a cliff at dusk, oil painting", "a bowl of ramen on a wooden table, photo"]
    policy.prompt_bucket, policy.row_bucket = policy.prompt_length(prompts, size, size), 8
    report = {"torch": torch.__version__, "threads": torch.get_num_threads(), "copy_dtype": str(policy.dit_dtype),
              "size": size, "rows": 8, "runs": []}
    q = policy.ar.model.language_model.layers[0].self_attn.q_proj
    for scale in scales:
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for n, p in policy.named_parameters():
                if "lora_B" in n and "vision_language_encoder" in n: p.copy_(torch.randn(p.shape, generator=g) * scale)
        exact, base = merged_weight(q), merged_weight(q.get_base_layer())   # float32: base + delta, the base alone
        kept = exact.to(policy.dit_dtype).float() - base.to(policy.dit_dtype).float()   # the delta a merged weight holds
        lost = (kept - (exact - base)).norm().item() / max((exact - base).norm().item(), 1e-30)
        for merge in (False, True):
            policy.sampling_merge = merge
            policy.sample_tokens(prompts[:1], 1, 64, 64, seed=0)   # the merge (or refresh) itself, outside the timing
            t = time.perf_counter()
            roll = policy.sample_tokens(prompts, 4, size, size, seed=0)
            seconds = time.perf_counter() - t
            with torch.no_grad(): lp = policy.token_logprobs(roll)
            mask = roll.completion_mask
            d = (roll.logprobs - lp.cpu())[mask].double()
            k3 = (torch.exp(-d) - 1 + d).mean().item()   # KL(sampler || policy) per token, k3 estimator
            run = {"b_scale": scale, "merged": merge, "gap_abs": d.abs().mean().item(), "gap_mean": d.mean().item(),
                   "k3_kl": k3, "delta_lost_when_rounded": round(lost, 4),
                   "ms_per_token_step": round(1000 * seconds / roll.completion.shape[1], 2)}
            report["runs"].append(run)
            print(json.dumps(run), flush=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=1) + "\n")
    policy.sampling_merge = False


if __name__ == "__main__":
    main()
