"""Benchmark: GRPO steps on GLM-Image at its released width, vocabulary, token ids and resolution, on the CPU, with one
and with two layers per stack (AR language model and vision encoder, DiT, glyph encoder): every shape the released
model has except its depth, so what a first GPU run would meet, found here.

Each setting runs in a process of its own: `make_random_glm_image(layers=L, load_in_4bit=...)`, then
`GlmImagePolicy.from_components` with rank-16 LoRA on both halves and the sampling copy on, then one joint GRPO step:
G = 2, one prompt, 4 denoising steps, micro-batches of 1, 1024x1024. The settings: every DiT objective (flow_grpo,
grpo_guard with the moving window, nft, awm, dgpo) x text-to-image and image-to-image (a 1024x1024 source) x NF4 and
bf16 base weights x 1 and 2 layers.

Per setting the report (--out, default bench/results/released_width.json, rewritten after every setting) holds: the
seconds of each phase the trainer times and of the build; the peak resident memory (RSS) of each phase, and its rise
over the phase's start; the first optimiser step's ratio extremes (must be 1 within the dtype's precision) and
`ar/sampler_gap`; the tokens sampled, the grids (target, preview, source); the weight bytes of each component as held.
At the end the two depths are extrapolated to the released depths (40 AR and vision layers, 30 DiT, 12 glyph encoder)
and set beside `memory.plan` for the same setting.

python -m bench.released_width [--layers 1,2] [--only OBJ[,OBJ]] [--modes t2i,i2i] [--dtypes nf4,bf16] [--size 1024]
                               [--out FILE] [--report FILE[,FILE]]   (--report: the tables of finished runs only)
python -m bench.released_width --commands [--size 1024] [--out FILE]   (glm-grpo evaluate and generate, 1 layer)"""
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

OBJECTIVES = ("flow_grpo", "grpo_guard", "flow_dppo", "nft", "awm", "dgpo")
COMPONENTS = {"AR weights": "vision_language_encoder", "DiT weights": "transformer",
              "glyph encoder + VAE weights": ("text_encoder", "vae")}
PLAN_PHASE = {"sample_ar": "sample tokens", "sample_dit": "sample latents", "decode": "decode",
              "update_ar": "update AR", "update_dit": "update DiT"}   # the trainer's phase: the plan's
PEAKS: dict = {}
# glibc returns an allocation of 256 KiB or more to the system when it is freed (not kept for reuse), so the resident
# memory of a phase follows the tensors alive in it, as the GPU allocator's counters do
CHILD_ENV = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(256 * 1024)}


