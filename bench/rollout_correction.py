"""Benchmark: the AR's update with and without the correction for the sampler's own distribution, on the tiny
GLM-Image, with its sampling copy made to differ from the training forward about as much as the H200's bf16 copy did
(`ar/sampler_gap` 0.026-0.027 nats per token at the released architecture, BENCHMARKS.md).

The copy's output layer gets one fixed draw of Gaussian noise, scaled by bisection so that the first step's mean
|log p_copy - log p_train| per token is --gap; training then samples from that copy while the update's old log-probs
come from the training forward, as on the GPU. AR only (the DiT frozen), redness, 4 prompts x G = 4 per step, 64x64.
The evaluation reward is sampled from the training policy itself (the copy without its noise): 12 held-out prompts x
2 seeds. Modes: `none` (no correction), each `rollout_importance_sampling_mode`, `gspo` (the sequence-level ratio
with token_truncate), and `exact` (the copy without noise, what a sampler equal to the training forward gives).
Every mode runs the same seeds (policy, sampling, noise), so runs differ only by the correction.

Run from the repository root: python -m bench.rollout_correction [--workers N --threads T --steps S --seeds 0 1 2
--gap 0.027 --lr 0.03 --modes none token_truncate ... --out DIR]
Writes DIR/results.json and DIR/table.md."""
import argparse
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

PROMPTS = ["a red square on a white background", "a blue field", "a gradient from navy to teal", "the word 'OK' in white on blue"]
EVAL_PROMPTS = ["a purple triangle on black", "a yellow field", "a teal circle on a white background",
                "a gray square on navy", "the word 'GO' in black on green", "blue on the left, white on the right",
                "an orange circle on a blue background", "a white field", "the word 'NO' in yellow on black",
                "a gradient from green to gray", "a black square on a yellow background", "navy on the left, cyan on the right"]
EVAL_SEEDS = (101, 202)
NOISE_SEED = 1234
MODES = {"none": {}, "token_truncate": dict(rollout_importance_sampling_mode="token_truncate"),
         "token_mask": dict(rollout_importance_sampling_mode="token_mask"),
         "sequence_truncate": dict(rollout_importance_sampling_mode="sequence_truncate"),
         "sequence_mask": dict(rollout_importance_sampling_mode="sequence_mask"),
         "gspo": dict(rollout_importance_sampling_mode="token_truncate", importance_sampling_level="sequence"),
         "exact": {}}
TRACKED = ("reward_mean", "ar/sampler_gap", "ar/rollout_kl", "ar/rollout_k3_kl", "ar/rollout_chi2_token", "ar/rollout_chi2_seq",
           "ar/is_weight_mean", "ar/is_truncated_fraction", "ar/is_masked_fraction", "ar/clip_fraction", "ar/grad_norm")


class NoisySampler:
    "The copy's output layer with fixed noise of `scale` while training samples; the clean layer while evaluating."
    def __init__(self, policy, scale: float):
        import torch
        self.head = policy.sampling_model().lm_head
        self.clean = self.head.weight
        noise = torch.randn(self.clean.shape, generator=torch.Generator().manual_seed(NOISE_SEED), dtype=self.clean.dtype)
        self.noisy = self.clean + scale * noise
        self.on()
    def on(self): self.head.weight = self.noisy
    def off(self): self.head.weight = self.clean


def make_trainer(tiny, seed, lr, mode, threads=1):
    import torch
    torch.set_num_threads(threads)
    warnings.simplefilter("ignore")
    from glm_grpo_nb.policy import GlmImagePolicy
    from glm_grpo_nb.rewards import RednessReward
    from glm_grpo_nb.trainer import GRPOTrainer
    policy = GlmImagePolicy.from_pretrained(tiny, ar_lora=8, dit_lora=8, device="cpu", lora_seed=seed, sampling_copy=True,
                                            verbose=False)
    return GRPOTrainer(policy, RednessReward(), PROMPTS, group_size=4, prompts_per_step=4, height=64, width=64,
                       num_inference_steps=8, seed=seed, ar_lr=lr, train_dit=False, diversity_warning=0.0, **MODES[mode])


def measured_gap(tiny, scale, seed=0):
    "The first step's mean |log p_copy - log p_train| per sampled token with noise of `scale` on the copy's output layer."
    trainer = make_trainer(tiny, seed, 1e-3, "none", threads=os.cpu_count())
    NoisySampler(trainer.policy, scale)
    s = trainer.sample()
    return trainer.objectives["ar"].prepare(s.rollout)[1]["sampler_gap"]


def calibrate(tiny, gap, iters=12):
    "The noise scale whose first-step sampler gap is `gap` (bisection on a log scale; the gap grows with the scale)."
    lo, hi = 1e-4, 1.0
    for _ in range(iters):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if measured_gap(tiny, mid) < gap else (lo, mid)
    scale = (lo * hi) ** 0.5
    return scale, measured_gap(tiny, scale)


