"""The device check: one prepared command for a machine with one CUDA GPU and a time budget, its parts in order of
priority, one bench process at a time (never two side by side), each part's JSON written to the output folder as soon
as it ends, so that whatever the budget cuts off, what ran is kept.

(a) the step alone on the card: flow_grpo, NF4, 1024x1024, the released depth (40 layers per stack, random weights),
    G = 4 x 2 prompts, 10 denoising steps, 3 steps each with both optimiser steps (`bench.gpu_step`'s setting
    flow_grpo-nf4) -> gpu_step_<card>_alone.json; then a `torch.profiler` table of 20 decode steps of the sampling
    copy and of one DiT forward (batch 8) -> gpu_step_<card>_profile.txt (and the step times as JSON beside it);
(b) learning at the released width: 2 layers per stack, 512x512, the redness reward (a cheap pixel reward), joint
    flow_grpo NF4 and each half alone, up to 20 steps each (fewer if the budget runs short: the count is recorded), an
    evaluation on fixed prompts and seeds before and after, per step the sampler gap, each half's gradient norm, the
    sampler correction's per-image chi^2 and masked fraction (C = 2 for the joint run, 3 for the AR alone), and each
    half's LoRA update size at the end -> learning_released_gpu.json;
(c) `pytest tests/test_gpu.py` and `bench.notebook_cells` on every notebook with a `#| gpu` cell -> gpu_tests.json.

Sized from the measured figures (an H200 step alone 60 s before this fast path; the model built in /dev/shm in 47 s)
so that (a) and (b) fit 9 minutes on an H100; a part that would start with less than its minimum left is recorded as
skipped. --dry runs the same code at the tiny model's size on the CPU, one step each, (c) left out: what a CPU can show
wrong is found before a GPU is lent.

Run from the repository root (on the lent machine through .gpu-kit/run.sh, writing to $OUT):
python -m bench.device_check --budget 540 --out "$OUT"      |      python -m bench.device_check --dry --out DIR"""
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from glm_grpo_nb.cli import ALLOCATOR   # imports no torch

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOCATOR)

LEARN_PROMPTS = ["a red apple on a table", "a sunset over the sea", "a fire truck in the street", "a field of poppies"]
EVAL_PROMPTS = ["a red door", "a bowl of cherries", "a red balloon in the sky", "a brick wall"]
LEARN_RUNS = {"joint": dict(mode="joint", rollout_importance_sampling_mode="sequence_mask",
                            rollout_importance_sampling_threshold=2.0),
              "ar_alone": dict(train_dit=False, rollout_importance_sampling_mode="sequence_mask",
                               rollout_importance_sampling_threshold=3.0),
              "dit_alone": dict(train_ar=False)}
MINIMUM = {"step_alone": 240, "profile": 60, "learning": 90, "gpu_tests": 30}   # seconds a part needs to start


def _arg(name, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def released_model(layers: int | None, dry: bool) -> str:
    "The model folder: the tiny model (dry), or the released architecture with random weights in /dev/shm, built once."
    if dry:
        from glm_grpo_nb.tiny import make_tiny_glm_image
        return str(make_tiny_glm_image(Path(tempfile.mkdtemp()) / "tiny"))
    import torch
    from glm_grpo_nb.hub import folder_kind
    from glm_grpo_nb.tiny import make_random_glm_image
    folder = Path("/dev/shm") / ("glm-image-random" + (f"-{layers}-layers" if layers else ""))
    if folder_kind(folder) != "model":
        make_random_glm_image("cuda", torch.bfloat16, path=folder, layers=layers)
        torch.cuda.empty_cache()
    return str(folder)


def child(args: list[str], timeout: float) -> dict:
    "Run `python -m ...args` alone; its report is the last line of its stdout (or its error, or that it ran out of time)."
    try: proc = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=max(timeout, 1))
    except subprocess.TimeoutExpired as e:
        return {"error": f"stopped after {timeout:.0f} s (the budget)", "stderr": (e.stderr or b"")[-3000:].decode(errors="replace")
                if isinstance(e.stderr, bytes) else (e.stderr or "")[-3000:]}
    lines = proc.stdout.strip().splitlines()
    try: return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"exit status {proc.returncode}", "stderr": proc.stderr[-4000:], "stdout": proc.stdout[-2000:]}


