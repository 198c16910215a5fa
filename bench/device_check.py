"""The device check: one prepared command for a machine with one CUDA GPU and a time budget. Its parts run in order of
priority, each in a process of its own (one bench process at a time, never two side by side), and each writes its
figures to the output folder the moment it has them, so a part cut off by the budget keeps every line it wrote:

(a) decode: the released depth (40 layers per stack, random weights), NF4 + LoRA r16, the sampling copy,
    `prompt_bucket` and `row_bucket` set as the trainer sets them; `sample_tokens` twice at training's shapes (2 prompts
    x 4 = 8 rows x 1,280 tokens at 1024²). After the second call -> decode_<card>.json: ms per token step, the
    compile seconds of the first, `cudagraph_skips`, unique graphs, graph breaks, recompile reasons. Then a
    `torch.profiler` table of 20 replays of the already compiled step over the same kept buffers and of one DiT forward
    (batch 8) -> decode_<card>_profile.txt, the seconds added to the JSON;
(b) the step: flow_grpo NF4 at 1024², G = 4 x 2, 10 denoising steps, 2 steps each with both optimiser steps
    (`bench.gpu_step`'s setting flow_grpo-nf4) -> gpu_step_<card>_steps.jsonl, one line per step as it ends (phase
    seconds and peaks, compile seconds, `cudagraph_skips`), and gpu_step_<card>_alone.json when both are done;
(c) learning at the released width: 2 layers per stack, 512², the redness reward, joint flow_grpo NF4 and each half
    alone, up to 20 steps each, eager (it tests learning, not speed: no compile to wait for), evaluated on fixed prompts
    and seeds before and after -> learning_released_<card>.jsonl, a line per step and one per run;
(d) `pytest tests/test_gpu.py` (its output streamed to gpu_tests.txt) and every notebook's `#| gpu` cells ->
    gpu_tests.json.
Every part's stdout and stderr go to <part>.log, dynamo's recompile, CUDA-graph and graph-break logs
(`TORCH_LOGS=recompiles,cudagraphs,graph_breaks`) to torch_logs_<part>.txt, and device_check.json says what each part
did: done, its exit status, stopped at the budget, or skipped (less left than its minimum). The decode part leaves the
step's minimum untouched, so (b) always starts; (c) and (d) run on what (a) and (b) leave (a second call can ask for
them alone with --parts learning,gpu_tests).

On a lent machine, from the repository root, after `bash ../shared/tools/gpu-kit/prepare.sh` here (the kit of our
wheels, carried as .gpu-kit):
bash .gpu-kit/run.sh python -m bench.device_check --budget 420 --out "$OUT"
(420 s: with the machine's start and the kit's install a second try still fits 15 minutes.)
--dry runs the same code at the tiny model's size on the CPU (minimums divided by 8, (d) left out; --dry-steps N makes
(b) take N steps), so what a CPU can show wrong is found before a GPU is lent."""
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

PROMPTS = ["a lighthouse on a cliff at dusk, oil painting", "a bowl of ramen on a wooden table, photo",
           "a poster that says 'GRPO' in bold red letters", "a cat astronaut floating above the earth"]
LEARN_PROMPTS = ["a red apple on a table", "a sunset over the sea", "a fire truck in the street", "a field of poppies"]
EVAL_PROMPTS = ["a red door", "a bowl of cherries", "a red balloon in the sky", "a brick wall"]
LEARN_RUNS = {"joint": dict(mode="joint", rollout_importance_sampling_mode="sequence_mask",
                            rollout_importance_sampling_threshold=2.0),
              "ar_alone": dict(train_dit=False, rollout_importance_sampling_mode="sequence_mask",
                               rollout_importance_sampling_threshold=3.0),
              "dit_alone": dict(train_ar=False)}
PARTS = ("decode", "step", "learning", "gpu_tests")
MINIMUM = {"decode": 90, "step": 150, "learning": 90, "gpu_tests": 30}   # seconds a part needs to start (on a GPU)
PROTECTED = ("step",)   # the parts before it leave its minimum untouched
TORCH_LOGS = "recompiles,cudagraphs,graph_breaks"
GROUP, ROWS = 4, 8   # training's shapes: 2 prompts x 4


