"""Where the sampling copy's gap to the training forward comes from, at the released width (one layer per stack, NF4).

The check of `tests/test_released_width.py` taken apart: a fixed token sequence, then 5 supervised updates of the
AR's adapters (lr 5e-3); after each, the copy (refreshed) and the training forward (NF4 + LoRA) score the sequence
teacher-forced, and the largest per-token difference of their log-probs is the gap. For each update this prints:
- the gap, the token it is at, that token's logit and the spacing of the compute dtype at it (one ulp: bf16 keeps 8
  significant bits, so a logit in [4, 8) is rounded to a multiple of 2^-5 = 0.031);
- the gap with the LM head's output kept in float32 in both (the same weights and hidden states, the logits not
  rounded to the compute dtype): what the hidden states' own differences give;
- the largest difference of the two sides' logits before the log-softmax, in ulps of the compute dtype;
- the gap of a copy one update behind (refreshed before the update, not after), which a bound has to catch.
`--dtype float32` builds the model in float32 (no bf16 anywhere); `--grouped-a` computes the copy's q, k and v adapter
A products as one GEMM (as before); `--plain-order` adds every adapter product before rounding (as before, wrong for
peft's bitsandbytes layers; the released-width build's layers are peft's plain ones, so it changes nothing here); the
thread count is torch's (`OMP_NUM_THREADS`).

Run from the repository root: OMP_NUM_THREADS=2 python -m bench.copy_gap [--dtype bfloat16|float32] [--out FILE]
"""
import argparse
import json
import math
import time