def _arg(name, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def _status(key: str) -> int:
    "A /proc/self/status figure in bytes (VmRSS: resident now, VmHWM: the peak since the last reset)."
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"): return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak():
    "Reset the kernel's resident-memory peak (VmHWM) to what is resident now."
    Path("/proc/self/clear_refs").write_text("5")


@contextlib.contextmanager
def timed_with_rss(seconds: dict, name: str):
    "The trainer's `_timed`, also recording the phase's peak RSS, its rise over the phase's start, and what autograd kept."
    from bench._bench import KeptForBackward
    start_rss = _status("VmRSS")
    _reset_peak()
    start = time.perf_counter()
    try:
        with KeptForBackward() as kept: yield
    finally:
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
        peak = _status("VmHWM")
        old = PEAKS.get(name, (0, 0, 0))
        PEAKS[name] = (max(old[0], peak), max(old[1], peak - start_rss), old[2] + kept.bytes)


def held_bytes(module) -> int:
    "Bytes `module` holds in parameters and buffers, NF4 layers with their quantisation statistics."
    total, seen = 0, set()
    tensors = list(module.parameters()) + list(module.buffers())
    for p in tensors:
        if id(p) in seen: continue
        seen.add(id(p))
        total += p.numel() * p.element_size()
        qs = getattr(p, "quant_state", None)
        if qs is not None:   # absmax (nested: 8-bit + its own absmax and code), the codebook
            for t in (qs.absmax, qs.code, getattr(qs.state2, "absmax", None), getattr(qs.state2, "code", None)):
                if t is not None: total += t.numel() * t.element_size()
    return total


def one_setting(layers: int, dtype: str, objective: str, mode: str, size: int) -> dict:
    "Build the model, run one GRPO step of this setting, return the report (in this process)."
    import torch
    from PIL import Image
    import glm_grpo_nb.trainer as trainer_module
    import glm_grpo_nb.update as update_module
    from glm_grpo_nb.policy import GlmImagePolicy
    from glm_grpo_nb.rewards import RednessReward
    from glm_grpo_nb.tiny import make_random_glm_image
    from glm_grpo_nb.trainer import GRPOTrainer
    torch.manual_seed(0)
    q = dtype == "nf4"
    trainer_module._timed = update_module._timed = timed_with_rss   # sampling and the update
    rss0 = _status("VmRSS")
    _reset_peak()
    t0 = time.perf_counter()
    parts = make_random_glm_image("cpu", layers=layers, load_in_4bit=q)   # bf16 where the CPU has it, else float32
    build = dict(seconds=round(time.perf_counter() - t0, 1), peak_rise_gb=round((_status("VmHWM") - rss0) / 2 ** 30, 3))
    weights = {k: sum(held_bytes(parts[c]) for c in ([v] if isinstance(v, str) else v)) for k, v in COMPONENTS.items()}
    build["held_gb"] = round(sum(weights.values()) / 2 ** 30, 3)
    policy = GlmImagePolicy.from_components(parts, load_in_4bit=q, ar_lora=16, dit_lora=16, device="cpu", sampling_copy=True)
    del parts
    seen = {}
    sample_tokens = policy.sample_tokens
    def recording(*a, **kw):   # what the AR actually wrote
        roll = sample_tokens(*a, **kw)
        seen.update(tokens=roll.completion_mask.sum(1).tolist(), grid=list(roll.grid),
                    preview_grid=list(roll.preview_grid) if roll.preview_grid else None,
                    source_grids=[g.tolist() for g in roll.source_grid_thw] if roll.source_grid_thw else None,
                    prior_tokens=roll.prior_token_ids.shape[1])
        return roll
    policy.sample_tokens = recording
    row = {"prompt": "a poster that says 'GRPO' in bold red letters on a lighthouse at dusk"}
    if mode == "i2i":
        f = Path(tempfile.mkdtemp()) / "source.png"
        Image.linear_gradient("L").convert("RGB").resize((size, size)).save(f)
        row["source"] = [str(f)]
    kw = dict(sde_window_schedule="progressive") if objective == "grpo_guard" else {}
    t = GRPOTrainer(policy, RednessReward(), [row], group_size=2, prompts_per_step=1, height=size, width=size,
                    num_inference_steps=4, micro_batch_size=1, lr=1e-5, max_consecutive_skips=100,
                    dit_objective=objective, seed=0, **kw)
    c = t.config
    PEAKS.clear()
    rss_before = _status("VmRSS")
    start = time.perf_counter()
    res = t.step()
    whole = time.perf_counter() - start
    m = res.metrics
    out = {"layers": layers, "dtype": dtype, "objective": objective, "mode": mode, "size": size, "build": build,
           "weights_gb": {k: round(v / 2 ** 30, 4) for k, v in weights.items()},
           "resident_before_step_gb": round(rss_before / 2 ** 30, 3),
           "config": {"sde_window": list(c.sde_window) if c.sde_window is not None else None,
                      "guidance_scale": c.guidance_scale, "updates_per_batch": c.updates_per_batch,
                      "micro_batch_size": c.micro_batch_size, "decode_batch": c.decode_batch},
           "seconds": {k: round(v, 2) for k, v in res.seconds.items()}, "step_seconds": round(whole, 1),
           "rss_gb": {k: {"peak": round(p / 2 ** 30, 3), "rise": round(r / 2 ** 30, 3)} for k, (p, r, _) in PEAKS.items()},
           # bytes autograd saved for backward in the phase, summed over its forwards (micro-batches, noise levels)
           "kept_for_backward_gb": {k: round(b / 2 ** 30, 4) for k, (_, _, b) in PEAKS.items() if b},
           "ratio": {k: m.get(k) for k in ("ar/first_ratio_min", "ar/first_ratio_max", "dit/first_ratio_min",
                                           "dit/first_ratio_max", "ar/sampler_gap", "ar/dropped_tokens")},
           "produced": seen, "skipped": res.skipped, "skip_reason": t.skip_reason,
           "lowered": {k: v for k, v in m.items() if k.startswith("lowered/")},
           "finite": all(v == v for v in m.values() if isinstance(v, float))}
    t.close()
    return out


def plan_for(s: dict, layers: int | None):
    "`memory.plan` for setting `s` with `layers` per stack (None: the released depths), on the CPU's allowance."
    from glm_grpo_nb.memory import plan, real_modules
    c = s["config"]
    return plan(height=s["size"], width=s["size"], group_size=2, prompts_per_step=1, load_in_4bit=s["dtype"] == "nf4",
                lora_rank=16, micro_batch_size=1, num_inference_steps=4, sde_window=c["sde_window"],
                guidance_scale=c["guidance_scale"], dit_objective=s["objective"], decode_batch=c["decode_batch"],
                sampling_copy=True, source_images=1 if s["mode"] == "i2i" else 0, budget_gb=1e6,
                modules=None if layers is None else real_modules(layers=layers))


FIRST_CALL = {"sample_ar": ["sampling copy (AR language model)", "sampling copy's KV cache"]}   # made by the first call


def plan_rows(s: dict, layers: int | None) -> dict:
    "The plan's GB for the same setting: weights, and per trainer phase what that phase allocates (first-call residents in)."
    from glm_grpo_nb.memory import GB
    p = plan_for(s, layers)
    out = {k: p.resident[k] / GB for k in COMPONENTS}
    for ph, plan_ph in PLAN_PHASE.items():
        extra = sum(sum(p.phases.get(x, {}).values()) for x in (["build sampling copy (first call)"] if ph == "sample_ar" else []))
        out[ph] = (sum(p.phases.get(plan_ph, {}).values()) + extra + sum(p.resident.get(k, 0) for k in FIRST_CALL.get(ph, []))) / GB
    return out


def measured_rows(r: dict) -> dict:
    "The run's GB: weights as held, and each phase's rise of resident memory over its start."
    return {**r["weights_gb"], **{ph: r["rss_gb"][ph]["rise"] for ph in PLAN_PHASE if ph in r["rss_gb"]}}


def extrapolate(runs: list[dict]) -> list[dict]:
    "Per objective, mode and dtype: measured and planned GB at each depth run, and (two depths) at the released depths."
    from glm_grpo_nb.memory import RELEASED_LAYERS
    depth = {**{k: RELEASED_LAYERS["ar"] for k in ("AR weights", "sample_ar", "update_ar")},
             **{k: RELEASED_LAYERS["dit"] for k in ("DiT weights", "sample_dit", "update_dit")},
             "glyph encoder + VAE weights": RELEASED_LAYERS["text_encoder"], "decode": 1}
    rows, by = [], {}
    for r in runs:
        if "error" not in r: by.setdefault((r["objective"], r["mode"], r["dtype"]), {})[r["layers"]] = r
    for (obj, mode, dtype), d in by.items():
        row = {"objective": obj, "mode": mode, "dtype": dtype}
        for L, r in sorted(d.items()):
            m, p = measured_rows(r), plan_rows(r, L)
            row[f"{L} layer(s)"] = {k: [round(m[k], 3), round(p[k], 3)] for k in m}
        if 1 in d and 2 in d:   # a line through the two depths, at each stack's released depth
            m1, m2, full = measured_rows(d[1]), measured_rows(d[2]), plan_rows(d[1], None)
            row["released"] = {k: [round(m1[k] + (m2[k] - m1[k]) * (depth[k] - 1), 2), round(full[k], 2)] for k in m1}
        rows.append(row)
    return rows


def table(report: dict) -> str:
    "The per-setting table in Markdown."
    head = ("| layers | dtype | objective | mode | build s | sample_ar s | sample_dit s | update_ar s | update_dit s | step s "
            "| tokens | grid | AR ratio 1st | DiT ratio 1st | sampler gap | peak RSS GB |")
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for r in report["runs"]:
        if "error" in r:
            lines.append(f"| {r['layers']} | {r['dtype']} | {r['objective']} | {r['mode']} | failed: {r['error'][:80]} |"); continue
        s, ra, p = r["seconds"], r["ratio"], r["produced"]
        fmt = lambda a, b: f"{a:.4f}–{b:.4f}" if a is not None and b is not None else "–"
        lines.append(
            f"| {r['layers']} | {r['dtype']} | {r['objective']} | {r['mode']} | {r['build']['seconds']} "
            f"| {s.get('sample_ar', 0):.1f} | {s.get('sample_dit', 0):.1f} | {s.get('update_ar', 0):.1f} | {s.get('update_dit', 0):.1f} "
            f"| {r['step_seconds']} | {p.get('tokens')} | {p.get('grid')}{' +' + str(p['preview_grid']) if p.get('preview_grid') else ''}"
            f"{' src ' + str(p['source_grids']) if p.get('source_grids') else ''} "
            f"| {fmt(ra['ar/first_ratio_min'], ra['ar/first_ratio_max'])} | {fmt(ra['dit/first_ratio_min'], ra['dit/first_ratio_max'])} "
            f"| {ra['ar/sampler_gap'] if ra['ar/sampler_gap'] is None else round(ra['ar/sampler_gap'], 4)} "
            f"| {max(v['peak'] for v in r['rss_gb'].values()):.2f} |")
    return "\n".join(lines)


def commands(size: int, out: Path) -> dict:
    "Write the 1-layer model (bf16 where the CPU has it natively, else float32) and run `glm-grpo evaluate` and `glm-grpo generate` on it at `size`, as users would."
    import shutil
    from PIL import Image
    from glm_grpo_nb.tiny import make_random_glm_image
    work = Path(tempfile.mkdtemp(prefix="released_width_"))
    t0 = time.perf_counter()
    model = make_random_glm_image("cpu", path=work / "model", layers=1)   # bf16 where the CPU has it, else float32
    report = {"write_model_seconds": round(time.perf_counter() - t0, 1)}
    (work / "prompts.txt").write_text("a sign that says 'OPEN'\n")
    exe = str(Path(sys.executable).parent / "glm-grpo")
    runs = {"evaluate": [exe, "evaluate", "--model", str(model), "--prompts", str(work / "prompts.txt"), "--metrics",
                         "ocr,redness", "--out", str(work / "eval"), "--height", str(size), "--width", str(size),
                         "--num-inference-steps", "4", "--device", "cpu"],
            "generate": [exe, "generate", "--model", str(model), "--prompt", "a sign that says 'OPEN'", "--out",
                         str(work / "sample.png"), "--height", str(size), "--width", str(size),
                         "--num-inference-steps", "4", "--device", "cpu"]}
    for name, cmd in runs.items():
        t1 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=CHILD_ENV)
        report[name] = {"command": " ".join(["glm-grpo"] + cmd[1:]), "exit": proc.returncode,
                        "seconds": round(time.perf_counter() - t1, 1), "stdout_tail": proc.stdout[-600:],
                        "stderr_tail": proc.stderr[-1500:] if proc.returncode else ""}
    images = sorted((work / "eval" / "images").rglob("*.png")) if (work / "eval" / "images").exists() else []
    report["evaluate"]["images"] = [list(Image.open(f).size) for f in images]
    if (work / "eval" / "metrics.json").exists():
        report["evaluate"]["metrics"] = json.loads((work / "eval" / "metrics.json").read_text())
    if (work / "sample.png").exists(): report["generate"]["image"] = list(Image.open(work / "sample.png").size)
    shutil.rmtree(work, ignore_errors=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    return report


def memory_table(rows: list[dict]) -> str:
    "The memory comparison in Markdown: measured and planned GB per component, at each depth run and extrapolated."
    head = "| objective | mode | dtype | component | 1 layer: measured / plan | 2 layers: measured / plan | released depth: extrapolated / plan |"
    lines = [head, "|" + "|".join(["---"] * 7) + "|"]
    cell = lambda row, key, k: " / ".join(f"{v:.2f}" for v in row[key][k]) if key in row and k in row[key] else "–"
    for row in rows:
        for k in next(row[x] for x in ("1 layer(s)", "2 layer(s)") if x in row):
            lines.append(f"| {row['objective']} | {row['mode']} | {row['dtype']} | {k} | {cell(row, '1 layer(s)', k)} "
                         f"| {cell(row, '2 layer(s)', k)} | {cell(row, 'released', k)} |")
    return "\n".join(lines)


def main():
    if "--commands" in sys.argv:   # the evaluation command and generate at the released width, 1 layer per stack
        print(json.dumps(commands(int(_arg("--size", 1024)), Path(_arg("--out", "bench/results/released_width_commands.json"))),
                         indent=1)); return
    if "--report" in sys.argv:
        parts = [json.loads(Path(f).read_text()) for f in _arg("--report").split(",")]
        report = {**parts[0], "runs": [r for p in parts for r in p["runs"]]}
        print(table(report)); print(); print(memory_table(extrapolate(report["runs"]))); return
    layers = [int(x) for x in _arg("--layers", "1,2").split(",")]
    objectives = _arg("--only", ",".join(OBJECTIVES)).split(",")
    modes, dtypes = _arg("--modes", "t2i,i2i").split(","), _arg("--dtypes", "nf4,bf16").split(",")
    unknown = [o for o in objectives if o not in OBJECTIVES] + [m for m in modes if m not in ("t2i", "i2i")] \
        + [d for d in dtypes if d not in ("nf4", "bf16")]
    if unknown: sys.exit(f"bench.released_width: unknown {unknown}; objectives {OBJECTIVES}, modes t2i/i2i, dtypes nf4/bf16.")
    size = int(_arg("--size", 1024))
    import torch
    out = Path(_arg("--out", "bench/results/released_width.json"))
    report = {"device": "cpu", "threads": torch.get_num_threads(), "torch": torch.__version__, "size": size, "runs": []}
    for L in layers:
        for dtype in dtypes:
            for obj in objectives:
                for mode in modes:
                    t1 = time.perf_counter()
                    cmd = [sys.executable, "-m", "bench.released_width", "--one", str(L), dtype, obj, mode, str(size)]
                    proc = subprocess.run(cmd, capture_output=True, text=True, env=CHILD_ENV)
                    try: result = json.loads(proc.stdout.strip().splitlines()[-1])
                    except (IndexError, json.JSONDecodeError):   # the process died (killed for memory): its last words
                        result = {"layers": L, "dtype": dtype, "objective": obj, "mode": mode,
                                  "error": f"exit status {proc.returncode}", "stderr": proc.stderr[-3000:]}
                    result["process_seconds"] = round(time.perf_counter() - t1, 1)
                    report["runs"].append(result)
                    report["extrapolated"] = extrapolate(report["runs"])
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_text(json.dumps(report, indent=1) + "\n")
                    print(f"{L} layer(s) {dtype} {obj} {mode}: {'failed, ' + result['error'] if 'error' in result else 'done'}"
                          f" ({result['process_seconds']} s)", flush=True)
    print(table(report)); print(); print(memory_table(report["extrapolated"]))


if __name__ == "__main__":
    if "--one" in sys.argv:   # a child: one setting, its report as the last line of stdout
        i = sys.argv.index("--one")
        L, dtype, obj, mode, size = sys.argv[i + 1:i + 6]
        try: result = one_setting(int(L), dtype, obj, mode, int(size))
        except Exception as e:   # recorded by the parent; the next setting still runs
            result = {"layers": int(L), "dtype": dtype, "objective": obj, "mode": mode,
                      "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=12)}
        print(json.dumps(result))
    else: main()
