"""The device check: one prepared command for a machine with one CUDA GPU and a time budget. Its parts run in order of
priority, each in a process of its own (one bench process at a time, never two side by side), and each writes its
figures to the output folder the moment it has them, so a part cut off by the budget keeps every line it wrote:

(a) decode: the released depth (40 layers per stack, random weights), NF4 + LoRA r16, the sampling copy,
    `prompt_bucket` and `row_bucket` set as the trainer sets them; `sample_tokens` twice at training's shapes (2 prompts
    x 4 = 8 rows x 1,280 tokens at 1024²) -> decode_<card>.json after each call: ms per token step (the second call),
    compile seconds (dynamo's frames and the backward's), `cudagraph_skips`, graphs, breaks, recompile reasons;
(b) the step: flow_grpo NF4 at 1024², G = 4 x 2, 10 denoising steps, 2 steps, each with both optimiser steps
    (`bench.gpu_step`'s setting flow_grpo-nf4) -> gpu_step_<card>_steps.jsonl, one line per step as it ends;
(c) profile: 20 replays of the compiled decode step, then one DiT forward at batch 8 (the DiT's blocks compiled first)
    -> decode_<card>_profile.txt, each table written the moment it is built;
(d) learning at the released width: 2 layers per stack, 512², the redness reward, joint flow_grpo NF4 and each half
    alone, up to 20 steps each, eager -> learning_released_<card>.jsonl, a line per step and one per run;
(e) gpu_tests: `pytest tests/test_gpu.py` in a process group of its own (killed whole at the deadline), then the `#| gpu`
    cells of the notebooks that run offline on random weights (OFFLINE_NOTEBOOKS) -> gpu_tests.json.

What comes back: the device tool returns at most 8 files, two folders deep; `.gpu-kit/run.sh` writes env.txt, and this
writes at most 7: device_check.json (what each part did: done, failed with its exit status and error, stopped at the
budget, skipped; rewritten after every part), the five files above, and logs.tar.gz (each part's output and dynamo's
recompile, CUDA-graph and graph-break logs, `TORCH_LOGS=recompiles,cudagraphs,graph_breaks`; rewritten after every
part). The figures that matter also end stdout, so the tool's output tail alone holds them: ms per token step, each
step's seconds and phases, the first step's extra, compile seconds, `cudagraph_skips`, each part's status.

Budget and order, in seconds on the card (recorded on an H200, 2026-11-26: the 40-layer random model built in 47-60 s,
the first decode call 98 s with compile and 28 s after, the step's load 19 s, the first step 158 s and the next 85 s):
the default --budget is 570 s, the 600 s the device tool lets a command run less 30 s for the kit's install (its
wheels unpacked: about 15 s) and the interpreter's start before this script's clock starts. A part starts only if what is left covers its minimum and the
minimums of the protected parts after it (the step; the tests too when --parts names them), and runs until what is left less those reserves (and 5 s to kill
it and write its record): so (a) never takes the time (b) needs, and (b) can always write its first step line. At 1x the
recorded timeline returns the decode figures and both step lines, and the profile after them; at 1.5x the decode
figures and the first step line.

A second call, only as a device session's time allows (a start is a minute or more, the machine goes back 30 s after a
call, none starts with under 4 minutes left, and 15 minutes are all a session has): the first call ends at most about
60 + 600 = 660 s into the session (its start and its command), which leaves 240 s -- no second call, unless the first ended early. Made at once
(within 30 s, on the still warm machine), with T seconds of the session left: `--parts profile,learning,gpu_tests
--budget` T - 30 (the kit's install again) - 30 (a margin), and only when that budget is at least 90 s; after the
machine went back, only when T - 60 (a new start) is still 4 minutes or more.

On a lent machine, from the repository root, after `bash ../shared/tools/gpu-kit/prepare.sh` here (the kit of our
wheels, carried as .gpu-kit):
bash .gpu-kit/run.sh python -m bench.device_check --out "$OUT"
--dry runs the same code at the tiny model's size on the CPU ((e) left out; --dry-steps N makes (b) take N steps).
--dry --timeline FILE [--speed 10] runs the real scheduler, children, timeouts, kills, writes and records, but each
phase's work is a wait of the card seconds FILE gives it (a JSON object: build, decode_first, decode_second, profile,
step_load, step_first, step, learning_step, tests; "crash" makes the phase raise), --speed times faster; the figures
written are those seconds, marked simulated. Budget, minimums and timeouts are then on that clock."""
import json
import os
import signal
import subprocess
import sys
import tarfile
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
PARTS = ("decode", "step", "profile", "learning", "gpu_tests")
# seconds on the card a part needs to start: decode both calls (98 + 28), the step's load and first step (19 + 158)
MINIMUM = {"decode": 140, "step": 200, "profile": 60, "learning": 60, "gpu_tests": 60}
PROTECTED = ("step",)   # the parts before it leave its minimum untouched
KILL = 5                # seconds kept beside a reserve: stopping a part and writing its record
BUDGET = 570            # the device tool's 600 s per command, less the kit's install (about 15 s) and the interpreter's start
TORCH_LOGS = "recompiles,cudagraphs,graph_breaks"
GROUP, ROWS, STEPS = 4, 8, 2   # training's shapes: 2 prompts x 4; the step part's steps
TOKENS = 1280   # a 1024² image's token steps (the large grid and the preview)
# the notebooks whose `#| gpu` cells run offline on random or tiny weights (the others need released weights or a Hub
# push: 02cc_local_judge, 02d_served, 02f_geneval, 02g_preference_rewards, 04j_pairs, 06c_card, 07a_sft, 07b_dpo_trainer,
# 08b_evaluation and the tutorials 10-13)
OFFLINE_NOTEBOOKS = ("nbs/01a_tokens.ipynb", "nbs/01b_flow.ipynb", "nbs/01f_decode_loop.ipynb", "nbs/05a_tiny.ipynb")
TIMELINE = ("build", "decode_first", "decode_second", "profile", "step_load", "step_first", "step", "learning_step", "tests")


