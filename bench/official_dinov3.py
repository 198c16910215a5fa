"""`gardo.DINOv3Features` and `gardo.dinov3_pixels` against timm's DINOv3, the model and transform GARDO's authors use.

GARDO's scripts take the novelty's features with timm: `timm.create_model('vit_large_patch16_dinov3.lvd1689m')`, its
eval transform from `timm.data.resolve_model_data_config` (256x256, bicubic, crop 1.0, ImageNet mean and std), and the
model's output (the `avg` pool: the patch tokens' mean after the final norm, the class and 4 register tokens left out).
We run transformers' DINOv3 classes instead. timm is never installed by this project: put it (and a torchvision, which
it imports) on a path of its own, e.g.
    pip install --target /tmp/timm_side --no-deps timm torchvision
and pass that path. The benchmark calls no torchvision operator; a torchvision wheel built for another torch fails
while registering its operators on import (`operator torchvision::nms does not exist`): empty that side copy's
`torchvision/_meta_registrations.py` (the registrations only) and it imports.

Compared, on random weights at a small size (timm's architecture with embed_dim 64, depth 2, 2 heads; transformers'
DINOv3ViTModel with the same weights, mapped name by name, q/k/v split from timm's fused qkv, no qkv bias as timm's
lvd1689m): the pixels timm's transform makes from [0, 1] tensors and `dinov3_pixels` makes from the same images as PIL
(square, landscape, portrait, odd sizes), and the features both models give for them.

Run from the repository root:
    python -m bench.official_dinov3 --timm /tmp/timm_side
"""
import argparse
import sys

import numpy as np
import torch
from PIL import Image

from glm_grpo_nb.gardo import DINOv3Features, dinov3_pixels


def timm_to_transformers(sd: dict, layers: int, dim: int) -> dict:
    "timm's Eva (DINOv3) state dict as transformers' DINOv3ViTModel's."
    out = {"embeddings.cls_token": sd["cls_token"], "embeddings.register_tokens": sd["reg_token"],
           "embeddings.mask_token": torch.zeros(1, 1, dim), "embeddings.patch_embeddings.weight": sd["patch_embed.proj.weight"],
           "embeddings.patch_embeddings.bias": sd["patch_embed.proj.bias"], "norm.weight": sd["norm.weight"], "norm.bias": sd["norm.bias"]}
    pairs = {"norm1": "norm1", "norm2": "norm2", "attn.proj": "attention.o_proj", "mlp.fc1": "mlp.up_proj", "mlp.fc2": "mlp.down_proj"}
    for i in range(layers):
        b, o = f"blocks.{i}.", f"model.layer.{i}."
        for t, h in pairs.items():
            for kind in ("weight", "bias"): out[f"{o}{h}.{kind}"] = sd[f"{b}{t}.{kind}"]
        q, k, v = sd[b + "attn.qkv.weight"].chunk(3)
        out.update({o + "attention.q_proj.weight": q, o + "attention.k_proj.weight": k, o + "attention.v_proj.weight": v,
                    o + "layer_scale1.lambda1": sd[b + "gamma_1"], o + "layer_scale2.lambda1": sd[b + "gamma_2"]})
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timm", required=True, help="a folder holding timm (and torchvision), not installed here")
    a = ap.parse_args()
    sys.path.insert(0, a.timm)
    import timm
    from transformers import DINOv3ViTConfig, DINOv3ViTModel
    torch.manual_seed(0)
    D, L, H = 64, 2, 2
    t = timm.create_model("vit_large_patch16_dinov3.lvd1689m", pretrained=False, img_size=256, depth=L, embed_dim=D, num_heads=H).eval()
    with torch.no_grad():
        for p in t.parameters(): p.normal_(0, 0.2)   # far from the init: every weight matters
    transform = timm.data.create_transform(**timm.data.resolve_model_data_config(t), is_training=False)
    m = DINOv3ViTModel(DINOv3ViTConfig(hidden_size=D, num_attention_heads=H, num_hidden_layers=L, intermediate_size=4 * D,
                                       num_register_tokens=t.num_prefix_tokens - 1, image_size=256, query_bias=False,
                                       key_bias=False, value_bias=False, rope_theta=100.0))
    m.load_state_dict(timm_to_transformers(t.state_dict(), L, D), strict=True)   # every tensor, by name
    ours = DINOv3Features.from_model(m, device="cpu")
    rng, worst_px, worst_f = np.random.default_rng(0), 0.0, 0.0
    for w, h in ((64, 64), (1024, 1024), (512, 384), (301, 517), (1000, 300), (255, 257)):
        ims = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for _ in range(2)]
        x = torch.stack([torch.from_numpy(np.asarray(im, dtype=np.float32) / 255).permute(2, 0, 1) for im in ims])
        theirs_px, ours_px = transform(x), dinov3_pixels(ims)
        with torch.no_grad(): theirs_f = t(theirs_px)
        ours_f = ours(ims)
        px, f = (theirs_px - ours_px).abs().max().item(), (theirs_f.double() - ours_f).abs().max().item()
        worst_px, worst_f = max(worst_px, px), max(worst_f, f)
        print(f"{w}x{h}: pixels largest difference {px:.1e}, features {f:.1e} (largest feature {theirs_f.abs().max().item():.2f})")
    print(f"timm {timm.__version__}: pixels equal to {worst_px:.1e}, features to {worst_f:.1e}")
    assert worst_px == 0.0 and worst_f < 1e-5
