"""Benchmark: the OCR reward (RapidOCR) on a GRPO group of 8 signs at 1024x1024, and what serving a reward over HTTP
adds to a call (PNG encoding, one request, decoding on the server). Run from the repository root:
python -m bench.rewards"""
import os

import torch

from bench._bench import timed
from glm_grpo_nb.rewards import OCRReward, RednessReward, RemoteReward, evaluate_reward, png_base64, serve_reward
from glm_grpo_nb.tiny import render_sign

WORDS = ("OPEN", "SALE", "EXIT", "CAFE", "OPEN 24 HOURS", "HOTEL", "BAR", "GRAND OPENING")

if __name__ == "__main__":
    torch.set_num_threads(2)
    print(f"{os.cpu_count()} CPU cores")
    signs = [render_sign(w) for w in WORDS]
    prompts = [f"a shop sign that says '{w}'" for w in WORDS]
    ocr = OCRReward()
    print(f"OCR engine on {ocr.ocr.device}")
    out = evaluate_reward(ocr, signs, prompts)   # warm-up (onnxruntime's first run allocates)
    print(f"scores {[round(s, 3) for s in out.total.tolist()]}")
    print(f"OCR, 8 images at 1024x1024: median {timed(lambda: ocr(signs, prompts)):.2f} s over 5 calls")
    print(f"PNG encoding, 8 images at 1024x1024: {timed(lambda: [png_base64(s) for s in signs]):.3f} s")
    with serve_reward(RednessReward(), port=0, background=True) as server:
        remote, local = RemoteReward(server.url), RednessReward()
        assert torch.equal(remote(signs, prompts), local(signs, prompts))
        t_local, t_remote = timed(lambda: local(signs, prompts)), timed(lambda: remote(signs, prompts))
        print(f"redness, 8 images at 1024x1024: in-process {t_local:.3f} s, served on loopback {t_remote:.3f} s "
              f"(+{t_remote - t_local:.3f} s for the HTTP round trip)")
