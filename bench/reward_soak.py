"""Soak test of `glm-grpo serve-reward`: many requests at once, valid and invalid, on loopback.

A redness server runs in its own process with small limits (max 4 images per request, 256x256 pixels per image, a
1 MB body). `requests` requests go to it from `concurrency` threads, in a fixed mix: valid requests (their scores are
checked against the same reward in this process), too many images, an image too large (its PNG header says so; the
pixels are never decoded), a body too large sent chunked (no Content-Length), a body too large with a Content-Length,
and an image that is not a PNG. Every valid request must be answered correctly, every invalid one refused with a
4xx that names the limit, and the server's resident memory must stay flat after warm-up.

Run from the repository root: python -m bench.reward_soak [--requests 300 --concurrency 8]
"""
import argparse
import base64
import io
import json
import os
import re
import struct
import subprocess
import sys
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def png(w, h, color=(200, 30, 30)):
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (w, h), color).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def png_header_only(w, h):
    "A valid PNG header claiming w x h pixels, with a tiny (wrong-sized) body: what a decompression bomb looks like."
    def chunk(kind, data): return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    raw += chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + chunk(b"IEND", b"")
    return base64.b64encode(raw).decode()


def rss_kb(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"): return int(line.split()[1])
    return 0


def soak(requests_total=300, concurrency=8, glm_grpo=None):
    "Run the soak; returns its figures (and raises AssertionError on any wrong answer)."
    import requests
    import torch
    from PIL import Image
    from glm_grpo_nb.rewards import RednessReward
    exe = glm_grpo or str(Path(sys.executable).parent / "glm-grpo")
    proc = subprocess.Popen([exe, "serve-reward", "redness", "--port", "0", "--max-images", "4", "--max-pixels",
                             str(256 * 256), "--max-request-mb", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        url = re.search(r"at (http://127\.0\.0\.1:\d+)", proc.stdout.readline()).group(1) + "/score"
        local = RednessReward()
        colors = [(255, 0, 0), (0, 0, 255), (128, 128, 128), (250, 200, 10)]
        valid_imgs = [[png(64, 64, c)] * 2 for c in colors]
        want = [local([Image.new("RGB", (64, 64), c)] * 2, ["x", "y"]).tolist() for c in colors]
        big_body = json.dumps({"images": [png(8, 8)], "prompts": ["x"], "pad": "x" * (2 * 2 ** 20)}).encode()
        kinds = ["valid", "valid", "valid", "too_many", "too_large_image", "chunked_body", "big_body", "not_png"]
        def one(i):
            kind, s = kinds[i % len(kinds)], requests.Session()
            if kind == "valid":
                c = (i // len(kinds)) % len(colors)
                r = s.post(url, json={"images": valid_imgs[c], "prompts": ["x", "y"]}, timeout=60)
                ok = r.status_code == 200 and r.json()["scores"] == want[c]
            elif kind == "too_many":
                r = s.post(url, json={"images": [png(8, 8)] * 5, "prompts": ["x"] * 5}, timeout=60)
                ok = r.status_code == 413 and "max_images" in r.json()["error"]
            elif kind == "too_large_image":
                r = s.post(url, json={"images": [png_header_only(10000, 10000)], "prompts": ["x"]}, timeout=60)
                ok = r.status_code == 413 and "10000x10000" in r.json()["error"] and "--max-pixels" in r.json()["error"]
            elif kind == "chunked_body":
                r = s.post(url, data=(big_body[k:k + 65536] for k in range(0, len(big_body), 65536)),
                           headers={"Content-Type": "application/json"}, timeout=60)
                ok = r.status_code == 413 and "--max-request-mb" in r.json()["error"]
            elif kind == "big_body":
                r = s.post(url, data=big_body, headers={"Content-Type": "application/json"}, timeout=60)
                ok = r.status_code == 413 and "--max-request-mb" in r.json()["error"]
            else:
                r = s.post(url, json={"images": [base64.b64encode(b"GIF89a....").decode()], "prompts": ["x"]}, timeout=60)
                ok = r.status_code == 400 and "not a base64 PNG" in r.json()["error"]
            return kind, ok, r.status_code
        warm = 48
        with ThreadPoolExecutor(concurrency) as pool: first = list(pool.map(one, range(warm)))
        rss_warm = rss_kb(proc.pid)
        t = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool: rest = list(pool.map(one, range(warm, requests_total)))
        seconds = time.perf_counter() - t
        rss_end = rss_kb(proc.pid)
        results = first + rest
        bad = [(i, k, code) for i, (k, ok, code) in enumerate(results) if not ok]
        assert not bad, f"wrong answers: {bad[:10]}"
        assert proc.poll() is None, "the server died"
        counts = {k: sum(1 for kk, _, _ in results if kk == k) for k in kinds}
        return {"requests": requests_total, "concurrency": concurrency, "counts": counts,
                "seconds_after_warmup": round(seconds, 2), "requests_per_second": round((requests_total - warm) / seconds, 1),
                "rss_mb_after_warmup": round(rss_warm / 1024, 1), "rss_mb_end": round(rss_end / 1024, 1)}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--glm-grpo", default=None, help="the console script to serve with (default: beside this Python)")
    a = ap.parse_args()
    print(json.dumps(soak(a.requests, a.concurrency, a.glm_grpo), indent=1))