def ulp(x: float, dtype) -> float:
    "The spacing of `dtype`'s numbers at |x|."
    import torch
    mant = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}[dtype]
    return 2.0 ** (math.floor(math.log2(max(abs(x), 1e-30))) - mant)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default=None, choices=["bfloat16", "float32"], help="default: the CPU's compute dtype")
    ap.add_argument("--updates", type=int, default=5)
    ap.add_argument("--grouped-a", action="store_true",
                    help="the copy's q, k and v adapters' A products as one GEMM, as the copy computed them before (their share of the gap)")
    ap.add_argument("--plain-order", action="store_true",
                    help="every adapter product added before rounding, whatever layer peft made (the copy before it followed peft's bnb layers)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import warnings
    warnings.simplefilter("ignore")
    import torch
    from PIL import Image
    import glm_grpo_nb.tiny as tiny
    from glm_grpo_nb.policy import GlmImagePolicy
    from glm_grpo_nb.sft import SFTTrainer
    from glm_grpo_nb.sampling_copy import LowRankLinear
    start_time = time.perf_counter()
    dtype = getattr(torch, args.dtype) if args.dtype else None
    parts = tiny.make_random_glm_image(layers=1, load_in_4bit=True, dtype=dtype)
    policy = GlmImagePolicy.from_components(parts, load_in_4bit=True, ar_lora=4, dit_lora=4, device="cpu",
                                            sampling_copy=True, gradient_checkpointing=True)
    del parts
    compute = policy.dit_dtype
    prompt, target = "a red sign that says 'GRPO'", Image.new("RGB", (256, 256), (200, 30, 30))
    fixed = policy.sample_tokens([prompt], 1, 256, 256, seed=5)
    mask = fixed.completion_mask[:, 1:].bool() if fixed.completion_mask.shape[1] > 1 else fixed.completion_mask.bool()

    state = {"fp32_head": False}
    head_forward = {}

    def fp32_head(module, inputs, output):   # the head's output in float32: the same weights, no rounding of the logits
        if not state["fp32_head"]: return output
        x = inputs[0].float()
        if isinstance(module, LowRankLinear):
            y = torch.nn.functional.linear(x, module.weight.float(), None if module.bias is None else module.bias.float())
            if module.lora_A.shape[0]: y = y + torch.nn.functional.linear(torch.nn.functional.linear(x, module.lora_A.float()), module.lora_B.float())
            return y
        base = module.get_base_layer() if hasattr(module, "get_base_layer") else module
        y = torch.nn.functional.linear(x, base.weight.float(), None if base.bias is None else base.bias.float())
        for name in getattr(module, "active_adapters", []):
            if name in getattr(module, "lora_A", {}):
                y = y + module.lora_B[name](module.lora_A[name](x.to(module.lora_A[name].weight.dtype))).float() * module.scaling[name]
        return y

    policy.ar.lm_head.register_forward_hook(fp32_head)
    copy = policy.sampling_model()
    copy.lm_head.register_forward_hook(fp32_head)
    from glm_grpo_nb.sampling_copy import GroupedProjections
    if args.grouped_a:   # the three A products in one [r_q + r_k + r_v, in] GEMM
        def grouped(self, x):
            base = (torch.nn.functional.linear(x, self.weight, self.bias).split(self.sizes, dim=-1) if self.weight is not None
                    else [torch.nn.functional.linear(x, p.weight, p.bias) for p in self.parts])
            A = torch.cat([p.lora_A for p in self.parts])
            low = torch.nn.functional.linear(x.to(A.dtype), A).split([p.lora_A.shape[0] for p in self.parts], dim=-1)
            return tuple(p.add_low(y, torch.nn.functional.linear(a, p.lora_B)) for y, a, p in zip(base, low, self.parts))
        GroupedProjections.forward = grouped
    if args.plain_order:
        for m in copy.modules():
            if isinstance(m, LowRankLinear): m.round_low = False

    def logits_of(model):
        "The teacher-forced log-probs and raw logits of the fixed sequence under `model` (the AR or the copy)."
        captured = {}
        hook = model.lm_head.register_forward_hook(lambda m, i, o: captured.__setitem__("logits", o.detach()))
        ar = type(policy).ar
        type(policy).ar = property(lambda self: model)
        try:
            with torch.no_grad(): lp = policy.token_logprobs(fixed)
        finally:
            type(policy).ar = ar
            hook.remove()
        return lp, captured["logits"]

    def measure(refresh=True):
        copy_model = policy.sampling_model() if refresh else copy
        with torch.no_grad():
            train_lp, train_logits = logits_of(policy.ar)
            copy_lp, copy_logits = logits_of(copy_model)
        diff = (copy_lp - train_lp).abs()
        at = int(diff.argmax())
        row, col = divmod(at, diff.shape[1])
        tok = int(fixed.completion[row, col])
        logit = float(train_logits[row, col, tok])   # the head's output at place j predicts token j
        d_logits = (copy_logits.float() - train_logits.float()).abs().max().item()
        return dict(gap=diff.max().item(), token=col, logit=logit, ulp=ulp(logit, train_logits.dtype),
                    logits_dtype=str(train_logits.dtype), logit_gap=d_logits,
                    max_logit=train_logits.float().abs().max().item()), train_lp

    def both():
        m, train = measure()
        state["fp32_head"] = True
        m32, _ = measure()
        state["fp32_head"] = False
        m["gap_fp32_head"] = m32["gap"]
        m["logit_gap_fp32_head"] = m32["logit_gap"]
        return m, train

    follow = SFTTrainer(policy, [{"prompt": prompt, "target": target}], prompts_per_step=1, height=256, width=256,
                        lr=5e-3, seed=1, train_dit=False)
    first, start = both()
    rows, last = [], start
    for k in range(args.updates):
        policy.sampling_model()   # the copy refreshed now: after this update it is one update behind
        follow.step()
        behind, _ = measure(refresh=False)
        m, train = both()
        m.update(update=k + 1, behind=behind["gap"], step_drift=(train - last).abs().max().item(),
                 drift=(train - start).abs().max().item())
        rows.append(m)
        last = train
        print(json.dumps({k: (round(v, 7) if isinstance(v, float) else v) for k, v in m.items()}), flush=True)
    out = dict(compute_dtype=str(compute), threads=torch.get_num_threads(), capability=torch.backends.cpu.get_cpu_capability(),
               before=first, updates=rows, seconds=time.perf_counter() - start_time)
    print(json.dumps(dict(compute_dtype=out["compute_dtype"], threads=out["threads"], capability=out["capability"],
                          gap0=first["gap"], gap0_fp32_head=first["gap_fp32_head"], seconds=round(out["seconds"], 1))))
    if args.out:
        with open(args.out, "w") as f: json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