def _arg(name, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def _card(dry: bool) -> str:
    if dry: return "cpu_dry"
    import torch
    return torch.cuda.get_device_name().split()[-1].lower().replace("-", "_")


def _write_json(path: Path, data: dict) -> None:
    "Write `data` whole (a temp file renamed into place: a part killed mid-write leaves the last complete version)."
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def _append_line(path: Path, data: dict) -> None:
    with open(path, "a") as f: f.write(json.dumps(data) + "\n")


class Clock:
    "Seconds on the card since the start: real seconds, or (simulated) real seconds times `speed`."
    def __init__(self, speed: float = 1.0): self.speed, self.t0 = speed, time.monotonic()
    def now(self) -> float: return (time.monotonic() - self.t0) * self.speed
    def real(self, card_seconds: float) -> float: return card_seconds / self.speed


class Simulated:
    "A child's phases as waits of the timeline's card seconds (`speed` times faster); 'crash' raises."
    def __init__(self, timeline: dict, speed: float): self.timeline, self.speed = timeline, speed
    def wait(self, phase: str) -> float:
        v = self.timeline[phase]
        if v == "crash": raise RuntimeError(f"simulated crash in {phase}")
        time.sleep(float(v) / self.speed)
        return float(v)


def read_timeline(path: str | None) -> dict | None:
    "The timeline FILE: every phase's card seconds (a number, or 'crash'); a missing or unknown phase refused."
    if path is None: return None
    t = json.loads(Path(path).read_text())
    missing, unknown = [p for p in TIMELINE if p not in t], [p for p in t if p not in TIMELINE]
    bad = [p for p, v in t.items() if v != "crash" and not (isinstance(v, (int, float)) and v >= 0)]
    if missing or unknown or bad:
        sys.exit(f"bench.device_check: the timeline {path} must give each of {', '.join(TIMELINE)} a number of seconds "
                 f"(or 'crash'); missing {missing}, unknown {unknown}, not seconds {bad}.")
    return t


def released_model(layers: int | None, dry: bool, sim: Simulated | None = None) -> str:
    "The model folder: the tiny model (dry), or the released architecture with random weights in /dev/shm, built once."
    if sim is not None:
        sim.wait("build")
        return "simulated"
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
    times = spent() if spent else {}
    # the forward's frames and the backward (compiled lazily at the first backward): None where torch keeps neither
    parts = [times[k] for k in ("entire_frame_compile", "entire_backward_compile") if k in times]
    return {"unique_graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values()),
            "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
            "compile_seconds": round(sum(parts), 2) if parts else None,
            "recompile_reasons": None if reasons is None else [r for rs in reasons.values() for r in map(str, rs)][-20:]}


def _policy(model: str, dry: bool):
    import torch
    from glm_grpo_nb.policy import GlmImagePolicy
    return GlmImagePolicy.from_pretrained(model, load_in_4bit=True, ar_lora=16, dit_lora=16, device="cpu" if dry else "cuda",
                                          torch_dtype=torch.float32 if dry else torch.bfloat16, sampling_copy=True,
                                          verbose=False)


def _decode_policy(model: str, dry: bool):
    "The policy as the trainer sets it for decoding, compiled (inductor on a GPU; dynamo's eager capture on the CPU)."
    policy = _policy(model, dry)
    if not dry: policy.sampling_compile = None   # ours: inductor, CUDA graphs, one fixed-shape graph
    else:   # the CPU: dynamo's capture with the eager backend, the same graph and guards without code generation
        from transformers import CompileConfig
        policy.sampling_compile = CompileConfig(backend="eager", fullgraph=True, dynamic=False)
        policy.sampling_compile._compile_all_devices = True
    size = 64 if dry else 1024
    policy.prompt_bucket, policy.row_bucket = policy.prompt_length(PROMPTS, size, size), ROWS   # as the trainer sets them
    return policy, size


def decode(model: str, dry: bool, out: Path, sim: Simulated | None = None) -> None:
    "(a), in its own process: two training-shaped samplings, the figures written after each."
    path = out / f"decode_{_card(dry)}.json"
    if sim is not None:
        skips = {"unique_graphs": 1, "graph_breaks": 0, "cudagraph_skips": 0, "compile_seconds": None, "recompile_reasons": []}
        report = {"simulated": True, "rows": ROWS, "size": 1024, "tokens": TOKENS}
        report.update(first_call_seconds=sim.wait("decode_first"), after_first=skips)
        _write_json(path, report)
        second = sim.wait("decode_second")
        report.update(second_call_seconds=second, ms_per_token_step=round(1000 * second / TOKENS, 3), after_second=skips,
                      new_graphs_in_second_call=0, done=True)
        _write_json(path, report)
        return
    import torch
    policy, size = _decode_policy(model, dry)
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
    report["done"] = True
    _write_json(path, report)   # the figures the budget must not lose


def profile(model: str, dry: bool, out: Path, sim: Simulated | None = None) -> None:
    "(c), in its own process: the compiled decode step replayed 20 times, then one DiT forward, each table written at once."
    path = out / f"decode_{_card(dry)}_profile.txt"
    if sim is not None:
        sim.wait("profile")
        path.write_text("== simulated: no profile ==\n")
        return
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile
    from glm_grpo_nb.policy import generators
    policy, size = _decode_policy(model, dry)
    sync = torch.cuda.synchronize if not dry else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if not dry else [])
    sort = "cpu_time_total" if dry else "cuda_time_total"
    roll = policy.sample_tokens(PROMPTS[:2], GROUP, size, size, seed=0); sync()   # compiles (warm from (a)'s cache)
    tables, figures = [], {}
    def write():
        path.write_text("\n\n".join(tables) + "\n\n" + json.dumps(figures) + "\n")
    with torch.no_grad():
        # 20 replays of the compiled step over the kept buffers of that call (its shapes, its graphs)
        (key, state), = [(k, s) for k, s in policy._decode_state.items() if k[0] == ROWS][:1]
        cache, lm = policy._kv[(ROWS, str(policy.device))][0], policy.sampling_model()
        gens = generators(list(range(ROWS)), policy.device)
        prompt = int(state["start"])
        def replay():   # back to just after the prompt (the cache cropped to it, the step index to 1), 20 steps
            cache.crop(prompt - int(cache.get_seq_length())); state["step"].fill_(1)   # a static cache: minus the tokens
            policy._decode_steps(lm, cache, state, gens, 20, 0, False)
        replay(); sync()
        t = time.perf_counter(); replay(); sync(); figures["replay_20_steps_seconds"] = round(time.perf_counter() - t, 4)
        with torch_profile(activities=activities) as prof: replay(); sync()
        tables.append(f"== 20 replays of the compiled decode step ({ROWS} rows, cache {key[2]}) ==\n"
                      + prof.key_averages().table(sort_by=sort, row_limit=30))
        figures["after_replays"] = dynamo_figures()
        write()   # the decode table kept, whatever the DiT's compile costs
        traj = policy.sample_latents(roll, num_steps=2, seed=0)   # the DiT's blocks compiled, its tables built
        x, prior = policy.on_device(traj.latents[:, 0]), policy.on_device(roll.prior_token_ids)
        P = int(traj.embed_lengths.max())   # prompts without quotes: one glyph length for all rows
        embeds = policy.on_device(traj.prompt_embeds[:, traj.prompt_embeds.shape[1] - P:])
        forward = lambda: policy._velocity(x, traj.timesteps[0], prior, embeds, None, 1.0, None, size, size)
        forward(); sync()
        t = time.perf_counter(); forward(); sync(); figures["dit_forward_seconds"] = round(time.perf_counter() - t, 3)
        with torch_profile(activities=activities) as prof: forward(); sync()
        tables.append(f"== one DiT forward (batch {ROWS}, no guidance) ==\n" + prof.key_averages().table(sort_by=sort, row_limit=30))
        write()


