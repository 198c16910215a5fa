"""Benchmark: what torch.compile makes of the sampling copy's decode step, on the tiny GLM-Image (CPU, 2 threads).

The copy decoding with transformers' `generate` (`fixed_decode=False`), with GLM-Image's stock
`prepare_inputs_for_generation` (decode positions read from the static cache's length tensor inside the forward) or with
ours (positions sliced on the host); and decoding in our fixed-length loop (`decode_loop`), without and with a prompt
bucket (`policy.prompt_bucket` set to the longest prompt, as the trainer sets it). Prints, for dynamo's graph capture
and for inductor: graphs compiled, graph breaks, first-call and steady seconds, over two prompt lengths, an update of
the adapters, and a third prompt length. On a GPU each graph break is also a device-to-host sync per token.
Run from the repository root: python -m bench.compile"""
import tempfile
import time
from pathlib import Path

import torch
from torch._dynamo.utils import counters
from transformers import CompileConfig

from glm_grpo_nb.policy import GlmImagePolicy
from glm_grpo_nb.tiny import make_tiny_glm_image

PROMPTS = [["a red cat", "a blue dog"],
           ["a red cat on a mat, seen from far away on a bright and windy summer afternoon by the sea", "a blue dog"],
           ["a poster that says 'GRPO' in bold red letters above a calm green lake at dawn, with mountains, birds, "
            "boats and a long wooden pier that reaches far out into the water under a pale sky", "x"]]


def measure(path, backend, way):
    torch._dynamo.reset(); counters.clear()
    policy = GlmImagePolicy.from_pretrained(path, ar_lora=8, sampling_copy=True, verbose=False)
    cfg = CompileConfig(backend=backend, fullgraph=way.startswith("loop"))
    cfg._compile_all_devices = True   # transformers compiles on CUDA only unless asked
    policy.sampling_compile = cfg
    policy.fixed_decode = way.startswith("loop")
    if way == "loop, bucket": policy.prompt_bucket = policy.prompt_length(sum(PROMPTS, []), 64, 64)
    if way == "generate, stock positions":
        policy.sampling_model().__dict__.pop("prepare_inputs_for_generation")   # the class's own method
    seconds, lengths = [], []
    for i, prompts in enumerate([PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[1], PROMPTS[2]]):
        if i == 3:
            with torch.no_grad():
                for p in policy.parameters():
                    if p.requires_grad: p.add_(0.01)   # an update: new adapter values, same tensors
        t = time.perf_counter()
        roll = policy.sample_tokens(prompts, 2, 64, 64, seed=i)
        seconds.append(time.perf_counter() - t)
        lengths.append(roll.input_ids.shape[1])
    return dict(graphs=counters["stats"]["unique_graphs"], breaks=sum(counters["graph_break"].values()),
                first=seconds[0], steady=seconds[1], lengths=sorted(set(lengths)))


if __name__ == "__main__":
    torch.set_num_threads(2)
    path = make_tiny_glm_image(Path(tempfile.mkdtemp()) / "tiny")
    for backend in ("eager", "inductor"):
        for way in ("generate, stock positions", "generate, host positions", "loop", "loop, bucket"):
            r = measure(path, backend, way)
            print(f"{backend:9s} {way:26s} graphs {r['graphs']}, graph breaks "
                  f"{r['breaks']}, first call {r['first']:.1f} s, next {r['steady']:.2f} s (padded prompt lengths "
                  f"{r['lengths']})", flush=True)
