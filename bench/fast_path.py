"""Benchmark: the fast path's pieces on the CPU, each beside the path it replaces, in one process, at the released width
(random weights, 2 layers per stack, the compute dtype of this CPU), and compile times in fresh processes.

- decode: ms per token step, 8 sequences (2 prompts x G = 4), 1024x1024 (1,280 tokens: the 16x16 preview, then 32x32),
  the sampling copy decoding with transformers' `generate` against the fixed-length loop (`fixed_decode`); and one
  attention layer's q, k, v for a decode step, GLM-Image's three projections against the copy's grouped ones;
- DiT: one forward at 256x256, batch 2: diffusers building its rotary tables in the forward against the tables built
  once (`_rotary`), and with the blocks compiled (inductor);
- compile: the decode step and the DiT's blocks compiled with inductor at the tiny model's size in two fresh processes
  sharing one cache folder (`hub.compile_cache_dir`): the first compiles cold, the second finds the cache warm.

Run from the repository root: python -m bench.fast_path [--threads 2] [--out bench/results/fast_path_cpu.json]
(--quick: 256x256 and fewer repeats, a check of this script)."""
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _arg(name, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def decode_figures(policy, size: int) -> dict:
    "ms per token step of sample_tokens through generate and through the fixed loop, the same seeds, the same tokens."
    import torch
    prompts = ["a lighthouse on a cliff at dusk, oil painting", "a poster that says 'GRPO' in bold red letters"]
    out = {}
    for name, fixed in (("generate", False), ("fixed_loop", True)):
        policy.fixed_decode = fixed
        policy.sample_tokens(prompts[:1], 1, 256, 256, seed=0)   # the copy built, caches warm
        t = time.perf_counter()
        roll = policy.sample_tokens(prompts, 4, size, size, seed=1)
        sec = time.perf_counter() - t
        out[name] = dict(seconds=round(sec, 2), tokens=roll.completion.shape[1] - 1,
                         ms_per_token_step=round(1000 * sec / (roll.completion.shape[1] - 1), 2))
        out[name + "_tokens"] = roll.completion
    same = torch.equal(out.pop("generate_tokens"), out.pop("fixed_loop_tokens"))
    return {**out, "same_tokens": same}


def projection_figures(policy, repeats: int) -> dict:
    "One decode step's q, k, v of one attention layer (8 rows): GLM-Image's three Linears against the grouped module."
    import torch
    from bench._bench import timed
    attn = policy.sampling_model().model.language_model.layers[0].self_attn
    x = torch.randn(8, 1, attn.config.hidden_size, dtype=policy.dit_dtype)
    with torch.no_grad():
        three = timed(lambda: [p(x) for p in (attn.q_proj, attn.k_proj, attn.v_proj)], repeats)
        grouped = timed(lambda: attn.qkv(x), repeats)
    return dict(three_ms=round(1000 * three, 3), grouped_ms=round(1000 * grouped, 3), fused_base=attn.qkv.weight is not None)


def dit_figures(policy, repeats: int) -> dict:
    "One DiT forward at 256x256, batch 2: diffusers' own tables, ours once, ours with the blocks compiled."
    import torch
    from bench._bench import timed
    roll = policy.sample_tokens(["a red square", "a blue circle"], 1, 256, 256, seed=0)
    traj = policy.sample_latents(roll, num_steps=2, seed=0)
    x, prior = policy.on_device(traj.latents[:, 0]), policy.on_device(roll.prior_token_ids)
    P = int(traj.embed_lengths.max())   # prompts without quotes: one glyph length for all rows
    embeds = policy.on_device(traj.prompt_embeds[:, traj.prompt_embeds.shape[1] - P:])
    velocity = lambda: policy._velocity(x, traj.timesteps[0], prior, embeds, None, 1.0, None, 256, 256)
    out = {}
    with torch.no_grad():
        original = policy._rotary
        policy._rotary = lambda x: None   # diffusers builds the tables itself at every forward
        out["tables_per_forward_ms"] = round(1000 * timed(velocity, repeats), 1)
        del policy._rotary
        assert policy._rotary.__func__ is original.__func__
        out["tables_once_ms"] = round(1000 * timed(velocity, repeats), 1)
        policy.dit_compile = {}
        t = time.perf_counter(); velocity(); out["compile_seconds"] = round(time.perf_counter() - t, 1)
        out["compiled_ms"] = round(1000 * timed(velocity, repeats), 1)
        policy.dit_compile = False
    return out


def compile_child() -> dict:
    "In a fresh process: the decode step and the DiT's blocks compiled with inductor on the tiny model (seconds each)."
    import torch
    from transformers import CompileConfig
    from glm_grpo_nb.policy import GlmImagePolicy
    from glm_grpo_nb.tiny import make_tiny_glm_image
    torch.set_num_threads(int(_arg("--threads", 2)))
    policy = GlmImagePolicy.from_pretrained(make_tiny_glm_image(Path(tempfile.mkdtemp()) / "tiny"), ar_lora=8, dit_lora=8,
                                            sampling_copy=True, verbose=False)
    cfg = CompileConfig(fullgraph=True); cfg._compile_all_devices = True
    policy.sampling_compile = cfg
    out = {}
    t = time.perf_counter(); roll = policy.sample_tokens(["a red square"], 2, 64, 64, seed=0)
    out["decode_first_call"] = round(time.perf_counter() - t, 1)
    t = time.perf_counter(); policy.sample_tokens(["a red square"], 2, 64, 64, seed=1)
    out["decode_next_call"] = round(time.perf_counter() - t, 2)
    policy.dit_compile = {}
    t = time.perf_counter(); traj = policy.sample_latents(roll, num_steps=2, seed=0)
    out["dit_first_sampling"] = round(time.perf_counter() - t, 1)
    t = time.perf_counter(); policy.sample_latents(roll, num_steps=2, seed=1)
    out["dit_next_sampling"] = round(time.perf_counter() - t, 2)
    t = time.perf_counter(); policy.latent_logprobs(traj).sum().backward()
    out["dit_first_update"] = round(time.perf_counter() - t, 1)
    return out


def compile_figures() -> dict:
    "Cold and warm compile seconds: two fresh processes, one new cache folder between them."
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="inductor-")}
    runs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-m", "bench.fast_path", "--compile-child", "--threads", _arg("--threads", "2")],
                           capture_output=True, text=True, env=env)
        if r.returncode: raise RuntimeError(r.stderr[-3000:])
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    return dict(cold=runs[0], warm=runs[1], cache=env["TORCHINDUCTOR_CACHE_DIR"])


