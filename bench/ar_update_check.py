"""The AR half of a GRPO step in isolation, at the released width: sample with the trainer's settings, then each
optimiser step's micro-batches through TokenGRPO's loss and backward, reporting per micro-batch the loss, the gradient
norm, which LoRA tensors (if any) hold non-finite gradients, and the attention masks the training forward ran (their
empty rows: a query with no key to attend to). A quick bisect between a plain log-prob backward and the trainer.

Run from the repository root:
python -m bench.ar_update_check [--layers N] [--size 1024] [--dtype bf16|fp32 (default: bf16 where native)] [--device cuda|cpu] [--no-copy]
                                [--no-checkpointing] [--nf4] [--padded-forward]
(--layers 0: the tiny model, a check of this script; default 2 layers per stack on CUDA, 1 on the CPU;
--padded-forward: the training forward as it was before it cut shared padding and gave padded queries a key, so both
can be compared on one machine). One JSON line per micro-batch, then a summary line; exit status 1 if a gradient was
not finite."""
import json
import sys
import time

import torch
import torch.nn.functional as F

from glm_grpo_nb.policy import GlmImagePolicy
from glm_grpo_nb.rewards import RednessReward
from glm_grpo_nb.trainer import GRPOTrainer

PROMPTS = ["a lighthouse on a cliff at dusk, oil painting", "a bowl of ramen on a wooden table, photo"]


def _arg(name, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def padded_token_logprobs(self, rollout, micro_batch_size=None, truncated=True):
    "`token_logprobs` before empty attention rows were removed: every padded column kept, transformers' own mask."
    from glm_grpo_nb.policy import train_mode
    from glm_grpo_nb.tokens import sampling_logits
    N, T = rollout.num_samples, rollout.completion.shape[1]
    mb, out = N if micro_batch_size is None else micro_batch_size, []
    k, p = (rollout.top_k, rollout.top_p) if truncated else (0, 1.0)
    with train_mode(self.ar, torch.is_grad_enabled()):
        for start in range(0, N, mb):
            rows = slice(start, min(start + mb, N))
            seq = self.on_device(rollout.sequences[rows, :-1])
            attn = self.on_device(torch.cat([rollout.attention_mask[rows], torch.ones(seq.shape[0], T - 1, dtype=torch.long)], 1))
            with torch.no_grad(): pos = self._position_ids(rollout, rows)
            logits = self.ar(input_ids=seq, attention_mask=attn, position_ids=pos, use_cache=False, logits_to_keep=T).logits
            logp = sampling_logits(logits, self.codebook_size, rollout.temperature, k, p).log_softmax(-1)
            target = self.on_device(rollout.completion[rows]).clamp(max=logp.shape[-1] - 1)
            lp = logp.gather(-1, target[..., None])[..., 0]
            out.append(torch.where(self.on_device(rollout.completion_mask[rows]), lp, torch.zeros_like(lp)))
    return torch.cat(out, 0)


def main():
    device = _arg("--device", "cuda" if torch.cuda.is_available() else "cpu")
    layers = int(_arg("--layers", 2 if device == "cuda" else 1))
    from glm_grpo_nb.hub import compute_dtype   # bf16 on CUDA and on a CPU that has it natively, else float32
    default = "bf16" if compute_dtype(device) == torch.bfloat16 else "fp32"
    size, dtype = int(_arg("--size", 1024 if layers else 64)), dict(bf16=torch.bfloat16, fp32=torch.float32)[_arg("--dtype", default)]
    nf4, copy, gc = "--nf4" in sys.argv, "--no-copy" not in sys.argv, "--no-checkpointing" not in sys.argv
    if "--padded-forward" in sys.argv: GlmImagePolicy.token_logprobs = padded_token_logprobs
    t0 = time.perf_counter()
    if layers == 0:
        import tempfile
        from pathlib import Path
        from glm_grpo_nb.tiny import make_tiny_glm_image
        policy = GlmImagePolicy.from_pretrained(make_tiny_glm_image(Path(tempfile.mkdtemp()) / "tiny"), load_in_4bit=nf4,
                                                ar_lora=16, device=device, torch_dtype=dtype, sampling_copy=copy,
                                                gradient_checkpointing=gc, verbose=False)
    else:
        from glm_grpo_nb.tiny import make_random_glm_image
        parts = make_random_glm_image(device, dtype, layers=layers, load_in_4bit=nf4)
        policy = GlmImagePolicy.from_components(parts, load_in_4bit=nf4, ar_lora=16, dit_lora=16, device=device,
                                                sampling_copy=copy, gradient_checkpointing=gc)
        del parts
    t = GRPOTrainer(policy, RednessReward(), PROMPTS, group_size=4, prompts_per_step=2, height=size, width=size,
                    num_inference_steps=10, train_dit=False)
    masks, real = [], F.scaled_dot_product_attention
    def counting(q, k, v, attn_mask=None, *a, **kw):   # what each attention call of the training forward was given
        if q.requires_grad:
            empty = 0 if attn_mask is None or attn_mask.dtype != torch.bool else int((~attn_mask.any(-1)).sum())
            masks.append({"mask": None if attn_mask is None else list(attn_mask.shape), "empty_rows": empty})
        return real(q, k, v, attn_mask, *a, **kw)
    F.scaled_dot_product_attention = counting
    roll = policy.sample_tokens(PROMPTS, 4, size, size, seed=0)
    print(json.dumps({"setup": dict(device=device, layers=layers, size=size, dtype=str(dtype), nf4=nf4, copy=copy,
                                    checkpointing=gc, padded_forward="--padded-forward" in sys.argv),
                      "build_and_sample_s": round(time.perf_counter() - t0, 1),
                      "sequences": list(roll.sequences.shape),
                      "padding_per_row": (roll.attention_mask == 0).sum(1).tolist()}), flush=True)
    obj = t.objectives["ar"]
    adv = torch.randn(8, generator=torch.Generator().manual_seed(0))
    adv = (adv.view(2, 4) - adv.view(2, 4).mean(1, keepdim=True)).flatten()
    prepared, m = obj.prepare(roll)
    bad_total = 0
    for j, step_rows in enumerate(t._update_rows(roll.num_samples)):
        for rows in t._micro_batches(step_rows):
            masks.clear()
            loss, mm = obj.loss(roll.select(rows), adv[rows], {k: v[rows] for k, v in prepared.items()}, 0)
            loss.backward()
            bad = [n for n, p in obj.named_params if p.grad is not None and not torch.isfinite(p.grad).all()]
            bad_total += len(bad)
            norm = torch.nn.utils.clip_grad_norm_([p for _, p in obj.named_params], float("inf")).item()
            print(json.dumps({"optimiser_step": j, "rows": rows, "loss": loss.item(), "grad_norm": norm,
                              "nonfinite_tensors": len(bad), "first": bad[:3], "ratio_min": mm["ratio_min"],
                              "ratio_max": mm["ratio_max"], "nonfinite_logprobs": mm["nonfinite_logprobs"],
                              "attention": masks[:1], "empty_rows": sum(x["empty_rows"] for x in masks)}), flush=True)
            t.optimizer.zero_grad(set_to_none=True)
    print(json.dumps({"sampler_gap": m["sampler_gap"], "nonfinite_tensors": bad_total,
                      "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
    sys.exit(1 if bad_total else 0)


if __name__ == "__main__":
    main()
