"""`imagereward` (`glm_grpo_nb.preference_rewards.ImageRewardReward`) against ImageReward's own scoring code, run as written.

ImageReward's code is not part of this project and is never installed by it: check out THUDM/ImageReward yourself
and make a virtualenv where its model imports (torch, torchvision, transformers 4.x with the helpers its `med.py`
imports, timm 0.6, fairscale). Its package `__init__` also imports openai's `clip` and its training code; only
`ImageReward/ImageReward.py` and `ImageReward/models/BLIP/` are run here, loaded as the package's modules without
those `__init__` files. `BertTokenizer.from_pretrained('bert-base-uncased')` inside its `init_tokenizer` is the one
stand-in: the same class reads a local WordPiece vocabulary instead of downloading (the one file written here,
used by both sides). Everything else is its code at its released size: `ImageReward(med_config)` (BLIP's ViT-L at
224², BERT-base with cross-attention, the MLP), random weights (its own initialisation, then perturbed so that
biases and norms are not 0 and 1), saved as a state dict as its authors save `ImageReward.pt`, loaded as its
`load()` does, and each image scored by its `score(prompt, image_path)`. This package then scores the same images
and prompts from that file, its med_config.json and that vocabulary, and the two are compared.

Run from the repository root:
    python -m bench.official_imagereward --official PATH/ImageReward --python PATH/venv/bin/python
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from bench.official_hpsv2 import PROMPTS, SIZES, write_cases

MED_CONFIG = {"architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
              "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
              "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert", "num_attention_heads": 12,
              "num_hidden_layers": 12, "pad_token_id": 0, "type_vocab_size": 2, "encoder_width": 768, "add_cross_attention": True}

OFFICIAL = r'''
import importlib.util, json, sys, types, torch
root, work = sys.argv[1], sys.argv[2]
for name, sub in (("ImageReward", "ImageReward"), ("ImageReward.models", "ImageReward/models")):   # no __init__: no clip, no ReFL
    pkg = types.ModuleType(name); pkg.__path__ = [f"{root}/{sub}"]; sys.modules[name] = pkg
from ImageReward.models.BLIP import blip
class LocalVocab(blip.BertTokenizer):
    @classmethod
    def from_pretrained(cls, name, *a, **k): return cls(work + "/vocab.txt")   # the stand-in for the download
blip.BertTokenizer = LocalVocab
from ImageReward.ImageReward import ImageReward
torch.manual_seed(0)
model = ImageReward(device="cpu", med_config=work + "/med_config.json")
with torch.no_grad():
    for p in model.parameters(): p.add_(0.02 * torch.randn_like(p))
    for name, p in model.mlp.named_parameters(): p.add_(0.05 * torch.randn_like(p))   # a head whose output moves
torch.save(model.state_dict(), work + "/ImageReward.pt")
# utils.load, as written after its download
state_dict = torch.load(work + "/ImageReward.pt", map_location='cpu')
model = ImageReward(device="cpu", med_config=work + "/med_config.json").to("cpu")
msg = model.load_state_dict(state_dict, strict=False)
model.eval()
cases = json.load(open(work + "/cases.json"))
with torch.no_grad():
    scores = [model.score(prompt, path) for path, prompt in cases]
ids = [model.blip.tokenizer(p, padding='max_length', truncation=True, max_length=35)["input_ids"] for _, p in cases]
json.dump({"scores": scores, "ids": ids, "missing": msg.missing_keys, "unexpected": msg.unexpected_keys,
           "vocab": len(model.blip.tokenizer)}, open(work + "/official.json", "w"))
'''


def vocabulary() -> list[str]:
    "A WordPiece vocabulary that covers the prompts: BERT's specials, single characters and their ## pieces, the prompts' words."
    import re
    chars = sorted({c for p in PROMPTS for c in p.lower() if not c.isspace()} | set("abcdefghijklmnopqrstuvwxyz0123456789"))
    words = sorted({w for p in PROMPTS for w in re.findall(r"[a-z]+", p.lower())} - set(chars))[::2]   # half the words: the rest in pieces
    return ["[PAD]", *(f"[unused{i}]" for i in range(5)), "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars), *words]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--official", required=True, help="a checkout of THUDM/ImageReward (the folder holding ImageReward/)")
    ap.add_argument("--python", required=True, help="the Python of a virtualenv where ImageReward's model imports")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    vocab = vocabulary()
    (work / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (work / "med_config.json").write_text(json.dumps(MED_CONFIG | {"vocab_size": len(vocab) + 2}))   # and [DEC], [ENC]
    cases = write_cases(work)
    subprocess.run([args.python, "-c", OFFICIAL, args.official, str(work)], check=True)
    official = json.loads((work / "official.json").read_text())

    import torch
    from transformers import BertTokenizer

    from glm_grpo_nb.preference_rewards import ImageRewardReward
    tok = work / "tokenizer"
    BertTokenizer(str(work / "vocab.txt")).save_pretrained(tok)
    ours = ImageRewardReward(str(work / "ImageReward.pt"), med_config=str(work / "med_config.json"), tokenizer=str(tok), device="cpu")
    images, prompts = [Image.open(p) for p, _ in cases], [q for _, q in cases]
    ids = ours.tokenizer(prompts, padding="max_length", truncation=True, max_length=35)["input_ids"]
    same_ids = sum(a == b for a, b in zip(official["ids"], ids))
    scores = ours(images, prompts).double()
    diff = (scores - torch.tensor(official["scores"], dtype=torch.float64)).abs()
    lengths = [len(ours.tokenizer(p)["input_ids"]) for p in prompts]
    print(f"pairs: {len(cases)} (sizes {', '.join(f'{w}x{h}' for w, h in SIZES)}); the official load left missing "
          f"{official['missing']}, unexpected {official['unexpected']}")
    print(f"token ids equal: {same_ids} of {len(cases)} prompts (vocabulary {official['vocab']} / {len(ours.tokenizer)}; "
          f"longest prompt {max(lengths)} tokens, cut at 35)")
    print("official:", " ".join(f"{s:.6f}" for s in official["scores"]))
    print("ours:    ", " ".join(f"{s:.6f}" for s in scores.tolist()))
    print(f"largest difference: {diff.max().item():.2e} (scores spread {float(np.std(official['scores'])):.3f})")
    ok = same_ids == len(cases) and diff.max().item() <= 1e-5
    print("equal to ImageReward's code (ids exactly, scores to 1e-5)" if ok else "DIFFERENT from ImageReward's code")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