def step(model: str, dry: bool, out: Path, steps: int, sim: Simulated | None = None) -> None:
    "(b), simulated (the real one is `bench.gpu_step --one`): the load, then a line per step as it ends."
    path = out / f"gpu_step_{_card(dry)}_steps.jsonl"
    sim.wait("step_load")
    for i in range(steps):
        seconds = sim.wait("step_first" if i == 0 else "step")
        _append_line(path, {"setting": "flow_grpo-nf4", "step": i, "simulated": True, "step_seconds": seconds,
                            "seconds": {"simulated": seconds}, "optimizer_steps": 2, "failure": None, "skipped": False,
                            "compile_seconds": None, "cudagraph_skips": 0, "new_graphs": 0})


def learning(model: str, dry: bool, out: Path, deadline: float, sim: Simulated | None = None) -> None:
    "(d), in its own process: joint flow_grpo NF4 and each half alone, eager, a line per step and one per run."
    size, steps = (64, 1) if dry else (512, 20)
    path = out / f"learning_released_{_card(dry)}.jsonl"
    if sim is not None:
        for name in LEARN_RUNS:
            seconds = sim.wait("learning_step")
            _append_line(path, {"run": name, "step": 0, "simulated": True, "seconds": seconds})
        return
    import torch
    from glm_grpo_nb.rewards import RednessReward
    from glm_grpo_nb.trainer import GRPOTrainer
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