def profile(model: str, dry: bool) -> dict:
    "A child: torch.profiler tables of 20 decode steps of the sampling copy and of one DiT forward (batch 8)."
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile
    from glm_grpo_nb.policy import GlmImagePolicy, sample_seeds
    from glm_grpo_nb.tokens import _pad_left, _repeat_groups
    device = "cpu" if dry else "cuda"
    size = 64 if dry else 1024
    policy = GlmImagePolicy.from_pretrained(model, load_in_4bit=True, ar_lora=16, dit_lora=16, device=device,
                                            torch_dtype=torch.float32 if dry else torch.bfloat16, sampling_copy=True,
                                            verbose=False)
    prompts, G = ["a lighthouse on a cliff at dusk, oil painting", "a bowl of ramen on a wooden table, photo"], 4
    ids, mask, grids, per, _, _ = policy._encode_prompts(prompts, size, size, None)
    ids, mask = _pad_left(ids.repeat_interleave(G, 0), mask.repeat_interleave(G, 0), policy.processor.tokenizer.pad_token_id, 64)
    grids, per = _repeat_groups(grids, per, G)
    seeds = sample_seeds(0, ids.shape[0], "profile")
    decode = lambda: policy.decode_tokens(ids, mask, grids, per, 21, seeds)   # the prompt, then 20 token steps
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    sort = "cuda_time_total" if device == "cuda" else "cpu_time_total"
    out, tables = {}, []
    with torch.no_grad():
        decode(); sync()   # compiled (from the cache the step left) and its CUDA graphs recorded
        t = time.perf_counter(); decode(); sync(); out["decode_21_seconds"] = round(time.perf_counter() - t, 3)
        with torch_profile(activities=activities) as prof: decode(); sync()
        tables.append("== 20 decode steps of the sampling copy (8 sequences, after the prompt) ==\n"
                      + prof.key_averages().table(sort_by=sort, row_limit=30))
        roll = policy.sample_tokens(prompts, G, size, size, seed=0)
        traj = policy.sample_latents(roll, num_steps=2, seed=0)   # the blocks compiled, the tables built
        x, prior = policy.on_device(traj.latents[:, 0]), policy.on_device(roll.prior_token_ids)
        P = int(traj.embed_lengths.max())   # prompts without quotes: one glyph length for all rows
        embeds = policy.on_device(traj.prompt_embeds[:, traj.prompt_embeds.shape[1] - P:])
        forward = lambda: policy._velocity(x, traj.timesteps[0], prior, embeds, None, 1.0, None, size, size)
        forward(); sync()
        t = time.perf_counter(); forward(); sync(); out["dit_forward_seconds"] = round(time.perf_counter() - t, 3)
        with torch_profile(activities=activities) as prof: forward(); sync()
        tables.append("== one DiT forward (batch 8, no guidance) ==\n" + prof.key_averages().table(sort_by=sort, row_limit=30))
    out["table"] = "\n\n".join(tables)
    return out


def learning(model: str, dry: bool, deadline: float) -> dict:
    "A child: joint flow_grpo NF4 and each half alone at the released width, up to 20 steps each, evaluated before and after."
    import torch
    from glm_grpo_nb.policy import GlmImagePolicy
    from glm_grpo_nb.rewards import RednessReward
    from glm_grpo_nb.trainer import GRPOTrainer
    device, size, steps = ("cpu", 64, 1) if dry else ("cuda", 512, 20)
    out = {}
    for k, (name, setting) in enumerate(LEARN_RUNS.items()):
        runs_left = len(LEARN_RUNS) - k
        share = (deadline - time.time()) / runs_left   # each run's part of what is left
        start = time.time()
        policy = GlmImagePolicy.from_pretrained(model, load_in_4bit=True, ar_lora=16, dit_lora=16, device=device,
                                                torch_dtype=torch.float32 if dry else torch.bfloat16, sampling_copy=True,
                                                verbose=False)
        lora = lambda: {n: p.detach().float().clone() for n, p in policy.named_parameters() if p.requires_grad}
        t = GRPOTrainer(policy, RednessReward(), LEARN_PROMPTS, eval_prompts=EVAL_PROMPTS, group_size=4, prompts_per_step=2,
                        height=size, width=size, num_inference_steps=10, lr=1e-4, seed=0, max_consecutive_skips=100,
                        **setting)
        t0 = time.time()
        run = {"before": t.evaluate(seed=7), "steps": []}
        evaluation = time.time() - t0
        first = lora()
        for i in range(steps):
            if i and time.time() + run["steps"][-1]["seconds"] + evaluation > start + share:
                break   # out of this run's share of the budget: fewer steps, recorded
            t0 = time.time()
            m = t.step().metrics
            run["steps"].append({"seconds": round(time.time() - t0, 2), "reward": m.get("reward_mean"),
                                 **{k: m.get(k) for k in ("ar/sampler_gap", "ar/grad_norm", "dit/grad_norm",
                                                          "ar/rollout_chi2_seq", "ar/rollout_chi2_token",
                                                          "ar/is_masked_fraction")}})
        run["after"] = t.evaluate(seed=7)
        last = lora()
        run["lora_update"] = {h: sum((last[n] - first[n]).norm().item() ** 2 for n in first if n.startswith(p)) ** 0.5
                              for h, p in (("ar", "vision_language_encoder."), ("dit", "transformer."))}
        run["steps_done"], run["seconds"] = len(run["steps"]), round(time.time() - start, 1)
        t.close()
        out[name] = run
        del t, policy
        if device == "cuda": torch.cuda.empty_cache()
    return out


