"""Benchmark: learning per wall-clock second for the DiT's objectives on the tiny GLM-Image (shipped weights).

For DiT-only and joint (AR + DiT) training, three ways of training the DiT are compared:
  (a) Flow-GRPO with SDE steps and guidance 1.5 (the default setting until now),
  (b) Flow-GRPO with coefficient-preserving (cps) steps and guidance 1.0 (CFG-free),
  (c) DiffusionNFT with guidance 1.0 (CFG-free, ODE sampling).
The reward is redness; the evaluation reward is redness on held-out prompts with fixed seeds (ODE sampling), logged
against the training wall-clock (evaluation time excluded). Each method gets the same learning-rate search for the DiT
(on seed 0; the rate with the best final evaluation reward is then run on the other seeds).

Run from the repository root: python -m bench.learning [--workers N --threads T --steps S --out DIR]
Runs go to worker processes (spawned, `--threads` torch threads each); keep workers x threads <= CPU cores so timings
are not distorted by contention. Writes DIR/results.json, DIR/learning.png and DIR/table.md.
"""
import argparse
import json
import multiprocessing as mp
import os
import tempfile
import time
import warnings
from pathlib import Path

PROMPTS = ["a blue square on a white background", "a green circle on a gray background", "a gradient from navy to teal",
           "the word 'OK' in white on blue", "green on the left, black on the right", "a cyan field"]
EVAL_PROMPTS = ["a purple triangle on black", "a yellow field", "a teal circle on a white background",
                "a gray square on navy", "the word 'GO' in black on green", "blue on the left, white on the right"]
EVAL_SEEDS = (101, 202)
METHODS = {
    "flow_grpo sde g1.5": dict(dit_objective="flow_grpo", sde_type="sde", guidance_scale=1.5),
    "flow_grpo cps g1.0": dict(dit_objective="flow_grpo", sde_type="cps", guidance_scale=1.0),
    "nft g1.0": dict(dit_objective="nft", guidance_scale=1.0),
}
MODES = {"dit": dict(train_ar=False), "joint": dict(train_ar=True, ar_lr=3e-3)}
LRS = (3e-3, 1e-2, 3e-2, 1e-1)   # the DiT's learning rates searched, the same for every method


def run(job):
    "One training run; returns its evaluation curve against training seconds and steps."
    import torch
    torch.set_num_threads(job["threads"])
    warnings.simplefilter("ignore")
    from glm_grpo_nb.policy import GlmImagePolicy
    from glm_grpo_nb.rewards import RednessReward
    from glm_grpo_nb.trainer import GRPOTrainer
    policy = GlmImagePolicy.from_pretrained(job["tiny"], ar_lora=8, dit_lora=8, device="cpu", lora_seed=job["seed"],
                                            verbose=False)
    trainer = GRPOTrainer(policy, RednessReward(), PROMPTS, group_size=4, prompts_per_step=3, height=64, width=64,
                          num_inference_steps=8, seed=job["seed"], dit_lr=job["lr"], diversity_warning=0.0,
                          **MODES[job["mode"]], **METHODS[job["method"]])
    evaluate = lambda: sum(trainer.evaluate(EVAL_PROMPTS, seed=s)["eval/reward"] for s in EVAL_SEEDS) / len(EVAL_SEEDS)
    seconds, curve, rows = 0.0, [(0, 0.0, evaluate())], []
    for step in range(1, job["steps"] + 1):
        t = time.perf_counter()
        res = trainer.step()
        seconds += time.perf_counter() - t
        rows.append({"reward": res.metrics["reward_mean"], "diversity": res.metrics["diversity"],
                     **res.seconds})
        if step % job["eval_every"] == 0 or step == job["steps"]: curve.append((step, seconds, evaluate()))
    return {**job, "curve": curve, "rows": rows, "skipped": trainer.skipped_total}


def final(r, k=2):
    "Final evaluation reward: the mean of the last k evaluations."
    return sum(e for _, _, e in r["curve"][-k:]) / k


