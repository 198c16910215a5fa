"""`hpsv2` (`glm_grpo_nb.preference_rewards.HPSv2Reward`) against HPSv2's own scoring code, run as written.

HPSv2's code is not part of this project and is never installed by it: check out tgxs002/HPSv2 yourself and make a
virtualenv where it imports (torch, torchvision, ftfy, regex, clint, requests, huggingface_hub). This script runs,
in that virtualenv, HPSv2's vendored open_clip exactly as `hpsv2/img_score.py` does (`create_model_and_transforms`
with img_score's arguments, `preprocess_val`, `get_tokenizer`, `model(image, text)`, the diagonal of image · textᵀ),
on an architecture of ViT-H-14's family at small sizes (registered as a model config: 2 layers, width 64, patch 14,
image 56, the real 49,408-token vocabulary and 77-token context) with random weights, saved as HPSv2 saves its
checkpoints ({'state_dict': ...}). Then this package scores the same images and prompts from that checkpoint and a
CLIPTokenizer made of HPSv2's own BPE file, and compares token ids and scores.

Run from the repository root:
    python -m bench.official_hpsv2 --official PATH/HPSv2 --python PATH/venv/bin/python
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

PROMPTS = ["a red cube on a table", "Two  CATS &amp; a DOG, 3 birds!", "café au lait — “quoted” text ½",
           "a sign that reads \"OPEN 24 HOURS\" " * 12,   # far past 77 tokens: truncated with the end token kept
           "", "   leading and trailing spaces   ", "<b>html</b> &lt;tags&gt; &amp;amp; twice-escaped",
           "a photograph of an astronaut riding a horse on the moon, highly detailed, 8k, trending on artstation",
           "数字 and emoji 🙂 mixed", "UPPER lower MiXeD 12345 67.89"]
SIZES = [(56, 56), (64, 56), (56, 90), (97, 61), (200, 123), (57, 57), (512, 384), (60, 61), (1024, 1024), (33, 100)]

OFFICIAL = r'''
import json, sys, torch
from PIL import Image
root, work = sys.argv[1], sys.argv[2]
sys.path.insert(0, root)
from hpsv2.src.open_clip import create_model_and_transforms, get_tokenizer
from hpsv2.src.open_clip import factory
from hpsv2.src.open_clip.tokenizer import _tokenizer
factory._MODEL_CONFIGS["HPS-small"] = {"embed_dim": 32,
    "vision_cfg": {"image_size": 56, "layers": 2, "width": 64, "head_width": 32, "patch_size": 14},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2}}
torch.manual_seed(0)
model, preprocess_train, preprocess_val = create_model_and_transforms(
    'HPS-small', None, precision='amp', device='cpu', jit=False, force_quick_gelu=False, force_custom_text=False,
    force_patch_dropout=False, force_image_size=None, pretrained_image=False, image_mean=None, image_std=None,
    light_augmentation=True, aug_cfg={}, output_dict=True, with_score_predictor=False, with_region_predictor=False)
with torch.no_grad():
    for p in model.parameters(): p.add_(0.05 * torch.randn_like(p))   # biases and norms away from 0 and 1
cp = work + "/HPS_small.pt"
torch.save({"state_dict": model.state_dict()}, cp)
# img_score.score, as written, on one image and its prompt at a time
checkpoint = torch.load(cp, map_location='cpu')
model.load_state_dict(checkpoint['state_dict'])
tokenizer = get_tokenizer('HPS-small')
model = model.to('cpu'); model.eval()
cases = json.load(open(work + "/cases.json"))
scores, ids = [], []
for img_path, prompt in cases:
    with torch.no_grad():
        image = preprocess_val(Image.open(img_path)).unsqueeze(0).to(device='cpu', non_blocking=True)
        text = tokenizer([prompt]).to(device='cpu', non_blocking=True)
        with torch.cuda.amp.autocast():
            outputs = model(image, text)
            image_features, text_features = outputs["image_features"], outputs["text_features"]
            logits_per_image = image_features @ text_features.T
            hps_score = torch.diagonal(logits_per_image).cpu().numpy()
    scores.append(float(hps_score[0])); ids.append(text[0].tolist())
json.dump({"scores": scores, "ids": ids}, open(work + "/official.json", "w"))
# the vocabulary the official tokenizer used, as the files a CLIPTokenizer reads
tok = work + "/tokenizer"
import os; os.makedirs(tok, exist_ok=True)
names = {"<start_of_text>": "<|startoftext|>", "<end_of_text>": "<|endoftext|>"}   # as CLIP-H's Hub files spell them
json.dump({names.get(k, k): v for k, v in _tokenizer.encoder.items()}, open(tok + "/vocab.json", "w"), ensure_ascii=False)
merges = sorted(_tokenizer.bpe_ranks, key=_tokenizer.bpe_ranks.get)
open(tok + "/merges.txt", "w", encoding="utf-8").write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
'''


def write_cases(work: Path) -> list[list[str]]:
    "Each prompt with an image of its size, saved in `work` and listed in work/cases.json: [[image path, prompt], ...]."
    rng = np.random.default_rng(0)
    cases = []
    for i, (prompt, (w, h)) in enumerate(zip(PROMPTS, SIZES)):
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        if i % 2: pixels = np.cumsum(pixels, axis=1, dtype=np.uint32).astype(np.uint8)   # structure, not only noise
        Image.fromarray(pixels).save(work / f"{i}.png")
        cases.append([str(work / f"{i}.png"), prompt])
    (work / "cases.json").write_text(json.dumps(cases))
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--official", required=True, help="a checkout of tgxs002/HPSv2 (the folder holding hpsv2/)")
    ap.add_argument("--python", required=True, help="the Python of a virtualenv where HPSv2's code imports")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    cases = write_cases(work)
    subprocess.run([args.python, "-c", OFFICIAL, args.official, str(work)], check=True)
    official = json.loads((work / "official.json").read_text())

    import torch
    from transformers import CLIPTokenizer

    from glm_grpo_nb.preference_rewards import HPSv2Reward, open_clip_tokens
    ours = HPSv2Reward(str(work / "HPS_small.pt"), tokenizer=str(work / "tokenizer"), heads=(2, 2), device="cpu")
    images = [Image.open(p) for p, _ in cases]
    prompts = [q for _, q in cases]
    ids = open_clip_tokens(CLIPTokenizer.from_pretrained(str(work / "tokenizer")), prompts, 77)
    same_ids = [i for i, row in enumerate(official["ids"]) if row == ids[i].tolist()]
    scores = ours(images, prompts).double()
    diff = (scores - torch.tensor(official["scores"], dtype=torch.float64)).abs()
    print(f"pairs: {len(cases)} (sizes {', '.join(f'{w}x{h}' for w, h in SIZES)})")
    print(f"token ids equal: {len(same_ids)} of {len(cases)} prompts (longest prompt: "
          f"{max(len(CLIPTokenizer.from_pretrained(str(work / 'tokenizer'))(p)['input_ids']) for p in prompts)} tokens)")
    print("official:", " ".join(f"{s:.6f}" for s in official["scores"]))
    print("ours:    ", " ".join(f"{s:.6f}" for s in scores.tolist()))
    print(f"largest difference: {diff.max().item():.2e}")
    ok = len(same_ids) == len(cases) and diff.max().item() <= 1e-5
    print("equal to HPSv2's code (ids exactly, scores to 1e-5)" if ok else "DIFFERENT from HPSv2's code")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
