"""Benchmark: what one image-to-image DiT update keeps, against text-to-image, with the source pass as fixed context
(the default) and with its gradient (`policy.source_grad = True`, which is what every update did before the source's
keys and values were computed once without gradient). Tiny GLM-Image at 512² (1,024 DiT tokens per image, a 512²
source), 4 samples of 2 prompts, 2 stochastic steps, micro-batches of 2; each setting in its own process.
Run from the repository root: python -m bench.i2i_memory. The code before the change: copy this file into a checkout
of it (bench/) and run it there."""
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from bench._bench import KeptForBackward

SIZE = 512

def measure(path: str, mode: str) -> dict:
    import torch
    from PIL import Image
    from glm_grpo_nb.policy import GlmImagePolicy
    import glm_grpo_nb.flow  # noqa: F401  (sample_latents, latent_logprobs)
    torch.set_num_threads(2)
    pol = GlmImagePolicy.from_pretrained(path, dit_lora=8, verbose=False)
    sources = None if mode == "t2i" else [[Image.linear_gradient("L").convert("RGB").resize((SIZE, SIZE))],
                                           [Image.new("RGB", (SIZE, SIZE), "red")]]
    roll = pol.sample_tokens(["make it blue", "add a dot"], group_size=2, height=SIZE, width=SIZE, images=sources, seed=0)
    traj = pol.sample_latents(roll, num_steps=4, noise_level=0.8, sde_window=[0, 1], seed=0)
    if hasattr(pol, "release_sources"): pol.release_sources()   # (absent from the code before the change)
    pol.source_grad = mode == "i2i, source with gradient"
    saved = KeptForBackward()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    passes = []
    hook = pol.transformer.register_forward_pre_hook(
        lambda m, a, kw: passes.append(1) if kw["encoder_hidden_states"].shape[1] == 0 else None, with_kwargs=True)
    for rows in ([0, 1], [2, 3]):   # one update: two micro-batches, each backward before the next
        with saved:
            lp = pol.latent_logprobs(traj.select(rows))
        lp.sum().backward()
    hook.remove()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return dict(mode=mode, saved_mb=saved.bytes / 2 ** 20, peak_rss_rise_mb=(peak - before) / 1024, source_passes=len(passes))

if __name__ == "__main__":
    if len(sys.argv) == 3:
        print(json.dumps(measure(sys.argv[1], sys.argv[2]))); sys.exit()
    from glm_grpo_nb.tiny import make_tiny_glm_image
    path = str(make_tiny_glm_image(Path(tempfile.mkdtemp()) / "tiny"))
    print(f"one DiT update, tiny GLM-Image at {SIZE}² (4 samples of 2 prompts, 2 stochastic steps, micro-batches of 2)")
    print(f"{'setting':<30}{'kept for backward (MB)':>24}{'peak RSS rise (MB)':>20}{'source passes':>15}")
    for mode in ("t2i", "i2i", "i2i, source with gradient"):
        out = subprocess.run([sys.executable, "-m", "bench.i2i_memory", path, mode], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{r['mode']:<30}{r['saved_mb']:>24.1f}{r['peak_rss_rise_mb']:>20.1f}{r['source_passes']:>15}")