def run(job):
    "One training run: the evaluation curve (reward of the training policy itself) and every step's mismatch metrics."
    trainer = make_trainer(job["tiny"], job["seed"], job["lr"], job["mode"], job["threads"])
    noisy = NoisySampler(trainer.policy, 0.0 if job["mode"] == "exact" else job["scale"])
    def evaluate():
        noisy.off()
        try: return sum(trainer.evaluate(EVAL_PROMPTS, seed=s)["eval/reward"] for s in EVAL_SEEDS) / len(EVAL_SEEDS)
        finally: noisy.on()
    curve, rows, start = [(0, evaluate())], [], time.perf_counter()
    for step in range(1, job["steps"] + 1):
        res = trainer.step()
        rows.append({k: res.metrics[k] for k in TRACKED if k in res.metrics})
        if step % job["eval_every"] == 0 or step == job["steps"]: curve.append((step, evaluate()))
    return {**job, "curve": curve, "rows": rows, "skipped": trainer.skipped_total, "seconds": time.perf_counter() - start}


def final(r, k=2):
    "Final evaluation reward: the mean of the last k evaluations."
    return sum(c[-1] for c in r["curve"][-k:]) / k


def report(runs, a, scale, gap):
    lines = [f"Tiny GLM-Image, AR only, redness, {a.steps} steps of 4 prompts x 4 samples, 64x64, AR lr {a.lr:g}; the "
             f"copy's output layer with noise x {scale:.4g}: first-step sampler gap {gap:.4f} nats per token (goal "
             f"{a.gap}); evaluation from the training policy: {len(EVAL_PROMPTS)} held-out prompts x {len(EVAL_SEEDS)} seeds.",
             "", "| mode | eval start | eval final, per seed | final mean ± std | sampler gap | k3 KL | chi2 token | "
             "chi2 sequence | weight mean | truncated / masked | skipped |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    mean = lambda rs, k: statistics.mean(x[k] for r in rs for x in r["rows"] if k in x) if any(k in x for r in rs for x in r["rows"]) else None
    fmt = lambda v, f: "—" if v is None else format(v, f)
    for m in MODES:
        rs = sorted((r for r in runs if r["mode"] == m), key=lambda r: r["seed"])
        if not rs: continue
        finals = [final(r) for r in rs]
        cut = mean(rs, "ar/is_truncated_fraction")
        cut = mean(rs, "ar/is_masked_fraction") if cut is None else cut
        lines.append(f"| {m} | {statistics.mean(r['curve'][0][-1] for r in rs):+.3f} | {', '.join(f'{v:+.3f}' for v in finals)} | "
                     f"{statistics.mean(finals):+.3f} ± {statistics.stdev(finals) if len(finals) > 1 else 0:.3f} | "
                     f"{fmt(mean(rs, 'ar/sampler_gap'), '.4f')} | {fmt(mean(rs, 'ar/rollout_k3_kl'), '.2e')} | "
                     f"{fmt(mean(rs, 'ar/rollout_chi2_token'), '.2e')} | {fmt(mean(rs, 'ar/rollout_chi2_seq'), '.3g')} | "
                     f"{fmt(mean(rs, 'ar/is_weight_mean'), '.4f')} | {fmt(cut, '.4f')} | {sum(r['skipped'] for r in rs)} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--eval-every", type=int, default=6)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--gap", type=float, default=0.027, help="the sampler gap to make, nats per token (the H200's: 0.027)")
    ap.add_argument("--lr", type=float, default=3e-2, help="the AR adapters' learning rate")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--out", default="bench/rollout_correction_out")
    a = ap.parse_args()
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    from glm_grpo_nb.tiny import make_tiny_glm_image
    tiny = str(make_tiny_glm_image(Path(tempfile.mkdtemp()) / "tiny"))
    start = time.perf_counter()
    scale, gap = calibrate(tiny, a.gap)
    print(f"noise x {scale:.4g} on the copy's output layer: first-step sampler gap {gap:.4f} nats per token", flush=True)
    base = dict(tiny=tiny, threads=a.threads, steps=a.steps, eval_every=a.eval_every, lr=a.lr, scale=scale)
    with mp.get_context("spawn").Pool(a.workers) as pool:
        runs = pool.map(run, [dict(base, mode=m, seed=s) for m in a.modes for s in a.seeds])
    (out / "results.json").write_text(json.dumps({"runs": runs, "scale": scale, "gap": gap, "args": vars(a),
                                                 "cpu_count": os.cpu_count()}, indent=1))
    table = report(runs, a, scale, gap)
    (out / "table.md").write_text(table)
    print(table)
    print(f"wrote {out / 'results.json'}, {out / 'table.md'} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
