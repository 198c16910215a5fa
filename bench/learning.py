"""Benchmark: learning per second of the DiT's own work, for every DiT objective, on the tiny GLM-Image (shipped weights).

Seven ways of training the DiT, each with its authors' recipe (the library's defaults for it, see 04a_objectives):
  flow_grpo   Flow-GRPO, SDE steps in a fixed window (the first quarter), guidance 1.5, two optimiser steps per
              sampled batch, clip 1e-4;
  mixgrpo     Flow-GRPO with MixGRPO's moving window (progressive, moving every 25 steps: its recipe);
  mixgrpo_flash  the same with MixGRPO-Flash's second-order ODE on a compressed tail after the window;
  grpo_guard  GRPO-Guard: Flow-GRPO with each step's log-ratio normalised and 1/|dt| weights;
  nft         DiffusionNFT, ODE sampling with the old adapter, no guidance;
  awm         Advantage Weighted Matching, ODE sampling, no guidance, ghuber weighting, EMA penalty 1, clip 1;
  dgpo        Direct Group Preference Optimization, guided ODE sampling, noise levels 0..0.6 S, the base reference
              (beta 100), a trust region of 1e-2 against a fast EMA.
DiT-only (the AR frozen) and joint (AR + DiT). The reward is redness; the evaluation reward is redness on 12 held-out
prompts x 2 seeds (24 images, ODE sampling, fixed seeds), logged against steps, training wall-clock and the DiT's own
seconds (its sampling, decoding and update; the AR's sampling, the same for every method, left out). Each method's
DiT learning rate is searched DiT-only on the first seed (best final evaluation reward) and used for every run.

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
                "a gray square on navy", "the word 'GO' in black on green", "blue on the left, white on the right",
                "an orange circle on a blue background", "a white field", "the word 'NO' in yellow on black",
                "a gradient from green to gray", "a black square on a yellow background", "navy on the left, cyan on the right"]
EVAL_SEEDS = (101, 202)
METHODS = {
    "flow_grpo": dict(dit_objective="flow_grpo"),
    "mixgrpo": dict(dit_objective="flow_grpo", sde_window_schedule="progressive"),
    "mixgrpo_flash": dict(dit_objective="flow_grpo", sde_window_schedule="progressive", ode_solver="flash"),
    "grpo_guard": dict(dit_objective="grpo_guard"),
    "flow_dppo": dict(dit_objective="flow_dppo"),
    "nft": dict(dit_objective="nft"),
    "awm": dict(dit_objective="awm"),
    "dgpo": dict(dit_objective="dgpo"),
}
MODES = {"dit": dict(train_ar=False), "joint": dict(train_ar=True, ar_lr=3e-3)}
LRS = (3e-3, 1e-2, 3e-2, 1e-1, 3e-1)   # the DiT's learning rates searched, the same for every method
DIT_PHASES = ("sample_dit", "decode", "update_dit", "prepare", "optimizer")   # the DiT's own work in a step
PER_STEP = 4   # prompts per step: two optimiser steps of two prompts for Flow-GRPO's recipe
TRACKED = ("clip_fraction", "dppo_mask_fraction", "frozen_fraction", "group_weight", "group_weight_min", "group_weight_max")   # per step


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
    trainer = GRPOTrainer(policy, RednessReward(), PROMPTS, group_size=4, prompts_per_step=PER_STEP, height=64, width=64,
                          num_inference_steps=8, seed=job["seed"], dit_lr=job["lr"], diversity_warning=0.0,
                          **MODES[job["mode"]], **METHODS[job["method"]])
    evaluate = lambda: sum(trainer.evaluate(EVAL_PROMPTS, seed=s)["eval/reward"] for s in EVAL_SEEDS) / len(EVAL_SEEDS)
    seconds, dit_seconds, curve, rows = 0.0, 0.0, [(0, 0.0, 0.0, evaluate())], []
    for step in range(1, job["steps"] + 1):
        t = time.perf_counter()
        res = trainer.step()
        seconds += time.perf_counter() - t
        dit_seconds += sum(res.seconds.get(k, 0.0) for k in DIT_PHASES)
        rows.append({"reward": res.metrics["reward_mean"], "diversity": res.metrics["diversity"], **res.seconds,
                     **{k: v for k, v in res.metrics.items() if k.startswith("dit/") and k.endswith(TRACKED)}})
        if step % job["eval_every"] == 0 or step == job["steps"]: curve.append((step, seconds, dit_seconds, evaluate()))
    return {**job, "curve": curve, "rows": rows, "skipped": trainer.skipped_total}


def final(r, k=2):
    "Final evaluation reward: the mean of the last k evaluations."
    return sum(c[-1] for c in r["curve"][-k:]) / k


def gain_per_dit_second(r):
    "Evaluation reward gained (final minus start) per second of the DiT's own work."
    return (final(r) - r["curve"][0][-1]) / r["curve"][-1][2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="bench/learning_out")
    ap.add_argument("--methods", nargs="+", default=None, help="only these methods (default: all)")
    ap.add_argument("--from-results", action="store_true", help="only redraw the table and figure from DIR/results.json")
    a = ap.parse_args()
    if a.methods:
        unknown = set(a.methods) - set(METHODS)
        if unknown: ap.error(f"unknown methods {sorted(unknown)}; the methods: {', '.join(METHODS)}")
        for k in [k for k in METHODS if k not in a.methods]: del METHODS[k]
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    if a.from_results:
        saved = json.loads((out / "results.json").read_text())
        best = saved["best_lr"]
        a = argparse.Namespace(**{**saved["args"], "out": str(out)})
        table = report(saved["runs"], saved["search"], best, a)
        (out / "table.md").write_text(table); print(table)
        return figure(saved["runs"], out / "learning.png")
    from glm_grpo_nb.tiny import make_tiny_glm_image
    tiny = str(make_tiny_glm_image(Path(tempfile.mkdtemp()) / "tiny"))
    base = dict(tiny=tiny, threads=a.threads, steps=a.steps, eval_every=a.eval_every)
    start = time.perf_counter()
    with mp.get_context("spawn").Pool(a.workers) as pool:
        search = pool.map(run, [dict(base, mode="dit", method=k, lr=lr, seed=a.seeds[0]) for k in METHODS for lr in LRS])
        best = {k: max((r for r in search if r["method"] == k), key=final)["lr"] for k in METHODS}
        rest = pool.map(run, [dict(base, mode=m, method=k, lr=best[k], seed=s) for m in MODES for k in METHODS
                              for s in a.seeds if (m, s) != ("dit", a.seeds[0])])
    runs = [r for r in search if r["lr"] == best[r["method"]]] + rest
    (out / "results.json").write_text(json.dumps({"search": search, "runs": runs, "best_lr": best, "args": vars(a),
                                                 "cpu_count": os.cpu_count()}, indent=1))
    table = report(runs, search, best, a)
    (out / "table.md").write_text(table)
    print(table)
    figure(runs, out / "learning.png")
    print(f"wrote {out / 'results.json'}, {out / 'learning.png'}, {out / 'table.md'} in {time.perf_counter() - start:.0f} s")


def report(runs, search, best, a):
    "A markdown table: per method the searched rates and the chosen one; per mode, method and seed the evaluation reward at"
    " the start and the end, the gain per DiT-second, seconds per step (the DiT's part) and the last step's diversity."
    lines = [f"Tiny GLM-Image, redness, {a.steps} steps of {PER_STEP} prompts x 4 samples, 64x64, 8 denoising steps; DiT learning "
             f"rates searched {', '.join(f'{lr:g}' for lr in LRS)} DiT-only on seed {a.seeds[0]}; evaluation: "
             f"{len(EVAL_PROMPTS)} held-out prompts x {len(EVAL_SEEDS)} seeds, ODE.", "",
             "| mode | method | DiT lr (search: final eval per lr) | seed | eval start | eval final | gain per DiT-second | "
             "s/step (DiT part) | diversity first -> last step |", "|---|---|---|---|---|---|---|---|---|"]
    for m in MODES:
        for k in METHODS:
            found = ", ".join(f"{r['lr']:g}: {final(r):+.3f}" for r in search if r["method"] == k)
            for r in sorted((r for r in runs if (r["mode"], r["method"]) == (m, k)), key=lambda r: r["seed"]):
                steps = len(r["rows"])
                lines.append(f"| {m} | {k} | {best[k]:g} ({found}) | {r['seed']} | {r['curve'][0][-1]:+.3f} | {final(r):+.3f} | "
                             f"{gain_per_dit_second(r):+.4f} | {r['curve'][-1][1] / steps:.2f} ({r['curve'][-1][2] / steps:.2f}) | "
                             f"{r['rows'][0]['diversity']:.3f} -> {r['rows'][-1]['diversity']:.3f} |")
    lines += ["", "Per method (all runs, every step): " + "; ".join(
        f"{k}: " + ", ".join(f"{t} {sum(x[f'dit/{t}'] for r in runs if r['method'] == k for x in r['rows']) / n:.3f}"
                             for t in TRACKED if (n := sum(f'dit/{t}' in x for r in runs if r['method'] == k for x in r['rows'])))
        for k in METHODS if any(f"dit/{t}" in x for r in runs if r["method"] == k for x in r["rows"] for t in TRACKED))]
    lines += ["", "Fastest per DiT-second, per mode and seed: " + "; ".join(
        f"{m} seed {s}: {max((r for r in runs if (r['mode'], r['seed']) == (m, s)), key=gain_per_dit_second)['method']}"
        for m in MODES for s in sorted({r['seed'] for r in runs}))]
    return "\n".join(lines) + "\n"


def figure(runs, path):
    "Per mode: evaluation reward against the DiT's seconds and against steps, and the groups' diversity against steps."
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(MODES), 3, figsize=(16, 3.4 * len(MODES)), squeeze=False)
    for row, m in zip(axes, MODES):
        for i, k in enumerate(METHODS):
            for j, r in enumerate(sorted((r for r in runs if (r["mode"], r["method"]) == (m, k)), key=lambda r: r["seed"])):
                kw = dict(color=f"C{i}", alpha=0.8, label=f"{k} (lr {r['lr']:g})" if j == 0 else None)
                row[0].plot([c[2] for c in r["curve"]], [c[-1] for c in r["curve"]], marker=".", **kw)
                row[1].plot([c[0] for c in r["curve"]], [c[-1] for c in r["curve"]], marker=".", **kw)
                row[2].plot(range(1, len(r["rows"]) + 1), [x["diversity"] for x in r["rows"]], **kw)
        name = "DiT only" if m == "dit" else "joint AR + DiT"
        row[0].set(xlabel="the DiT's own seconds (sampling, decoding, update)", ylabel="held-out redness (ODE)",
                   title=f"{name}: evaluation reward, {len({r['seed'] for r in runs})} seeds")
        row[1].set(xlabel="training step", ylabel="held-out redness (ODE)", title=f"{name}: evaluation reward by step")
        row[2].set(xlabel="training step", ylabel="within-group diversity", title=f"{name}: diversity of the groups")
        for ax in row: ax.title.set_fontsize(10)
        row[0].legend(fontsize=7)
    fig.tight_layout(); fig.savefig(path, dpi=100); plt.close(fig)


if __name__ == "__main__":
    main()
