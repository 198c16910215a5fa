"""`loss.flow_dppo_loss` against verl-omni's `FlowDPPOLoss.compute_loss`, run as written.

verl-omni's code is not part of this project and is never installed by it: check out verl-project/verl-omni yourself
(only `verl_omni/trainer/diffusion/diffusion_algos.py` is read). Its module imports verl, tensordict and omegaconf for
the trainer's plumbing; the loss itself needs only torch, so the definitions it runs (`DiffusionLossResult`,
`_format_available_keys`, `DiffusionLossFn`, `FlowDPPOLoss`) are taken from the file as written and executed with torch
alone, the plumbing's names standing in as annotations. Its config is the one stand-in: an object holding
`diffusion_loss.kl_mask_threshold` and `add_kl_coefficient=True` (its example's values).

Random cases in float64: B entries of latents [B, 4, 8, 8], the step's std_dev_t [B, 1, 1, 1] and sqrt(-dt) [B] as
verl-omni takes them (ours is given their product, the transition std), mean shifts drawn so that the divergence D
spreads over three decades either side of tau, a quarter of the ratios exactly 1 and a quarter of the advantages
exactly 0, tau 1e-5 (verl-omni's and UniRL's) and 1e-6 (Flow-Factory's examples). Compared: the loss, its gradient
with respect to the log-probs, and the metrics both report (dropped share, share past tau, D's mean and max, ratio
mean, min and max).

Run from the repository root:
    python -m bench.official_flow_dppo --official PATH/verl-omni
"""
import argparse
import ast
from pathlib import Path
from types import SimpleNamespace as NS

import torch

from glm_grpo_nb.loss import flow_dppo_loss

NAMES = ["DiffusionLossResult", "_format_available_keys", "DiffusionLossFn", "FlowDPPOLoss"]


def definitions(path: Path, names: list[str]) -> str:
    "The named top-level classes and functions of a file, as written (decorators left out)."
    src = path.read_text()
    keep = [n for n in ast.parse(src).body if getattr(n, "name", None) in names]
    assert {n.name for n in keep} == set(names), (path, names)
    return "\n\n".join(ast.get_source_segment(src, n) for n in keep)


def official(root: Path):
    "verl-omni's FlowDPPOLoss class, from its file."
    from abc import ABC, abstractmethod
    from dataclasses import dataclass
    from typing import Any, Callable, Optional
    ns = dict(torch=torch, ABC=ABC, abstractmethod=abstractmethod, dataclass=dataclass, Any=Any, Callable=Callable,
              Optional=Optional, DataProto=object, TensorDict=object, DiffusionActorConfig=object)
    exec(definitions(root / "verl_omni/trainer/diffusion/diffusion_algos.py", NAMES), ns)
    return ns["FlowDPPOLoss"]


def case(seed: int, B: int, tau: float):
    g = torch.Generator().manual_seed(seed)
    f64 = dict(dtype=torch.float64)
    std_dev_t = (0.2 + torch.rand(B, 1, 1, 1, generator=g, **f64))
    sqrt_dt = (0.05 + 0.3 * torch.rand(B, generator=g, **f64))
    sigma = std_dev_t.flatten() * sqrt_dt
    old_mean = torch.randn(B, 4, 8, 8, generator=g, **f64)
    # a shift whose D = mean(shift^2) / (2 sigma^2) lands around tau, three decades either side
    target = tau * 10 ** (6 * torch.rand(B, generator=g, **f64) - 3)
    direction = torch.randn(B, 4, 8, 8, generator=g, **f64)
    direction = direction / direction.pow(2).mean(dim=(1, 2, 3), keepdim=True).sqrt()
    mean = old_mean + direction * (2 * target * sigma ** 2).sqrt()[:, None, None, None]
    old_lp = torch.randn(B, generator=g, **f64)
    lp = old_lp + 0.05 * torch.randn(B, generator=g, **f64)
    same = torch.rand(B, generator=g) < 0.25
    lp[same] = old_lp[same]                                   # ratios of exactly 1
    adv = torch.randn(B, generator=g, **f64)
    adv[torch.rand(B, generator=g) < 0.25] = 0.0              # advantages of exactly 0
    return dict(lp=lp, old_lp=old_lp, mean=mean, old_mean=old_mean, std_dev_t=std_dev_t, sqrt_dt=sqrt_dt, sigma=sigma,
                adv=adv)


def compare(FlowDPPOLoss, c: dict, tau: float) -> dict:
    config = NS(diffusion_loss=NS(kl_mask_threshold=tau, add_kl_coefficient=True))
    lp_theirs, lp_ours = c["lp"].clone().requires_grad_(), c["lp"].clone().requires_grad_()
    theirs, tm = FlowDPPOLoss.compute_loss(old_log_prob=c["old_lp"], log_prob=lp_theirs, advantages=c["adv"], config=config,
                                           old_prev_sample_mean=c["old_mean"], prev_sample_mean=c["mean"],
                                           std_dev_t=c["std_dev_t"], sqrt_dt=c["sqrt_dt"])
    ours, om = flow_dppo_loss(lp_ours, c["old_lp"], c["mean"], c["old_mean"], c["sigma"], c["adv"], threshold=tau)
    theirs.backward(); ours.backward()
    pairs = {"dropped share": ("actor/masked_fraction", "dppo_mask_fraction"),
             "share past tau": ("actor/kl_mask_fraction", "dppo_divergent_fraction"),
             "D mean": ("actor/kl_new_old_mean", "dppo_divergence_mean"),
             "D max": ("actor/kl_new_old_max", "dppo_divergence_max"),
             "ratio mean": ("actor/ratio_mean", "ratio_mean"), "ratio min": ("actor/ratio_min", "ratio_min"),
             "ratio max": ("actor/ratio_max", "ratio_max")}
    out = {"loss": (theirs.item(), ours.item()), "largest gradient gap": (lp_theirs.grad - lp_ours.grad).abs().max().item()}
    out.update({k: (tm[a], om[b]) for k, (a, b) in pairs.items()})
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--official", type=Path, required=True, help="a checkout of verl-project/verl-omni")
    ap.add_argument("--entries", type=int, default=4096)
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()
    FlowDPPOLoss = official(args.official)
    worst = 0.0
    for tau in (1e-5, 1e-6):
        for seed in range(args.seeds):
            r = compare(FlowDPPOLoss, case(seed, args.entries, tau), tau)
            gaps = [abs(a - b) for k, (a, b) in ((k, v) for k, v in r.items() if k != "largest gradient gap")]
            worst = max(worst, max(gaps), r["largest gradient gap"])
            print(f"tau {tau:.0e} seed {seed}: loss {r['loss'][0]:+.12f} (ours {r['loss'][1]:+.12f}), dropped "
                  f"{r['dropped share'][0]:.4f} ({r['dropped share'][1]:.4f}), past tau {r['share past tau'][0]:.4f}, "
                  f"largest gap in any figure {max(gaps):.1e}, in the gradient {r['largest gradient gap']:.1e}")
    print(f"largest difference over all cases: {worst:.1e}")
    assert worst <= 1e-9, worst