def main():
    import torch
    threads = int(_arg("--threads", 2))
    torch.set_num_threads(threads)
    quick = "--quick" in sys.argv
    out = Path(_arg("--out", "bench/results/fast_path_cpu.json"))
    from glm_grpo_nb.policy import GlmImagePolicy
    import glm_grpo_nb.tiny as tiny
    t = time.perf_counter()
    parts = tiny.make_random_glm_image(layers=2, load_in_4bit=True)
    policy = GlmImagePolicy.from_components(parts, load_in_4bit=True, ar_lora=16, dit_lora=16, device="cpu",
                                            sampling_copy=True)
    del parts
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():   # trained-looking adapters: the low-rank products are not zero
        for n, p in policy.named_parameters():
            if "lora_B" in n: p.copy_(torch.randn(p.shape, generator=g) * 0.01)
    report = dict(device=f"cpu, {threads} threads", torch=torch.__version__, dtype=str(policy.dit_dtype),
                  build_seconds=round(time.perf_counter() - t, 1), model="random, released width, 2 layers per stack, NF4 + LoRA r16")
    def write(key, value):
        report[key] = value
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1) + "\n")
        print(key, json.dumps(value), flush=True)
    write("projections", projection_figures(policy, 20 if quick else 200))
    write("dit_forward_256", dit_figures(policy, 2 if quick else 5))
    write("decode", decode_figures(policy, 256 if quick else 1024))
    del policy
    write("compile", compile_figures())


if __name__ == "__main__":
    if "--compile-child" in sys.argv: print(json.dumps(compile_child()))
    else: main()
