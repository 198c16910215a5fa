"""Fingerprints of short training runs, to show that a change to the trainer or an objective changes no number.

Each run trains the tiny GLM-Image (shipped weights) for three steps on CPU with one DiT objective and one layout (joint,
decoupled, i2i, AR only), with a KL term, two inner epochs and micro-batches, so every phase is exercised; it saves a
checkpoint at step 2 and at the end. The fingerprint holds a digest of every adapter tensor after each step, every
metrics row (without timings) and every checkpoint file's digest. Record one before a refactor and compare after:

    python -m bench.exactness --out /tmp/before.json
    ... change the code ...
    python -m bench.exactness --out /tmp/after.json --compare /tmp/before.json

Paths inside checkpoints (the model's folder) are the same in both runs because the runs use the same work folder.
"""
import argparse
import hashlib
import json
import shutil
import warnings
from pathlib import Path

RUNS = {
    "flow_grpo joint": dict(dit_objective="flow_grpo", mode="joint"),
    "flow_grpo decoupled": dict(dit_objective="flow_grpo", mode="decoupled"),
    "flow_grpo i2i": dict(dit_objective="flow_grpo", mode="joint", i2i=True),
    "flow_grpo cps dit-only": dict(dit_objective="flow_grpo", sde_type="cps", train_ar=False, kl_type="velocity"),
    "nft joint": dict(dit_objective="nft", mode="joint"),
    "nft decoupled": dict(dit_objective="nft", mode="decoupled", nft_timesteps=2),
    "nft i2i": dict(dit_objective="nft", mode="joint", i2i=True),
    "ar only": dict(train_dit=False),
    "grpo_guard moving window": dict(dit_objective="grpo_guard", sde_window_schedule="progressive"),
    "awm joint (EMA)": dict(dit_objective="awm", awm_timesteps=2, awm_ema_coef=0.1, ema_decay_rate=0.2),
    "dgpo decoupled": dict(dit_objective="dgpo", mode="decoupled", dgpo_timesteps=2, ema_decay_rate=0.2),
}
PROMPTS = ["a red square", "a blue circle", "a green field", "the word 'OK' on white"]


def digest(t) -> str:
    import torch
    t = t.detach().cpu().contiguous()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()[:16]


def file_digest(f: Path) -> str:
    "A checkpoint file's content without what differs between identical runs: timings, and the order of a set in JSON."
    if f.suffix == ".safetensors":   # the tensors; the metadata lists LoRA target modules in set order
        from safetensors.torch import load_file
        return json.dumps({k: digest(v) for k, v in sorted(load_file(f).items())})
    if f.name == "trainer_state.json":
        state = json.loads(f.read_text())
        state["history"] = [{k: v for k, v in row.items() if not k.startswith("seconds/")} for row in state["history"]]
        return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:16]
    return hashlib.sha256(f.read_bytes()).hexdigest()[:16]


def fingerprint(name: str, settings: dict, work: Path) -> dict:
    import torch
    from PIL import Image
    from glm_grpo_nb.data import PromptDataset
    from glm_grpo_nb.policy import GlmImagePolicy
    from glm_grpo_nb.rewards import RednessReward
    from glm_grpo_nb.trainer import GRPOTrainer
    import random, numpy
    torch.manual_seed(0); random.seed(0); numpy.random.seed(0)   # checkpoints store every generator's state
    settings = dict(settings)
    data = PROMPTS
    if settings.pop("i2i", False):
        folder = work / "sources"
        folder.mkdir(exist_ok=True)
        rows = []
        for i, p in enumerate(PROMPTS):
            f = folder / f"{i}.png"
            Image.new("RGB", (64, 64), (40 * i, 90, 200 - 40 * i)).save(f)
            rows.append({"prompt": f"make it redder: {p}", "sources": [str(f)]})
        data = PromptDataset(rows)
    out = work / name.replace(" ", "_")
    shutil.rmtree(out, ignore_errors=True)
    policy = GlmImagePolicy.from_pretrained(work / "tiny", ar_lora=4, dit_lora=4, device="cpu", verbose=False)
    trainer = GRPOTrainer(policy, RednessReward(), data, group_size=3, prompts_per_step=2, height=64, width=64,
                          num_inference_steps=4, sde_window=(1, 3), seed=7, lr=3e-3, kl_coef=0.05, num_inner_epochs=2,
                          micro_batch_size=4, save_every=2, output_dir=out, diversity_warning=0.0, **settings)
    weights = []
    for _ in range(3):
        trainer.step()
        weights.append({n: digest(p) for n, p in policy.named_parameters() if p.requires_grad})
    trainer.save()
    trainer.close()
    rows = [{k: v for k, v in json.loads(line).items() if not k.startswith("seconds/")}
            for line in (out / "metrics.jsonl").read_text().splitlines()]
    files = {str(f.relative_to(out)): file_digest(f) for f in sorted((out / "checkpoints").rglob("*"))
             if f.is_file() and f.name != "digests.json"}   # digests.json: the other files' bytes, so it follows them
    return {"weights": weights, "metrics": rows, "checkpoint_files": files}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare", default=None, help="an earlier --out to compare with; exits 1 on any difference")
    ap.add_argument("--work", default="/tmp/glm_grpo_exactness")
    ap.add_argument("--runs", nargs="*", default=list(RUNS))
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    from glm_grpo_nb.tiny import make_tiny_glm_image
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "tiny").exists(): make_tiny_glm_image(work / "tiny")
    result = {}
    for name in a.runs:
        result[name] = fingerprint(name, RUNS[name], work)
        print(f"{name}: {len(result[name]['metrics'])} metrics rows, {len(result[name]['checkpoint_files'])} checkpoint files",
              flush=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    if a.compare:
        before, bad = json.loads(Path(a.compare).read_text()), 0
        for name in a.runs:
            for part in ("weights", "metrics", "checkpoint_files"):
                same = before[name][part] == result[name][part]
                bad += not same
                print(f"{name:24s} {part:17s} {'same' if same else 'DIFFERENT'}")
        raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
