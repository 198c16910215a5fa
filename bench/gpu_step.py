"""Benchmark: GRPO steps on GLM-Image at its released size (random weights) on one CUDA GPU, every setting in a
process of its own (one CUDA error or out-of-memory cannot spoil the next setting).

The settings, each with rank-16 LoRA on both halves, the sampling copy, 1024x1024, 10 denoising steps, G = 4 x 2 prompts
and the trainer's default micro-batches (all of a step's samples, halved on out-of-memory):
- every DiT objective (flow_grpo, grpo_guard with the moving window, nft, awm, dgpo), each in NF4 and in bf16;
- decoupled mode (flow_grpo, NF4);
- image-to-image from a 1024x1024 source (flow_grpo, NF4, two steps);
- the AR's update corrected for the sampling copy's distribution (flow_grpo, NF4, token_truncate).
Without --model the released architecture with random weights is written once to /dev/shm (about 34 GB; the machine's
RAM) and every setting loads it with `GlmImagePolicy.from_pretrained`, as users load the release.

Per step the report (--out, default gpu_step.json, rewritten after every setting) holds: the seconds of each phase the
trainer times (sample_ar, sample_dit, decode, reward, prepare, update_ar, update_dit, optimizer) and of the whole
`step()`, ms per sampled token, the peak allocated / reserved memory of each phase next to `memory.plan`'s prediction
for the same setting, the first inner epoch's ratio extremes (AR, DiT), `ar/sampler_gap` and the sampler's mismatch (`ar/rollout_*`, the perplexities, `ar/is_*` with the correction), every `lowered/*` (a batch
halved after running out of memory), whether the step was skipped and why; per setting the build seconds, the resident
memory after loading and dynamo's graph counts (the first step includes compiling the decode step); per step also the
seconds dynamo and inductor spent compiling in it, the graphs it added and `cudagraph_skips` (graphs inductor could not
run as CUDA graphs: 0 is the fast path's contract). A child (`--one NAME`) appends each step's report to `--lines FILE`
as the step ends and writes its whole report to `--report FILE` (what `bench.device_check` keeps when the budget ends).
A setting fails, and the exit status is non-zero, when any step is skipped or leaves a non-finite gradient norm; each
step reports the first optimiser step's ratios (`first_ratio_*`), each half's loss, gradient norm and clip fraction, and
a skipped step's account (`skip_reason`, `nonfinite/*`).
Run from the repository root on a machine with CUDA:
python -m bench.gpu_step [--quick] [--model FOLDER_OR_HUB_ID] [--layers N] [--only NAME[,NAME]] [--steps N] [--out FILE]
(--quick: 512x512, one step each, a smoke test; --layers N: the released width with N layers per stack, built in memory
on the GPU, for a quick bisect; --only: settings by name, see SETTINGS; --steps: 3 by default, the first compiles;
--tiny: the tiny model on the CPU at 64x64, a check of this script itself)."""
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from glm_grpo_nb.cli import ALLOCATOR   # imports no torch

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOCATOR)   # as glm-grpo does, before CUDA starts

PROMPTS = ["a lighthouse on a cliff at dusk, oil painting", "a bowl of ramen on a wooden table, photo",
           "a poster that says 'GRPO' in bold red letters", "a cat astronaut floating above the earth"]
PLAN_PHASE = {"sample_ar": ["sample tokens", "build sampling copy (first call)"], "sample_dit": ["sample latents"],
              "decode": ["decode"], "update_ar": ["update AR"], "update_dit": ["update DiT"]}   # trainer phase: plan's
OBJECTIVES = ("flow_grpo", "grpo_guard", "flow_dppo", "nft", "awm", "dgpo")
SETTINGS = {f"{o}-{q}": dict(objective=o, load_in_4bit=q == "nf4") for o in OBJECTIVES for q in ("nf4", "bf16")}
SETTINGS["flow_grpo-nf4-decoupled"] = dict(objective="flow_grpo", load_in_4bit=True, mode="decoupled")
SETTINGS["flow_grpo-nf4-i2i"] = dict(objective="flow_grpo", load_in_4bit=True, i2i=True, steps=2)
SETTINGS["flow_grpo-nf4-is"] = dict(objective="flow_grpo", load_in_4bit=True, rollout_importance_sampling_mode="token_truncate")
PEAKS: dict = {}


