"Benchmark: build time and disk size of the tiny GLM-Image, and one stock-pipeline generation. Run from the repository root: python -m bench.tiny"
import tempfile
import time
from pathlib import Path

import torch
from diffusers import GlmImagePipeline

from glm_grpo_nb.tiny import make_tiny_glm_image

if __name__ == "__main__":
    torch.set_num_threads(2)
    d = Path(tempfile.mkdtemp())
    times = []
    for i in range(5):
        t = time.perf_counter(); make_tiny_glm_image(d / f"t{i}", full_head=(i % 2 == 1)); times.append(time.perf_counter() - t)
    size = sum(f.stat().st_size for f in (d / "t0").rglob("*") if f.is_file()) / 2**20
    print(f"build: median {sorted(times)[2]:.3f} s, max {max(times):.3f} s over 5 builds; size {size:.2f} MB")
    t = time.perf_counter(); pipe = GlmImagePipeline.from_pretrained(d / "t0"); load = time.perf_counter() - t
    pipe.set_progress_bar_config(disable=True)
    g = torch.Generator().manual_seed(0)
    pipe("warm up", height=64, width=64, num_inference_steps=2, generator=g)
    t = time.perf_counter()
    pipe(["a red 'HI' sign"] * 4, height=64, width=64, num_inference_steps=10, generator=g)
    print(f"load: {load:.3f} s; stock pipeline t2i 64x64, batch 4, 10 steps: {time.perf_counter() - t:.2f} s")
