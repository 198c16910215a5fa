"""A served reward scored while the DiT samples (`reward_overlap`) against scored after sampling, in one run.

The tiny model, joint mode, G = 4 × 4 prompts (16 images a step, 64², 6 denoising steps), and a reward served by
`glm-grpo serve-reward` in a process of its own that sleeps a fixed time per image, as a judge's cost grows with the
images it reads; in-process redness beside it. Both trainers (overlap on, one group per chunk; overlap off, the same
chunks so the samples are the same) are built in this process from the same policy weights and take their steps in
turn, after one warm-up step each; each step's wall time and phases come from the trainer's own `seconds`. The
reward's cost per chunk is set from the measured sampling time of one chunk (DiT + decode): about equal to it, and
several times it.

Run from the repository root: python -m bench.reward_overlap [--steps 4 --ratios 1,4]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

PROMPTS = ["a blue square on a white background", "a green circle on a gray background", "a gradient from navy to teal",
           "the word 'OK' in white on blue"]
SLEEPY = '''
import os, time, torch
from glm_grpo_nb.rewards import RednessReward

class Sleepy(RednessReward):
    "Redness that takes SLEEPY_SECONDS per image, as a judge reading each image would."
    name = "sleepy"
    def score(self, images, prompts, targets=None, sources=None):
        time.sleep(float(os.environ["SLEEPY_SECONDS"]) * len(images))
        return super().score(images, prompts, targets, sources)
'''


def serve(per_image: float, folder: Path):
    "glm-grpo serve-reward sleepy:Sleepy in its own process; (process, url)."
    exe = Path(sys.executable).parent / "glm-grpo"
    env = {**os.environ, "SLEEPY_SECONDS": str(per_image), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([str(exe), "serve-reward", "sleepy:Sleepy", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=folder)
    line = proc.stdout.readline()
    found = re.search(r"at (http://127\.0\.0\.1:\d+)", line)
    if not found:
        proc.kill()
        raise RuntimeError(f"the reward server did not start: {line}{proc.stderr.read()}")
    return proc, found.group(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="timed steps per trainer (after one warm-up step each)")
    ap.add_argument("--ratios", default="1,4", help="the served reward's time per chunk, in chunk sampling times")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    import torch
    torch.set_num_threads(2)
    from glm_grpo_nb.policy import GlmImagePolicy
    from glm_grpo_nb.rewards import RednessReward, RemoteReward, combine
    from glm_grpo_nb.tiny import make_tiny_glm_image
    from glm_grpo_nb.trainer import GRPOTrainer
    folder = Path(tempfile.mkdtemp())
    (folder / "sleepy.py").write_text(textwrap.dedent(SLEEPY))
    model = make_tiny_glm_image(folder / "tiny")
    G, P = 4, len(PROMPTS)
    kw = dict(group_size=G, prompts_per_step=P, height=64, width=64, num_inference_steps=6, sde_window=(0, 3), lr=3e-3,
              seed=0, dit_sample_batch=G, diversity_warning=0.0)

    def trainer(reward, overlap):
        policy = GlmImagePolicy.from_pretrained(model, ar_lora=8, dit_lora=8, device="cpu", lora_seed=0, verbose=False)
        return GRPOTrainer(policy, reward, PROMPTS, reward_overlap=overlap, **kw)

    # one chunk's sampling time, from a step without a served reward
    probe = trainer(RednessReward(), None)
    probe.step()
    s = probe.step().seconds
    chunk_s = (s["sample_dit"] + s["decode"]) / P
    print(f"one chunk ({G} images): {chunk_s:.2f} s of DiT sampling and decoding; a step without a served reward "
          f"{sum(s.values()):.2f} s ({', '.join(f'{k} {v:.2f}' for k, v in s.items())})", flush=True)
    rows = []
    for ratio in (float(r) for r in args.ratios.split(",")):
        per_image = ratio * chunk_s / G
        proc, url = serve(per_image, folder)
        try:
            reward = lambda: combine({RemoteReward(url): 1.0, "redness": 0.5})
            on, off = trainer(reward(), True), trainer(reward(), False)
            on.step(); off.step()   # warm-up
            times = {"on": [], "off": []}
            for _ in range(args.steps):
                for name, t in (("on", on), ("off", off)):
                    start = time.perf_counter(); res = t.step(); whole = time.perf_counter() - start
                    times[name].append((whole, res.seconds, res.metrics))
            mean = lambda xs: sum(xs) / len(xs)
            w_on, w_off = mean([w for w, _, _ in times["on"]]), mean([w for w, _, _ in times["off"]])
            served = P * G * per_image
            m = times["on"]
            row = dict(ratio=ratio, served_s=served, step_off=w_off, step_on=w_on, saved=w_off - w_on,
                       reward_off=mean([sec["reward"] for _, sec, _ in times["off"]]),
                       reward_on=mean([sec["reward"] for _, sec, _ in m]),
                       wait_s=mean([mt["reward/wait_s"] for _, _, mt in m]), overlap=mean([mt["reward/overlap"] for _, _, mt in m]),
                       peak=max(mt["reward/inflight_peak"] for _, _, mt in m))
            rows.append(row)
            print(f"served reward {per_image:.3f} s per image ({ratio:g} x a chunk's sampling, {served:.2f} s a step): "
                  f"step {w_off:.2f} s without the overlap, {w_on:.2f} s with it ({w_off - w_on:+.2f} s); reward phase "
                  f"{row['reward_off']:.2f} -> {row['reward_on']:.2f} s; reward/wait_s {row['wait_s']:.2f}, reward/overlap "
                  f"{row['overlap']:.2f}, in flight at most {row['peak']:.0f}", flush=True)
            on.close(); off.close()
        finally:
            proc.terminate(); proc.wait(10)
    return rows


if __name__ == "__main__":
    main()
