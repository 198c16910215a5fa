"""Benchmark: GRPO steps on GLM-Image at its released size (random weights, built in memory) on one CUDA GPU.

NF4 base weights + rank-16 LoRA on both halves, the sampling copy, 1024x1024, 10 denoising steps, micro-batches of 1:
for Flow-GRPO (window [0, 1], guidance 1.5) and DiffusionNFT (guidance 1.0), two steps with G=8 x 1 prompt and two with
G=4 x 2 prompts; then one image-to-image step with a 1024x1024 source. After every run the report so far is written to
--out (default gpu_step.json) and a line is printed, so a run that fails loses nothing before it; a failed run is
recorded with its error and the next one goes on. The report: per step the seconds of each phase, ms per sampled token,
the peak allocated / reserved memory of each phase next to `memory.plan`'s prediction, and the ratio statistics of
the first inner epoch (AR and DiT) with the sampler-vs-trainer gap, and how many graphs dynamo compiled
(the first step of each run includes compiling the decode step).
Run from the repository root on a machine with CUDA:
python -m bench.gpu_step [--quick] [--model FOLDER_OR_HUB_ID] [--out FILE]
(--model: load with `GlmImagePolicy.from_pretrained`, e.g. zai-org/GLM-Image or a folder written by
`make_random_glm_image(path=...)`; without it the random model is built in memory)."""
import contextlib
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from glm_grpo_nb.cli import ALLOCATOR   # imports no torch

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOCATOR)   # as glm-grpo does, before CUDA starts
import torch
from PIL import Image

import glm_grpo_nb.trainer as trainer_module
from glm_grpo_nb.hub import token_grid
from glm_grpo_nb.memory import GB, plan
from glm_grpo_nb.policy import GlmImagePolicy
from glm_grpo_nb.rewards import RednessReward
from glm_grpo_nb.tiny import make_random_glm_image
from glm_grpo_nb.trainer import GRPOTrainer

PROMPTS = ["a lighthouse on a cliff at dusk, oil painting", "a bowl of ramen on a wooden table, photo",
           "a poster that says 'GRPO' in bold red letters", "a cat astronaut floating above the earth"]
PLAN_PHASE = {"sample_ar": ["sample tokens", "build sampling copy (first call)"], "sample_dit": ["sample latents"],
              "decode": ["decode"], "update_ar": ["update AR"], "update_dit": ["update DiT"]}   # trainer phase: plan's
PEAKS: dict = {}


@contextlib.contextmanager
def timed_with_memory(seconds: dict, name: str):
    "The trainer's `_timed`, also recording the phase's peak allocated and reserved CUDA memory."
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    try: yield
    finally:
        torch.cuda.synchronize()
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
        a, r = torch.cuda.max_memory_allocated() / GB, torch.cuda.max_memory_reserved() / GB
        old = PEAKS.get(name, (0.0, 0.0))
        PEAKS[name] = (max(old[0], a), max(old[1], r))