def _arg(name, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def _card(dry: bool) -> str:
    import torch
    return "cpu_dry" if dry else torch.cuda.get_device_name().split()[-1].lower().replace("-", "_")


def _write_json(path: Path, data: dict) -> None:
    "Write `data` whole (a temp file renamed into place: a part killed mid-write leaves the last complete version)."
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def _append_line(path: Path, data: dict) -> None:
    with open(path, "a") as f: f.write(json.dumps(data) + "\n")


def released_model(layers: int | None, dry: bool) -> str:
    "The model folder: the tiny model (dry), or the released architecture with random weights in /dev/shm, built once."
    if dry:
        from glm_grpo_nb.tiny import make_tiny_glm_image
        return str(make_tiny_glm_image(Path(tempfile.mkdtemp()) / "tiny"))
    import torch
    from glm_grpo_nb.run_files import folder_kind
    from glm_grpo_nb.tiny import make_random_glm_image
    folder = Path("/dev/shm") / ("glm-image-random" + (f"-{layers}-layers" if layers else ""))
    if folder_kind(folder) != "model":
        make_random_glm_image("cuda", torch.bfloat16, path=folder, layers=layers)
        torch.cuda.empty_cache()
    return str(folder)


def dynamo_figures() -> dict:
    "dynamo's and inductor's counters now: graphs, breaks, CUDA graphs skipped, compile seconds, recompile reasons."
    import torch._dynamo.utils as dynamo_utils   # what a torch version lacks is reported as None, never an error
    counters, spent = dynamo_utils.counters, getattr(dynamo_utils, "calculate_time_spent", None)
    reasons = getattr(dynamo_utils, "guard_failures", None)
    return {"unique_graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values()),
            "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
            "compile_seconds": round(spent().get("entire_frame_compile", 0.0), 2) if spent else None,
            "recompile_reasons": None if reasons is None else [r for rs in reasons.values() for r in map(str, rs)][-20:]}


def _policy(model: str, dry: bool):
    import torch
    from glm_grpo_nb.policy import GlmImagePolicy
    return GlmImagePolicy.from_pretrained(model, load_in_4bit=True, ar_lora=16, dit_lora=16, device="cpu" if dry else "cuda",
                                          torch_dtype=torch.float32 if dry else torch.bfloat16, sampling_copy=True,
                                          verbose=False)


def decode(model: str, dry: bool, out: Path) -> None:
    "(a), in its own process: two training-shaped samplings, their figures written at once, then the profiles."
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile
    from glm_grpo_nb.policy import generators
    card, size = _card(dry), 64 if dry else 1024
    path = out / f"decode_{card}.json"
    policy = _policy(model, dry)
    if not dry: policy.sampling_compile = None   # ours: inductor, CUDA graphs, one fixed-shape graph
    else:   # the CPU: dynamo's capture with the eager backend, the same graph and guards without code generation
        from transformers import CompileConfig
        policy.sampling_compile = CompileConfig(backend="eager", fullgraph=True, dynamic=False)
        policy.sampling_compile._compile_all_devices = True
    policy.prompt_bucket, policy.row_bucket = policy.prompt_length(PROMPTS, size, size), ROWS   # as the trainer sets them
    sync = torch.cuda.synchronize if not dry else (lambda: None)
    report = {"rows": ROWS, "size": size, "prompt_bucket": policy.prompt_bucket}
    t = time.perf_counter()
    roll = policy.sample_tokens(PROMPTS[:2], GROUP, size, size, seed=0); sync()
    report.update(first_call_seconds=round(time.perf_counter() - t, 2), tokens=roll.completion.shape[1] - 1,
                  after_first=dynamo_figures())
    _write_json(path, report)
    t = time.perf_counter()
    policy.sample_tokens(PROMPTS[2:], GROUP, size, size, seed=1); sync()   # other prompts, the same bucket
    second = time.perf_counter() - t
    report.update(second_call_seconds=round(second, 3), ms_per_token_step=round(1000 * second / report["tokens"], 3),
                  after_second=dynamo_figures())
    report["new_graphs_in_second_call"] = report["after_second"]["unique_graphs"] - report["after_first"]["unique_graphs"]
    _write_json(path, report)   # the figures the budget must not lose
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if not dry else [])
    sort = "cpu_time_total" if dry else "cuda_time_total"
    tables = []
    with torch.no_grad():
        # 20 replays of the compiled step over the kept buffers of the second call (its shapes, its graphs)
        (key, state), = [(k, s) for k, s in policy._decode_state.items() if k[0] == ROWS][:1]
        cache, lm = policy._kv[(ROWS, str(policy.device))][0], policy.sampling_model()
        gens = generators(list(range(ROWS)), policy.device)
        prompt = int(state["start"])
        def replay():   # back to just after the prompt (the cache cropped to it, the step index to 1), 20 steps
            cache.crop(prompt - int(cache.get_seq_length())); state["step"].fill_(1)   # a static cache: minus the tokens
            policy._decode_steps(lm, cache, state, gens, 20, 0, False)
        replay(); sync()
        t = time.perf_counter(); replay(); sync(); report["replay_20_steps_seconds"] = round(time.perf_counter() - t, 4)
        with torch_profile(activities=activities) as prof: replay(); sync()
        tables.append(f"== 20 replays of the compiled decode step ({ROWS} rows, cache {key[2]}) ==\n"
                      + prof.key_averages().table(sort_by=sort, row_limit=30))
        report["after_replays"] = dynamo_figures()
        _write_json(path, report)
        traj = policy.sample_latents(roll, num_steps=2, seed=0)   # the DiT's blocks compiled, its tables built
        x, prior = policy.on_device(traj.latents[:, 0]), policy.on_device(roll.prior_token_ids)
        P = int(traj.embed_lengths.max())   # prompts without quotes: one glyph length for all rows
        embeds = policy.on_device(traj.prompt_embeds[:, traj.prompt_embeds.shape[1] - P:])
        forward = lambda: policy._velocity(x, traj.timesteps[0], prior, embeds, None, 1.0, None, size, size)
        forward(); sync()
        t = time.perf_counter(); forward(); sync(); report["dit_forward_seconds"] = round(time.perf_counter() - t, 3)
        with torch_profile(activities=activities) as prof: forward(); sync()
        tables.append(f"== one DiT forward (batch {ROWS}, no guidance) ==\n" + prof.key_averages().table(sort_by=sort, row_limit=30))
    (out / f"decode_{card}_profile.txt").write_text("\n\n".join(tables) + "\n")
    report["done"] = True
    _write_json(path, report)