def _group_run(cmd: list[str], log, timeout: float) -> int | str:
    "Run `cmd` in a process group of its own; at `timeout` the whole group is killed (pytest and what it started)."
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try: return proc.wait(timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL); proc.wait()
        return f"killed at the deadline after {timeout:.0f} s"


def gpu_tests(out: Path, logs: Path, deadline: float, sim: Simulated | None = None) -> None:
    "(e), in its own process: pytest tests/test_gpu.py, then the offline notebooks' `#| gpu` cells, each bounded by the deadline."
    result = {}
    if sim is not None:
        result["pytest"] = {"status": 0, "simulated": sim.wait("tests")}
        _write_json(out / "gpu_tests.json", result)
        return
    with open(logs / "gpu_tests.txt", "w") as log:   # streamed: a cut-off run keeps what pytest printed
        status = _group_run([sys.executable, "-m", "pytest", "-q", "tests/test_gpu.py"], log, deadline - time.time())
    result["pytest"] = {"status": status, "tail": (logs / "gpu_tests.txt").read_text()[-2000:]}
    _write_json(out / "gpu_tests.json", result)
    with open(logs / "gpu_notebooks.txt", "w") as log:
        status = _group_run([sys.executable, "-m", "bench.notebook_cells", *OFFLINE_NOTEBOOKS], log, deadline - time.time())
    result["notebook_cells"] = {"notebooks": list(OFFLINE_NOTEBOOKS), "status": status,
                                "tail": (logs / "gpu_notebooks.txt").read_text()[-4000:]}
    _write_json(out / "gpu_tests.json", result)