def _arg(name, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


@contextlib.contextmanager
def timed_with_memory(seconds: dict, name: str):
    "The trainer's `_timed`, also recording the phase's peak allocated and reserved CUDA memory."
    import torch
    cuda = torch.cuda.is_available()
    if cuda: torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    try: yield
    finally:
        if cuda: torch.cuda.synchronize()
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
        if cuda:
            a, r = torch.cuda.max_memory_allocated() / 2 ** 30, torch.cuda.max_memory_reserved() / 2 ** 30
            old = PEAKS.get(name, (0.0, 0.0))
            PEAKS[name] = (max(old[0], a), max(old[1], r))


HALF_METRICS = ("first_ratio_min", "first_ratio_max", "loss", "grad_norm", "clip_fraction")


def step_failure(step: dict) -> str | None:
    "Why a step's report marks its setting failed: skipped, or a non-finite gradient norm (None: it learned)."
    if step["skipped"]: return f"skipped: {step['skip_reason']}"
    bad = [k for k, v in step["halves"].items() if k.endswith("grad_norm") and not (v is not None and abs(v) < float("inf"))]
    return f"non-finite {', '.join(bad)}" if bad else None


def one_setting(model: str, name: str, size: int, steps: int, tiny: bool, lines: Path | None = None) -> dict:
    """Load the model, run `steps` GRPO steps of setting `name`, return the report (in this process); each step's report
    also appended to `lines` as it ends (JSON lines: a run cut off keeps its finished steps)."""
    import torch
    from bench.device_check import dynamo_figures
    from PIL import Image
    import glm_grpo_nb.trainer as trainer_module
    import glm_grpo_nb.update as update_module
    from glm_grpo_nb.hub import token_grid
    from glm_grpo_nb.memory import GB, plan
    from glm_grpo_nb.policy import GlmImagePolicy
    from glm_grpo_nb.rewards import RednessReward
    from glm_grpo_nb.trainer import GRPOTrainer
    s = SETTINGS[name]
    trainer_module._timed = update_module._timed = timed_with_memory   # sampling and the update
    device = "cpu" if tiny else "cuda"
    t0 = time.perf_counter()
    policy = GlmImagePolicy.from_pretrained(model, load_in_4bit=s["load_in_4bit"], ar_lora=16, dit_lora=16, device=device,
                                            torch_dtype=torch.float32 if tiny else torch.bfloat16, verbose=False)
    if device == "cuda": torch.cuda.synchronize()
    out = {"setting": name, **s, "build_seconds": round(time.perf_counter() - t0, 1),
           "resident_gb": round(torch.cuda.memory_allocated() / GB, 2) if device == "cuda" else None,
           "sampling_copy": policy.sampling_copy}
    sources = None
    if s.get("i2i"):
        f = Path(tempfile.mkdtemp()) / "source.png"
        Image.linear_gradient("L").convert("RGB").resize((size, size)).save(f)
        sources = [str(f)]
    data = [{"prompt": p, **({"source": sources} if sources else {})} for p in PROMPTS]
    kw = dict(sde_window_schedule="progressive") if s["objective"] == "grpo_guard" else {}
    t = GRPOTrainer(policy, RednessReward(), data, group_size=4, prompts_per_step=2, height=size, width=size,
                    num_inference_steps=10, lr=1e-5, max_consecutive_skips=100, dit_objective=s["objective"],
                    mode=s.get("mode", "joint"), rollout_importance_sampling_mode=s.get("rollout_importance_sampling_mode"), **kw)
    c = t.config
    gh, gw = token_grid(size, size)
    pl = plan(height=size, width=size, group_size=4, prompts_per_step=2, load_in_4bit=s["load_in_4bit"], lora_rank=16,
              num_inference_steps=10, sde_window=c.sde_window, guidance_scale=c.guidance_scale,
              micro_batch_size=c.micro_batch_size, updates_per_batch=c.updates_per_batch, dit_objective=s["objective"], decode_batch=c.decode_batch,
              sampling_copy=policy.sampling_copy, source_images=1 if sources else 0)
    resident = sum(pl.resident.values()) / GB
    out.update(plan_peak_gb=round(pl.peak / GB, 2), steps=[])
    for i in range(s.get("steps", steps)):
        PEAKS.clear()
        before, optimizer_steps = dynamo_figures(), t.optimizer_steps
        start = time.perf_counter()
        res = t.step()
        whole = time.perf_counter() - start
        after = dynamo_figures()
        m, sec = res.metrics, res.seconds
        n_tokens = gh * gw + (0 if sources else 256)   # the large grid, and for t2i the 16x16 preview written first
        out["steps"].append({
            "seconds": {k: round(v, 2) for k, v in sec.items()}, "step_seconds": round(whole, 1),
            "untimed_seconds": round(whole - sum(sec.values()), 2),   # what no phase covers (snapshot, logging)
            "ms_per_token": round(1000 * sec.get("sample_ar", 0.0) / n_tokens, 2),
            "memory_gb": {k: {"allocated": round(a, 2), "reserved": round(r, 2),
                              "plan": round(resident + max(sum(pl.phases.get(ph, {}).values()) for ph in PLAN_PHASE[k]) / GB, 2)
                              if k in PLAN_PHASE else None} for k, (a, r) in PEAKS.items()},
            "ratio": {k: m.get(k) for k in ("ar/ratio_min", "ar/ratio_max", "dit/ratio_min", "dit/ratio_max",
                                            "ar/sampler_gap")},
            "mismatch": {k: v for k, v in m.items() if k.startswith(("ar/rollout_", "ar/is_")) or k.endswith("_ppl")},
            "halves": {f"{h}/{k}": m.get(f"{h}/{k}") for h in ("ar", "dit") for k in HALF_METRICS},
            "nonfinite": {k: v for k, v in m.items() if k.startswith("nonfinite/")},
            "lowered": {k: v for k, v in m.items() if k.startswith("lowered/")},
            "skipped": res.skipped, "skip_reason": res.skip_reason,
            "optimizer_steps": t.optimizer_steps - optimizer_steps,   # the recipe's two, where both ran
            "compile_seconds": None if after["compile_seconds"] is None else
                               round(after["compile_seconds"] - before["compile_seconds"], 2),   # dynamo and inductor
            "new_graphs": after["unique_graphs"] - before["unique_graphs"], "graph_breaks": after["graph_breaks"],
            "cudagraph_skips": after["cudagraph_skips"]})
        out["steps"][-1]["failure"] = step_failure(out["steps"][-1])
        if lines is not None:
            with open(lines, "a") as f: f.write(json.dumps({"setting": name, "step": i, **out["steps"][-1]}) + "\n")
    t.close()
    from torch._dynamo.utils import counters
    out["dynamo"] = {"unique_graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values()),
                     "cudagraph_skips": counters["inductor"]["cudagraph_skips"]}
    return out


def main():
    quick, tiny = "--quick" in sys.argv, "--tiny" in sys.argv
    size = 64 if tiny else 512 if quick else 1024
    steps = int(_arg("--steps", 1 if quick or tiny else 3))
    layers = int(_arg("--layers")) if "--layers" in sys.argv else None
    names = _arg("--only", ",".join(SETTINGS)).split(",")
    unknown = [n for n in names if n not in SETTINGS]
    if unknown: sys.exit(f"bench.gpu_step: unknown setting(s) {unknown}; the settings: {', '.join(SETTINGS)}.")
    import torch
    if not tiny and not torch.cuda.is_available(): sys.exit("bench.gpu_step needs a CUDA GPU (or --tiny, on the CPU).")
    model, t0 = _arg("--model"), time.perf_counter()
    report = {"device": "cpu (tiny)" if tiny else torch.cuda.get_device_name(), "torch": torch.__version__,
              "model": model or ("tiny" if tiny else "random, released architecture"
                                 + (f", {layers} layer(s) per stack" if layers else "")), "size": size, "runs": []}
    if model is None:
        if tiny:
            from glm_grpo_nb.tiny import make_tiny_glm_image
            model = str(make_tiny_glm_image(Path(tempfile.mkdtemp()) / "tiny"))
        else:   # built on the GPU in bf16, written once; each setting reads it back
            from glm_grpo_nb.tiny import make_random_glm_image
            folder = Path("/dev/shm") / ("glm-image-random" + (f"-{layers}-layers" if layers else ""))
            model = str(make_random_glm_image("cuda", torch.bfloat16, path=folder, layers=layers))
            torch.cuda.empty_cache()
        report["model_seconds"] = round(time.perf_counter() - t0, 1)
    out = Path(_arg("--out", "gpu_step.json"))
    for name in names:
        t1 = time.perf_counter()
        cmd = [sys.executable, "-m", "bench.gpu_step", "--one", name, "--model", model, "--size", str(size), "--steps", str(steps)]
        proc = subprocess.run(cmd + (["--tiny"] if tiny else []), capture_output=True, text=True)
        lines = proc.stdout.strip().splitlines()
        try: result = json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):   # the process died (a CUDA error, killed): its last words
            result = {"setting": name, "error": f"exit status {proc.returncode}", "stderr": proc.stderr[-4000:]}
        failures = [result["error"]] if "error" in result else [f"step {i}: {st['failure']}"
                                                                for i, st in enumerate(result["steps"]) if st["failure"]]
        report["runs"].append({**result, "failures": failures, "seconds": round(time.perf_counter() - t1, 1)})
        out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"{name}: {'FAILED, ' + '; '.join(failures) if failures else 'done'} "
              f"({report['runs'][-1]['seconds']} s), written to {out}", flush=True)
        for i, st in enumerate(result.get("steps", [])):   # peak allocated GB, measured / planned, phase by phase
            print(f"  step {i}: {st['step_seconds']} s; " + ", ".join(
                f"{k} {v['allocated']}/{v['plan']}" for k, v in st["memory_gb"].items() if v["plan"] is not None), flush=True)
    print(json.dumps(report, indent=1))
    failed = [r["setting"] for r in report["runs"] if r["failures"]]
    if failed: sys.exit(f"bench.gpu_step: {len(failed)} setting(s) failed: {', '.join(failed)} (see {out}).")


if __name__ == "__main__":
    if "--one" in sys.argv:   # a child: one setting, its report as the last line of stdout
        name = _arg("--one")
        lines = Path(_arg("--lines")) if "--lines" in sys.argv else None
        try: result = one_setting(_arg("--model"), name, int(_arg("--size")), int(_arg("--steps")), "--tiny" in sys.argv, lines)
        except Exception as e:   # recorded by the parent; the next setting still runs
            result = {"setting": name, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=8)}
        if "--report" in sys.argv: Path(_arg("--report")).write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result))
        if "error" in result: sys.exit(1)   # a crashed setting is a failed child, never a "done" one
    else: main()