def gpu_tests(left: float) -> dict:
    "pytest tests/test_gpu.py, then bench.notebook_cells on every notebook with a `#| gpu` cell."
    t = time.time()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/test_gpu.py"], capture_output=True, text=True,
                       timeout=max(left * 0.6, 1))
    out = {"pytest": {"status": r.returncode, "tail": r.stdout[-2000:]}}
    notebooks = sorted(str(p) for p in Path("nbs").glob("*.ipynb") if "#| gpu" in p.read_text())
    r = subprocess.run([sys.executable, "-m", "bench.notebook_cells", *notebooks], capture_output=True, text=True,
                       timeout=max(left - (time.time() - t), 1))
    out["notebook_cells"] = {"notebooks": notebooks, "status": r.returncode, "tail": r.stdout[-4000:]}
    return out


def main():
    dry = "--dry" in sys.argv
    budget = float(_arg("--budget", 540))
    deadline = time.time() + budget
    out = Path(_arg("--out", os.environ.get("OUT", "bench/results")))
    out.mkdir(parents=True, exist_ok=True)
    import torch
    if not dry and not torch.cuda.is_available(): sys.exit("bench.device_check needs a CUDA GPU (or --dry, on the CPU).")
    card = "cpu_dry" if dry else torch.cuda.get_device_name().split()[-1].lower().replace("-", "_")
    meta = {"device": "cpu (dry)" if dry else torch.cuda.get_device_name(), "torch": torch.__version__, "budget": budget}
    summary = {**meta, "parts": {}}
    def write(name, result, started):
        result = {**meta, **result, "seconds": round(time.time() - started, 1)}
        (out / name).write_text(json.dumps(result, indent=1) + "\n")
        summary["parts"][name] = {"seconds": result["seconds"], "error": result.get("error")}
        (out / "device_check.json").write_text(json.dumps(summary, indent=1) + "\n")
        print(f"{name}: {'error: ' + result['error'] if result.get('error') else 'written'} ({result['seconds']} s)", flush=True)
    def left(): return deadline - time.time()
    def fits(part):
        if left() >= (MINIMUM[part] / (8 if dry else 1)): return True
        summary["parts"][part] = {"skipped": f"{left():.0f} s left, {MINIMUM[part]} s needed"}
        (out / "device_check.json").write_text(json.dumps(summary, indent=1) + "\n")
        return False

    # (a) the step alone, then its profile
    started = time.time()
    model = released_model(None, dry)
    meta["model_seconds"] = round(time.time() - started, 1)
    if fits("step_alone"):
        args = ["bench.gpu_step", "--one", "flow_grpo-nf4", "--model", model, "--size", "64" if dry else "1024",
                "--steps", "1" if dry else "3"] + (["--tiny"] if dry else [])
        write(f"gpu_step_{card}_alone.json", child(args, left() - (0 if dry else MINIMUM["learning"])), started)
    if fits("profile"):
        started = time.time()
        result = child(["bench.device_check", "--profile-child", model] + (["--dry"] if dry else []),
                       left() - (0 if dry else MINIMUM["learning"]))
        if "table" in result: (out / f"gpu_step_{card}_profile.txt").write_text(result.pop("table") + "\n")
        write(f"gpu_step_{card}_profile.json", result, started)
    # (b) learning at the released width, 2 layers per stack
    if fits("learning"):
        started = time.time()
        small = released_model(2, dry)
        reserve = 0 if dry else MINIMUM["gpu_tests"]
        result = child(["bench.device_check", "--learning-child", small, str(deadline - reserve - 20)] + (["--dry"] if dry else []),
                       left() - reserve)
        write("learning_released_gpu.json" if not dry else "learning_released_dry.json", result, started)
    # (c) the GPU tests and the notebooks' #| gpu cells
    if not dry and fits("gpu_tests"):
        started = time.time()
        try: result = gpu_tests(left())
        except subprocess.TimeoutExpired: result = {"error": "stopped at the budget"}
        write("gpu_tests.json", result, started)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    if "--profile-child" in sys.argv or "--learning-child" in sys.argv:
        try:
            if "--profile-child" in sys.argv: result = profile(_arg("--profile-child"), "--dry" in sys.argv)
            else:
                i = sys.argv.index("--learning-child")
                result = learning(sys.argv[i + 1], "--dry" in sys.argv, float(sys.argv[i + 2]))
        except Exception as e:
            result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=8)}
        print(json.dumps(result))
    else: main()