def learning(model: str, dry: bool, out: Path, deadline: float) -> None:
    "(c), in its own process: joint flow_grpo NF4 and each half alone, eager, a line per step and one per run."
    import torch
    from glm_grpo_nb.rewards import RednessReward
    from glm_grpo_nb.trainer import GRPOTrainer
    size, steps = (64, 1) if dry else (512, 20)
    path = out / f"learning_released_{_card(dry)}.jsonl"
    for k, (name, setting) in enumerate(LEARN_RUNS.items()):
        share = (deadline - time.time()) / (len(LEARN_RUNS) - k)   # each run's part of what is left
        start = time.time()
        policy = _policy(model, dry)
        policy.sampling_compile, policy.dit_compile = False, False   # eager: learning, not speed
        lora = lambda: {n: p.detach().float().clone() for n, p in policy.named_parameters() if p.requires_grad}
        t = GRPOTrainer(policy, RednessReward(), LEARN_PROMPTS, eval_prompts=EVAL_PROMPTS, group_size=GROUP, prompts_per_step=2,
                        height=size, width=size, num_inference_steps=10, lr=1e-4, seed=0, max_consecutive_skips=100,
                        **setting)
        t0 = time.time()
        run = {"run": name, "before": t.evaluate(seed=7)}
        evaluation, first, done, last_seconds = time.time() - t0, lora(), 0, 0.0
        for i in range(steps):
            if i and time.time() + last_seconds + evaluation > start + share:
                break   # out of this run's share of the budget: fewer steps, recorded
            t0 = time.time()
            m = t.step().metrics
            last_seconds, done = time.time() - t0, i + 1
            _append_line(path, {"run": name, "step": i, "seconds": round(last_seconds, 2), "reward": m.get("reward_mean"),
                                **{k: m.get(k) for k in ("ar/sampler_gap", "ar/grad_norm", "dit/grad_norm",
                                                         "ar/rollout_chi2_seq", "ar/rollout_chi2_token",
                                                         "ar/is_masked_fraction")}})
        run["after"] = t.evaluate(seed=7)
        last = lora()
        run["lora_update"] = {h: sum((last[n] - first[n]).norm().item() ** 2 for n in first if n.startswith(p)) ** 0.5
                              for h, p in (("ar", "vision_language_encoder."), ("dit", "transformer."))}
        run["steps_done"], run["seconds"] = done, round(time.time() - start, 1)
        _append_line(path, run)
        t.close()
        del t, policy
        if not dry: torch.cuda.empty_cache()


def gpu_tests(out: Path, deadline: float) -> None:
    "(d), in its own process: pytest tests/test_gpu.py, then bench.notebook_cells on every notebook with a `#| gpu` cell."
    result = {}
    with open(out / "gpu_tests.txt", "w") as log:   # streamed: a cut-off run keeps what pytest printed
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/test_gpu.py"], stdout=log, stderr=subprocess.STDOUT)
    result["pytest"] = {"status": r.returncode, "tail": (out / "gpu_tests.txt").read_text()[-2000:]}
    _write_json(out / "gpu_tests.json", result)
    notebooks = sorted(str(p) for p in Path("nbs").glob("*.ipynb") if "#| gpu" in p.read_text())
    r = subprocess.run([sys.executable, "-m", "bench.notebook_cells", *notebooks], capture_output=True, text=True,
                       timeout=max(deadline - time.time(), 1))
    result["notebook_cells"] = {"notebooks": notebooks, "status": r.returncode, "tail": r.stdout[-4000:]}
    _write_json(out / "gpu_tests.json", result)