def time_to_reach(r, level):
    "Training seconds at the first evaluation at or above `level` (None if never)."
    return next((s for _, s, e in r["curve"] if e >= level), None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="bench/learning_out")
    ap.add_argument("--from-results", action="store_true", help="only redraw the table and figure from DIR/results.json")
    a = ap.parse_args()
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    if a.from_results:
        saved = json.loads((out / "results.json").read_text())
        best = {tuple(k.split("/", 1)): v for k, v in saved["best_lr"].items()}
        a = argparse.Namespace(**{**saved["args"], "out": str(out)})
        table = report(saved["runs"], saved["search"], best, a)
        (out / "table.md").write_text(table); print(table)
        return figure(saved["runs"], out / "learning.png")
    from glm_grpo_nb.tiny import make_tiny_glm_image
    tiny = str(make_tiny_glm_image(Path(tempfile.mkdtemp()) / "tiny"))
    base = dict(tiny=tiny, threads=a.threads, steps=a.steps, eval_every=a.eval_every)
    start = time.perf_counter()
    with mp.get_context("spawn").Pool(a.workers) as pool:
        search = pool.map(run, [dict(base, mode=m, method=k, lr=lr, seed=a.seeds[0]) for m in MODES for k in METHODS for lr in LRS])
        best = {(m, k): max((r for r in search if (r["mode"], r["method"]) == (m, k)), key=final)["lr"]
                for m in MODES for k in METHODS}
        rest = pool.map(run, [dict(base, mode=m, method=k, lr=best[m, k], seed=s) for m in MODES for k in METHODS
                              for s in a.seeds[1:]])
    runs = [r for r in search if r["lr"] == best[r["mode"], r["method"]]] + rest
    (out / "results.json").write_text(json.dumps({"search": search, "runs": runs, "best_lr": {f"{m}/{k}": v for (m, k), v in best.items()},
                                                 "args": vars(a), "cpu_count": os.cpu_count()}, indent=1))
    table = report(runs, search, best, a)
    (out / "table.md").write_text(table)
    print(table)
    figure(runs, out / "learning.png")
    print(f"wrote {out / 'results.json'}, {out / 'learning.png'}, {out / 'table.md'} in {time.perf_counter() - start:.0f} s")


def report(runs, search, best, a):
    "A markdown table: per mode and method, the searched rates, the chosen one, and per seed the final evaluation reward,"
    " seconds per step, and the time NFT and cps need to reach (a)'s final evaluation reward."
    lines = [f"Tiny GLM-Image, redness, {a.steps} steps of 3 prompts x 4 samples, 64x64, 8 denoising steps; DiT learning "
             f"rates searched {', '.join(f'{lr:g}' for lr in LRS)} on seed {a.seeds[0]}; evaluation: {len(EVAL_PROMPTS)} held-out "
             f"prompts x {len(EVAL_SEEDS)} seeds, ODE.", "",
             "| mode | method | DiT lr (search: final eval per lr) | seed | eval start | eval final | s/step (DiT part) | "
             "final diversity | time to (a)'s final | fraction of (a)'s time |", "|---|---|---|---|---|---|---|---|---|---|"]
    for m in MODES:
        for k in METHODS:
            found = ", ".join(f"{r['lr']:g}: {final(r):+.3f}" for r in search if (r["mode"], r["method"]) == (m, k))
            for r in sorted((r for r in runs if (r["mode"], r["method"]) == (m, k)), key=lambda r: r["seed"]):
                ref = next(x for x in runs if (x["mode"], x["method"], x["seed"]) == (m, "flow_grpo sde g1.5", r["seed"]))
                total = ref["curve"][-1][1]
                improved = final(ref) > ref["curve"][0][2]   # otherwise "reaching" it says nothing
                t = time_to_reach(r, final(ref)) if improved else None
                steps = len(r["rows"])
                tail = ((f"{'never' if t is None else f'{t:.0f} s'} | {'-' if t is None else f'{t / total:.2f}'} |")
                        if improved else "(a) did not improve | - |")
                dit = sum(row.get("sample_dit", 0) + row.get("decode", 0) + row.get("update_dit", 0) for row in r["rows"]) / steps
                lines.append(f"| {m} | {k} | {best[m, k]:g} ({found}) | {r['seed']} | {r['curve'][0][2]:+.3f} | {final(r):+.3f} | "
                             f"{r['curve'][-1][1] / steps:.2f} ({dit:.2f}) | {r['rows'][-1]['diversity']:.3f} | " + tail)
    return "\n".join(lines) + "\n"


def figure(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(MODES), figsize=(6 * len(MODES), 3.6), squeeze=False)
    for ax, m in zip(axes[0], MODES):
        for i, k in enumerate(METHODS):
            for j, r in enumerate(sorted((r for r in runs if (r["mode"], r["method"]) == (m, k)), key=lambda r: r["seed"])):
                ax.plot([s for _, s, _ in r["curve"]], [e for _, _, e in r["curve"]], color=f"C{i}", alpha=0.85, marker=".",
                        label=f"{k} (lr {r['lr']:g})" if j == 0 else None)
        ax.set_title(f"{'DiT only' if m == 'dit' else 'joint AR + DiT'}: evaluation reward, {len({r['seed'] for r in runs})} seeds", fontsize=10)
        ax.set_xlabel("training wall-clock (s)"); ax.set_ylabel("held-out redness (ODE)")
        ax.legend(fontsize=8)
    fig.tight_layout(); fig.savefig(path, dpi=110); plt.close(fig)


if __name__ == "__main__":
    main()
