"""Adapters anyone can load: a process that never imports glm_grpo_nb loads the AR adapter with peft's
`PeftModel.from_pretrained` and the DiT adapter with diffusers' `load_lora_adapter(folder)` (no arguments), and every
adapted layer then gives the trained policy's outputs, with a LoRA scale other than 1 on the DiT."""
import subprocess
import sys
import textwrap
import zlib

import torch
from peft import LoraConfig
from safetensors.torch import load_file

from conftest import clean_env

from glm_grpo_nb.hub import DIT_LORA_TARGETS
from glm_grpo_nb.policy import GlmImagePolicy

OUTSIDE = textwrap.dedent('''
    import sys, zlib
    import torch
    from safetensors.torch import save_file
    from diffusers import GlmImageTransformer2DModel
    from peft import PeftModel
    from transformers import GlmImageForConditionalGeneration
    model, adapters, out = sys.argv[1:4]
    dit = GlmImageTransformer2DModel.from_pretrained(model, subfolder="transformer")
    dit.load_lora_adapter(adapters + "/dit")                      # no weight_name, no prefix, no config: the defaults
    ar = GlmImageForConditionalGeneration.from_pretrained(model, subfolder="vision_language_encoder")
    ar = PeftModel.from_pretrained(ar, adapters + "/ar")
    outputs = {}
    with torch.no_grad():
        for tag, root in (("dit", dit), ("ar", ar)):
            for name, m in root.named_modules():
                if hasattr(m, "lora_A") and len(m.lora_A):
                    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
                    outputs[f"{tag}/{name}"] = m(torch.randn(3, m.in_features, generator=g)).contiguous()
    assert not [k for k in sys.modules if k.startswith("glm_grpo_nb")], "the loaders must not need glm_grpo_nb"
    save_file(outputs, out)
''')


def test_adapters_load_without_this_package(tiny_path, tmp_path):
    dit_cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=DIT_LORA_TARGETS)   # scale 2, not 1
    policy = GlmImagePolicy.from_pretrained(tiny_path, ar_lora=4, dit_lora=dit_cfg, device="cpu", verbose=False)
    with torch.no_grad():   # trained-looking adapters: B away from its zero start
        g = torch.Generator().manual_seed(0)
        for n, p in policy.named_parameters():
            if p.requires_grad: p.add_(0.05 * torch.randn(p.shape, generator=g))
    adapters = policy.save_adapters(tmp_path / "adapters")
    assert sorted(p.name for p in (adapters / "dit").iterdir() if p.suffix in (".bin", ".safetensors")) == [
        "pytorch_lora_weights.bin", "pytorch_lora_weights.safetensors"]
    r = subprocess.run([sys.executable, "-c", OUTSIDE, str(tiny_path), str(adapters), str(tmp_path / "outside.safetensors")],
                       capture_output=True, text=True, env=clean_env(), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    outside = load_file(tmp_path / "outside.safetensors")
    assert sum(k.startswith("dit/") for k in outside) > 4 and sum(k.startswith("ar/") for k in outside) > 4
    roots = {"dit": policy.transformer, "ar": policy.ar_peft}
    ours = {f"{tag}/{n}": m for tag, root in roots.items() for n, m in root.named_modules()
            if hasattr(m, "lora_A") and len(m.lora_A)}
    assert outside.keys() == ours.keys()
    with torch.no_grad():
        for key, m in ours.items():
            x = torch.randn(3, m.in_features, generator=torch.Generator().manual_seed(zlib.crc32(key.split("/", 1)[1].encode())))
            mine = m(x)
            assert torch.allclose(outside[key], mine, atol=1e-5), (key, (outside[key] - mine).abs().max())
            assert not torch.allclose(m.base_layer(x), mine, atol=1e-3), key   # the adapter changes the layer