def run_part(args: list[str], out: Path, part: str, timeout: float) -> dict:
    "Run `python -m ...args` alone, its output streamed to files in `out`; stopped at `timeout`, it keeps what it wrote."
    env = {**os.environ, "TORCH_LOGS": TORCH_LOGS, "TORCH_LOGS_OUT": str(out / f"torch_logs_{part}.txt")}
    with open(out / f"{part}.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT, env=env)
        try: status = proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            proc.kill(); proc.wait()
            return {"status": f"stopped at the budget after {timeout:.0f} s"}
    if status: return {"status": f"exit status {status}", "log_tail": (out / f"{part}.log").read_text()[-3000:]}
    return {"status": "done"}


def main():
    dry = "--dry" in sys.argv
    budget = float(_arg("--budget", 420))
    deadline = time.time() + budget
    out = Path(_arg("--out", os.environ.get("OUT", "bench/results")))
    out.mkdir(parents=True, exist_ok=True)
    parts = _arg("--parts", ",".join(PARTS)).split(",")
    unknown = [p for p in parts if p not in PARTS]
    if unknown: sys.exit(f"bench.device_check: unknown part(s) {unknown}; the parts: {', '.join(PARTS)}.")
    if dry and "gpu_tests" in parts: parts.remove("gpu_tests")   # nothing to test without CUDA
    import torch
    if not dry and not torch.cuda.is_available(): sys.exit("bench.device_check needs a CUDA GPU (or --dry, on the CPU).")
    card = _card(dry)
    minimum = {p: s / (8 if dry else 1) for p, s in MINIMUM.items()}
    summary = {"device": "cpu (dry)" if dry else torch.cuda.get_device_name(), "torch": torch.__version__,
               "budget": budget, "parts": {}}
    def record(part, result, started):
        summary["parts"][part] = {**result, "seconds": round(time.time() - started, 1)}
        _write_json(out / "device_check.json", summary)
        print(f"{part}: {summary['parts'][part]['status']} ({summary['parts'][part]['seconds']} s)", flush=True)
    started = time.time()
    model = released_model(None, dry) if {"decode", "step"} & set(parts) else None
    summary["model_seconds"] = round(time.time() - started, 1)
    for k, part in enumerate(parts):
        left = deadline - time.time()
        if left < minimum[part]:
            summary["parts"][part] = {"status": f"skipped: {left:.0f} s left, {minimum[part]:.0f} s needed"}
            _write_json(out / "device_check.json", summary)
            continue
        reserve = sum(minimum[p] for p in parts[k + 1:] if p in PROTECTED)
        started = time.time()
        if part == "decode":
            args = ["bench.device_check", "--decode-child", model, str(out)]
        elif part == "step":
            steps = _arg("--dry-steps", "1") if dry else "2"
            args = ["bench.gpu_step", "--one", "flow_grpo-nf4", "--model", model, "--size", "64" if dry else "1024",
                    "--steps", steps, "--lines", str(out / f"gpu_step_{card}_steps.jsonl"),
                    "--report", str(out / f"gpu_step_{card}_alone.json")] + (["--tiny"] if dry else [])
        elif part == "learning":
            small = released_model(2, dry)
            args = ["bench.device_check", "--learning-child", small, str(out), str(deadline - 20)]
        else:
            args = ["bench.device_check", "--tests-child", str(out), str(deadline - 5)]
        record(part, run_part(args + (["--dry"] if dry else []), out, part, left - reserve), started)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    dry = "--dry" in sys.argv
    try:
        if "--decode-child" in sys.argv:
            i = sys.argv.index("--decode-child")
            decode(sys.argv[i + 1], dry, Path(sys.argv[i + 2]))
        elif "--learning-child" in sys.argv:
            i = sys.argv.index("--learning-child")
            learning(sys.argv[i + 1], dry, Path(sys.argv[i + 2]), float(sys.argv[i + 3]))
        elif "--tests-child" in sys.argv:
            i = sys.argv.index("--tests-child")
            gpu_tests(Path(sys.argv[i + 1]), float(sys.argv[i + 2]))
        else: main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