def run(policy, group_size, prompts_per_step, steps, sources=None, size=1024, objective="flow_grpo"):
    data = [{"prompt": p, **({"source": sources} if sources else {})} for p in PROMPTS]
    guidance, window = (1.5, [0, 1]) if objective == "flow_grpo" else (1.0, None)
    t = GRPOTrainer(policy, RednessReward(), data, group_size=group_size, prompts_per_step=prompts_per_step,
                    height=size, width=size, num_inference_steps=10, sde_window=window, guidance_scale=guidance, micro_batch_size=1,
                    lr=1e-5, max_consecutive_skips=100, dit_objective=objective)
    gh, gw = token_grid(size, size)
    pl = plan(height=size, width=size, group_size=group_size, prompts_per_step=prompts_per_step, load_in_4bit=True,
              lora_rank=16, num_inference_steps=10, sde_window=window, guidance_scale=guidance, micro_batch_size=1,
              dit_objective=objective,
              decode_batch=t.config.decode_batch, sampling_copy=policy.sampling_copy,
              prompt_len=128 + (gh * gw if sources else 0))   # i2i: the source's codes are part of the prompt
    resident = sum(pl.resident.values()) / GB
    out = []
    for _ in range(steps):
        PEAKS.clear()
        res = t.step()
        m, sec = res.metrics, res.seconds
        n_tokens = gh * gw + (0 if sources else 256)   # the large grid, and for t2i the 16x16 preview written first
        out.append({
            "seconds": {k: round(v, 2) for k, v in sec.items()}, "step_seconds": round(sum(sec.values()), 1),
            "ms_per_token": round(1000 * sec["sample_ar"] / n_tokens, 2),
            "memory_gb": {k: {"allocated": round(a, 2), "reserved": round(r, 2),
                              "plan": round(resident + max(sum(pl.phases.get(ph, {}).values()) for ph in PLAN_PHASE[k]) / GB, 2)
                              if k in PLAN_PHASE else None} for k, (a, r) in PEAKS.items()},
            "ratio": {k: m.get(k) for k in ("ar/ratio_min", "ar/ratio_max", "dit/ratio_min", "dit/ratio_max",
                                            "ar/sampler_gap")},
            "skipped": res.skipped})
    t.close()
    return {"plan_peak_gb": round(pl.peak / GB, 2), "steps": out}


def dynamo_counts() -> dict:
    "How many graphs dynamo compiled so far, and its graph breaks (the decode step: one graph, none)."
    from torch._dynamo.utils import counters
    return {"unique_graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values())}


if __name__ == "__main__":
    if not torch.cuda.is_available(): sys.exit("bench.gpu_step needs a CUDA GPU.")
    quick = "--quick" in sys.argv   # 512x512 and one step each: a smoke test of the script
    size = 512 if quick else 1024
    trainer_module._timed = timed_with_memory
    t0 = time.perf_counter()
    model = sys.argv[sys.argv.index("--model") + 1] if "--model" in sys.argv else None   # a folder or hub id
    if model is None:   # the released architecture with random weights, built on the GPU (no disk)
        parts = make_random_glm_image("cuda", torch.bfloat16)
        policy = GlmImagePolicy.from_components(parts, load_in_4bit=True, ar_lora=16, dit_lora=16, device="cuda")
    else:               # what users load: transformers' own NF4 loader for the AR
        policy = GlmImagePolicy.from_pretrained(model, load_in_4bit=True, ar_lora=16, dit_lora=16, device="cuda")
    torch.cuda.synchronize()
    report = {"device": torch.cuda.get_device_name(), "model": model or "random, in memory", "torch": torch.__version__, "build_seconds": round(time.perf_counter() - t0, 1),
              "resident_gb": round(torch.cuda.memory_allocated() / GB, 2), "sampling_copy": policy.sampling_copy, "runs": []}
    copy = policy.sampling_model() if policy.sampling_copy else None
    report["sampling_copy_dtype"] = None if copy is None else str(copy.model.language_model.layers[0].mlp.down_proj.weight.dtype)
    out = Path(sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "gpu_step.json")
    steps = 1 if quick else 2
    source = Path(tempfile.mkdtemp()) / "source.png"
    Image.linear_gradient("L").convert("RGB").resize((size, size)).save(source)
    runs = [dict(objective=o, group_size=g, prompts_per_step=p) for o in ("flow_grpo", "nft") for g, p in ((8, 1), (4, 2))]
    runs.append(dict(objective="flow_grpo", group_size=4, prompts_per_step=1, sources=[str(source)]))
    for r in runs:
        setting = (f"{r['objective']}, G={r['group_size']} x {r['prompts_per_step']} prompts, {size}x{size}"
                   + (", i2i" if r.get("sources") else ""))
        t1 = time.perf_counter()
        try: result = run(policy, steps=1 if r.get("sources") else steps, size=size, **r)
        except Exception as e:   # recorded; the next setting still runs
            result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=8)}
        report["runs"].append({"setting": setting, **result, "seconds": round(time.perf_counter() - t1, 1), "dynamo": dynamo_counts()})
        out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"{setting}: {'failed, ' + result['error'] if 'error' in result else 'done'}, written to {out}", flush=True)
    print(json.dumps(report, indent=1))
