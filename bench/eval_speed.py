"""Benchmark: images per second of `evaluate_model`'s two samplers on the tiny GLM-Image, CPU: the stock pipeline one
image per call (`sampler="pipeline"`, what every evaluation did before) and the policy's batched sampler
(`sampler="policy"`, 8 images per call). 16 prompts, 20 denoising steps, guidance 1.5, after one warm-up batch.
Run from the repository root: python -m bench.eval_speed"""
import tempfile
import time
from pathlib import Path

import torch

from glm_grpo_nb.image_models import PipelineModel, PolicyModel
from glm_grpo_nb.tiny import make_tiny_glm_image

PROMPTS = [f"a {c} sign that says '{w}'" for c in ("red", "blue", "green", "yellow") for w in ("OPEN", "SALE", "HI", "GO")]

if __name__ == "__main__":
    torch.set_num_threads(2)
    tiny = make_tiny_glm_image(Path(tempfile.mkdtemp()) / "tiny")
    print(f"{len(PROMPTS)} prompts, 20 steps, guidance 1.5, tiny GLM-Image on {torch.get_num_threads()} CPU threads")
    for size in (64, 256):
        kw = dict(height=size, width=size, num_inference_steps=20, guidance_scale=1.5)
        pipe, pol = PipelineModel(tiny, **kw), PolicyModel(tiny, batch_size=8, **kw)
        pipe("warm-up", 0); pol.batch(PROMPTS[:8], list(range(8)))
        t = time.perf_counter()
        for k, p in enumerate(PROMPTS): pipe(p, k)
        before = len(PROMPTS) / (time.perf_counter() - t)
        t = time.perf_counter()
        for i in range(0, len(PROMPTS), 8): pol.batch(PROMPTS[i:i + 8], list(range(i, i + 8)))
        after = len(PROMPTS) / (time.perf_counter() - t)
        print(f"{size}x{size}: pipeline, one image per call {before:.2f} images/s; policy sampler, 8 per call "
              f"{after:.2f} images/s ({after / before:.1f}x)")
