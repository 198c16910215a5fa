"""`hpsv3` (`glm_grpo_nb.preference_rewards.HPSv3Reward`) against HPSv3's own scoring code, run as written.

HPSv3's code is not part of this project and is never installed by it: check out MizzenAI/HPSv3 yourself and make a
virtualenv where its model imports (torch, torchvision, transformers 4.52 or later: its reward forward reads
`self.model.language_model`, which older versions lack; run here with 4.55.4). Its training code imports trl,
deepspeed, tensorboard and more; only what scoring runs is taken from its files, each definition as written:
`Qwen2VLRewardModelBT` (hpsv3/model/qwen2vl_trainer.py), `create_model_and_processor` (hpsv3/train.py),
`HPSv3RewardInferencer` (hpsv3/inference.py), the instruction and prompt strings (hpsv3/dataset/data_collator_qwen.py)
and `process_vision_info` with its helpers (hpsv3/dataset/utils.py, imported whole). Its config parser is the one
stand-in: it hands `create_model_and_processor` the values of config/HPSv3_7B.yaml (ranknet head, output (μ, σ),
the <|Reward|> token, SDPA), in float32 instead of bf16 so that the comparison is exact. Its trl helpers answer as
trl does without quantisation (no quantisation config, so no device map).

The model is a tiny random Qwen2-VL made by `glm_grpo_nb.tiny_rewards.make_tiny_hpsv3`: HPSv3.safetensors in the
released checkpoint's key layout (visual.*, model.*, as transformers before 4.52 names them), and backbone/ with
Qwen2-VL-7B-Instruct's config.json format, a byte-level BPE tokenizer with Qwen2-VL's special tokens and chat
template, and its image processor's settings. HPSv3's `from_pretrained` needs backbone weights (all overwritten by
its strict load of the checkpoint); random ones are written beside a copy of backbone/ for it. Each image–prompt
pair is scored by its `reward(image_paths, prompts)`, four at a time (right padding), and by this package from the
same files; token ids and (μ, σ) are compared.

Run from the repository root:
    python -m bench.official_hpsv3 --official PATH/HPSv3 --python PATH/venv/bin/python
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

from bench.official_hpsv2 import SIZES, write_cases

OFFICIAL = r'''
import ast, json, shutil, sys, torch
from pathlib import Path
from types import SimpleNamespace as NS
root, work = Path(sys.argv[1]), Path(sys.argv[2])

def definitions(path, names):
    "The named top-level functions, classes and assignments of a file, as written."
    src = path.read_text()
    keep = [n for n in ast.parse(src).body if getattr(n, "name", None) in names
            or isinstance(n, ast.Assign) and any(getattr(t, "id", None) in names for t in n.targets)]
    assert {getattr(n, "name", None) or n.targets[0].id for n in keep} == set(names), (path, names)
    return "\n\n".join(ast.get_source_segment(src, n) for n in keep)

sys.path.insert(0, str(root))
import importlib.util
spec = importlib.util.spec_from_file_location("hpsv3_dataset_utils", root / "hpsv3/dataset/utils.py")
utils = importlib.util.module_from_spec(spec); spec.loader.exec_module(utils)   # HPSv3's own vision helpers, whole

import os, huggingface_hub, transformers
from collections.abc import Mapping
from typing import List, Optional
from torch import nn
from transformers import AutoProcessor, Qwen2VLForConditionalGeneration
ns = dict(os=os, torch=torch, nn=nn, List=List, Optional=Optional, Mapping=Mapping, huggingface_hub=huggingface_hub,
          AutoProcessor=AutoProcessor, Qwen2VLForConditionalGeneration=Qwen2VLForConditionalGeneration,
          process_vision_info=utils.process_vision_info, flash_attn=None,
          get_quantization_config=lambda model_config: None, get_kbit_device_map=lambda: None)
exec(definitions(root / "hpsv3/dataset/data_collator_qwen.py", ["INSTRUCTION", "prompt_with_special_token", "prompt_without_special_token"]), ns)
exec(definitions(root / "hpsv3/model/qwen2vl_trainer.py", ["Qwen2VLRewardModelBT"]), ns)
exec(definitions(root / "hpsv3/train.py", ["create_model_and_processor"]), ns)
exec(definitions(root / "hpsv3/inference.py", ["HPSv3RewardInferencer"]), ns)

backbone = work / "backbone"   # the tiny backbone's files and random weights for `from_pretrained`
shutil.copytree(work / "h3" / "backbone", backbone)
torch.manual_seed(1)
Qwen2VLForConditionalGeneration(transformers.AutoConfig.from_pretrained(backbone)).save_pretrained(backbone)
model_config = NS(torch_dtype="float32", model_revision="main", model_name_or_path=str(backbone), use_special_tokens=True,
                  output_dim=2, reward_token="special", rm_head_type="ranknet", rm_head_kwargs=None)   # HPSv3_7B.yaml, float32
training_args = NS(output_dir="output_models", disable_flash_attn2=True, bf16=False, fp16=False)
ns["parse_args_with_yaml"] = lambda classes, path, is_train: ((NS(), training_args, model_config, NS(lora_enable=False)), path)
ns.update(DataConfig=None, TrainingConfig=None, ModelConfig=None, PEFTLoraConfig=None)
inferencer = ns["HPSv3RewardInferencer"]("config/HPSv3_7B.yaml", str(work / "h3" / "HPSv3.safetensors"), device="cpu")

cases = json.loads((work / "cases.json").read_text())
out, ids, mrope = [], [], []
with torch.no_grad():
    for i in range(0, len(cases), 4):
        paths, prompts = [c[0] for c in cases[i:i + 4]], [c[1] for c in cases[i:i + 4]]
        out += inferencer.reward(paths, prompts).tolist()
        batch = inferencer.prepare_batch(paths, prompts)
        ids += [row[m.bool()].tolist() for row, m in zip(batch["input_ids"], batch["attention_mask"])]
        # for reference only: Qwen2-VL's own forward, which gives the image tokens 3-D (M-RoPE) positions
        model = inferencer.model
        hidden = Qwen2VLForConditionalGeneration.forward(model, **batch, output_hidden_states=True).hidden_states[-1]
        at = batch["input_ids"] == model.special_token_ids[0]
        mrope += model.rm_head(hidden[at])[:, 0].tolist()
json.dump({"out": out, "ids": ids, "mrope": mrope, "transformers": transformers.__version__,
           "vocab": len(inferencer.processor.tokenizer)}, open(work / "official.json", "w"))
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--official", required=True, help="a checkout of MizzenAI/HPSv3 (the folder holding hpsv3/)")
    ap.add_argument("--python", required=True, help="the Python of a virtualenv where HPSv3's model imports")
    args = ap.parse_args()
    import torch

    from glm_grpo_nb.preference_rewards import HPSv3Reward
    from glm_grpo_nb.tiny_rewards import make_tiny_hpsv3
    work = Path(tempfile.mkdtemp())
    tiny = make_tiny_hpsv3(work / "h3")
    cases = write_cases(work)
    subprocess.run([args.python, "-c", OFFICIAL, args.official, str(work)], check=True)
    official = json.loads((work / "official.json").read_text())

    ours = HPSv3Reward(str(tiny), backbone=str(tiny / "backbone"), device="cpu", dtype=torch.float32, batch_size=4)
    images, prompts = [Image.open(p) for p, _ in cases], [q for _, q in cases]
    ids = []
    for i in range(0, len(cases), 4):
        b = ours.inputs(images[i:i + 4], prompts[i:i + 4])
        ids += [row[m.bool()].tolist() for row, m in zip(b["input_ids"], b["attention_mask"])]
    same_ids = sum(a == b for a, b in zip(official["ids"], ids))
    mu = ours(images, prompts).double()
    sigma = ours.last_info["sigma"].double()
    theirs = torch.tensor(official["out"], dtype=torch.float64)
    diff = max((mu - theirs[:, 0]).abs().max().item(), (sigma - theirs[:, 1]).abs().max().item())
    mrope = (torch.tensor(official["mrope"], dtype=torch.float64) - theirs[:, 0]).abs().max().item()
    print(f"pairs: {len(cases)} (sizes {', '.join(f'{w}x{h}' for w, h in SIZES)}); official code on transformers "
          f"{official['transformers']}, vocabulary {official['vocab']} / {len(ours.tokenizer)}")
    print(f"token ids equal: {same_ids} of {len(cases)} pairs (lengths {min(map(len, ids))}–{max(map(len, ids))} tokens)")
    print("official μ:", " ".join(f"{s:.6f}" for s in theirs[:, 0].tolist()))
    print("ours μ:    ", " ".join(f"{s:.6f}" for s in mu.tolist()))
    print(f"largest difference of μ and σ: {diff:.2e} (μ spread {theirs[:, 0].std().item():.3f})")
    print(f"for reference, Qwen2-VL's own forward (M-RoPE positions for the image) is {mrope:.3f} away from HPSv3's forward")
    ok = same_ids == len(cases) and diff <= 1e-5
    print("equal to HPSv3's code (ids exactly, μ and σ to 1e-5)" if ok else "DIFFERENT from HPSv3's code")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