def run_part(args: list[str], logs: Path, part: str, timeout: float) -> dict:
    "Run `python -m ...args` alone (its own process group), its output streamed to `logs`; stopped at `timeout` (real seconds)."
    env = {**os.environ, "TORCH_LOGS": TORCH_LOGS, "TORCH_LOGS_OUT": str(logs / f"torch_logs_{part}.txt")}
    with open(logs / f"{part}.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try: status = proc.wait(timeout=max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL); proc.wait()
            return {"status": "stopped at the budget"}
    if status:
        tail = (logs / f"{part}.log").read_text()[-3000:]
        error = next((l for l in reversed(tail.splitlines()) if "Error" in l or "error" in l), tail.splitlines()[-1] if tail else "")
        return {"status": f"failed: exit status {status}", "error": error, "log_tail": tail}
    return {"status": "done"}


def _archive(logs: Path, out: Path) -> None:
    "Every log so far in one file (the tool returns at most 8): logs.tar.gz, replaced whole."
    tmp = out / "logs.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for f in sorted(logs.iterdir()): tar.add(f, arcname=f.name)
    tmp.replace(out / "logs.tar.gz")


def figures(out: Path, card: str, summary: dict) -> list[str]:
    "The lines that end stdout: what each part measured and did, from the files it wrote."
    lines = []
    d = out / f"decode_{card}.json"
    if d.exists():
        dec = json.loads(d.read_text())
        last = dec.get("after_second") or dec.get("after_first") or {}
        lines.append(f"FIGURE decode: ms per token step {dec.get('ms_per_token_step')}, first call {dec.get('first_call_seconds')} s, "
                     f"second {dec.get('second_call_seconds')} s, compile seconds {last.get('compile_seconds')}, "
                     f"cudagraph_skips {last.get('cudagraph_skips')}, graphs {last.get('unique_graphs')}, "
                     f"breaks {last.get('graph_breaks')}" + (" (simulated)" if dec.get("simulated") else ""))
    s = out / f"gpu_step_{card}_steps.jsonl"
    steps = [json.loads(l) for l in s.read_text().splitlines()] if s.exists() else []
    for st in steps:
        phases = ", ".join(f"{k} {v}" for k, v in st["seconds"].items())
        lines.append(f"FIGURE step {st['step']}: {st['step_seconds']} s ({phases}), optimiser steps {st.get('optimizer_steps')}, "
                     f"compile seconds {st.get('compile_seconds')}, cudagraph_skips {st.get('cudagraph_skips')}, "
                     f"failure {st.get('failure')}" + (" (simulated)" if st.get("simulated") else ""))
    if len(steps) >= 2:
        lines.append(f"FIGURE first step's extra: {round(steps[0]['step_seconds'] - steps[1]['step_seconds'], 1)} s")
    for part, r in summary["parts"].items():
        lines.append(f"PART {part}: {r['status']}" + (f" ({r['seconds']} s)" if "seconds" in r else "")
                     + (f"; {r['error']}" if r.get("error") else ""))
    return lines


def main():
    dry = "--dry" in sys.argv
    timeline = read_timeline(_arg("--timeline"))
    if timeline is not None and not dry: sys.exit("bench.device_check: --timeline simulates a card; pass it with --dry.")
    clock = Clock(float(_arg("--speed", 10)) if timeline is not None else 1.0)
    budget = float(_arg("--budget", BUDGET))
    out = Path(_arg("--out", os.environ.get("OUT", "bench/results")))
    out.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="device_check_logs_"))
    parts = _arg("--parts", ",".join(PARTS)).split(",")
    unknown = [p for p in parts if p not in PARTS]
    if unknown: sys.exit(f"bench.device_check: unknown part(s) {unknown}; the parts: {', '.join(PARTS)}.")
    if dry and timeline is None and "gpu_tests" in parts: parts.remove("gpu_tests")   # nothing to test without CUDA
    simulated = timeline is not None
    if not simulated:
        import torch
        if not dry and not torch.cuda.is_available(): sys.exit("bench.device_check needs a CUDA GPU (or --dry, on the CPU).")
        device, version = ("cpu (dry)" if dry else torch.cuda.get_device_name()), torch.__version__
    else: device, version = f"simulated ({_arg('--timeline')}, {clock.speed:g}x)", None
    card = _card(dry)
    scale = 1 if simulated or not dry else 8   # the tiny model's parts are quick: minimums divided by 8 in a plain dry run
    minimum = {p: s / scale for p, s in MINIMUM.items()}
    summary = {"device": device, "torch": version, "budget": budget, "clock": "simulated" if simulated else "real", "parts": {}}
    sim_args = ["--timeline", _arg("--timeline"), "--speed", str(clock.speed)] if simulated else []
    def record(part, result, started):
        summary["parts"][part] = {**result, "seconds": round(clock.now() - started, 1)}
        _write_json(out / "device_check.json", summary)
        _archive(logs, out)
        print(f"{part}: {summary['parts'][part]['status']} ({summary['parts'][part]['seconds']} s)", flush=True)
    started = clock.now()
    model = None
    if {"decode", "step", "profile"} & set(parts):
        model = released_model(None, dry, Simulated(timeline, clock.speed) if simulated else None)
    summary["model_seconds"] = round(clock.now() - started, 1)
    _write_json(out / "device_check.json", summary)
    # the step's minimum is always kept for it; the tests' when a call names them (a second call's --parts learning,gpu_tests)
    protected = set(PROTECTED) | ({"gpu_tests"} if "--parts" in sys.argv else set())
    for k, part in enumerate(parts):
        left = budget - clock.now()
        reserve = sum(minimum[p] + KILL for p in parts[k + 1:] if p in protected)   # what a later protected part needs
        if left < minimum[part] + reserve:
            summary["parts"][part] = {"status": f"skipped: {left:.0f} s left, {minimum[part] + reserve:.0f} s needed "
                                                f"({minimum[part]:.0f} for it, {reserve:.0f} kept for {', '.join(p for p in parts[k + 1:] if p in protected)})"
                                                if reserve else f"skipped: {left:.0f} s left, {minimum[part]:.0f} s needed"}
            _write_json(out / "device_check.json", summary)
            continue
        started = clock.now()
        deadline_card = budget - reserve - KILL   # the part is stopped here, on the card's clock
        deadline = time.time() + clock.real(deadline_card - clock.now())   # the same moment on this machine's clock
        if part == "step" and not simulated:
            steps = _arg("--dry-steps", "1") if dry else str(STEPS)
            args = ["bench.gpu_step", "--one", "flow_grpo-nf4", "--model", model, "--size", "64" if dry else "1024",
                    "--steps", steps, "--lines", str(out / f"gpu_step_{card}_steps.jsonl"),
                    "--report", str(logs / f"gpu_step_{card}_report.json")] + (["--tiny"] if dry else [])
        elif part == "learning":
            small = released_model(2, dry) if not simulated else "simulated"
            args = ["bench.device_check", "--child", "learning", small, str(out), str(deadline - 5)]
        elif part == "gpu_tests":
            args = ["bench.device_check", "--child", "gpu_tests", str(logs), str(out), str(deadline - 5)]
        else:
            args = ["bench.device_check", "--child", part, model, str(out),
                    str(STEPS if simulated or not dry else int(_arg("--dry-steps", "1")))]
        result = run_part(args + (["--dry"] if dry else []) + sim_args, logs, part, clock.real(deadline_card - clock.now()))
        record(part, result, started)
    for line in figures(out, card, summary): print(line, flush=True)   # the tool's output tail holds them all


def child():
    dry = "--dry" in sys.argv
    timeline = read_timeline(_arg("--timeline"))
    sim = Simulated(timeline, float(_arg("--speed", 10))) if timeline is not None else None
    i = sys.argv.index("--child")
    part, a, b, c = sys.argv[i + 1:i + 5]
    if part == "decode": decode(a, dry, Path(b), sim)
    elif part == "profile": profile(a, dry, Path(b), sim)
    elif part == "step": step(a, dry, Path(b), int(c), sim)
    elif part == "learning": learning(a, dry, Path(b), float(c), sim)
    elif part == "gpu_tests": gpu_tests(Path(b), Path(a), float(c), sim)


if __name__ == "__main__":
    try:
        if "--child" in sys.argv: child()
        else: main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
