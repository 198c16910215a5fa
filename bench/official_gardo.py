"""`glm_grpo_nb.gardo` against GARDO's own code (tinnerhrhe/GARDO), run as written.

GARDO's code is not part of this project and is never installed by it: check out tinnerhrhe/GARDO yourself. Read:
`flow_grpo/stat_tracking.py` (imported as it is: numpy and torch), and from `scripts/train_sd3_grpo_gardo.py` the class
`RiskCompensator` and the training loop's inline pieces, each taken from the file by `ast` and executed as written:
the rank-uncertainty block (from `reward_std = []` to `reward_std = reward_std > threshold`), the gated KL statement
(`kl_loss = torch.mean(...)`) and the reference reset's condition. The script itself imports diffusers, wandb, timm and
its SD3 pipeline, which these pieces never touch.

Random rounds in float64: groups of G samples interleaved in the batch (sample i of prompt i mod P), continuous, tied
(three levels) and binary rewards, features with duplicate images, 20 rounds per case so the gate's fraction moves.
Compared: the advantages of both trackers (`PerPromptStatTracker(type='gardo')` and `PerPromptStatTrackerNFT`; the
script hands them float32 DINOv3 features, here float64 so both sides compute in the same precision), u, the gate's
fraction, threshold and mask, the KL over the gated samples, and when the reference is copied over 60 rounds of logged
KLs. Ties: the authors rank with torch's unstable sort; where rewards tie, the order it leaves them in is torch's choice
(on this CPU it does not keep the index order past a few dozen samples). So every round runs their block twice: as
written, reporting the share of gate decisions that differ from `ties="first"`, and with torch's sort made stable (their
block unchanged, `torch.sort` called with `stable=True`), which must agree. Their ranks are float32 (`ranks.float()`),
so the round's mean non-negative u is compared to float32's precision (relative 1e-6); everything else to 1e-9.

Run from the repository root:
    python -m bench.official_gardo --official PATH/GARDO
"""
import argparse
import ast
import copy
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace as NS

import numpy as np
import torch

from glm_grpo_nb.gardo import GateFraction, ReferenceReset, gardo_advantages, gated_step_kl, rank_uncertainty, uncertainty_gate

SCRIPT = "scripts/train_sd3_grpo_gardo.py"


def definitions(src: str, names: list[str]) -> str:
    "The named top-level classes and functions of a source, as written."
    keep = [n for n in ast.parse(src).body if getattr(n, "name", None) in names]
    assert {n.name for n in keep} == set(names), names
    return "\n\n".join(ast.get_source_segment(src, n) for n in keep)


def lines_between(src: str, first: str, last: str) -> str:
    "The script's lines from the one that is `first` to the one that is `last` (stripped), dedented."
    lines = src.splitlines()
    i = next(k for k, l in enumerate(lines) if l.strip() == first)
    j = next(k for k in range(i, len(lines)) if lines[k].strip() == last)
    return textwrap.dedent("\n".join(lines[i:j + 1]))


def statement(src: str, starts: str) -> str:
    "The one statement of the script that begins with `starts` (over its lines), dedented."
    nodes = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.stmt)
             and ast.get_source_segment(src, n).startswith(starts)]
    assert nodes, starts
    return textwrap.dedent(ast.get_source_segment(src, nodes[0]))


def condition(src: str, starts: str) -> str:
    "The test of the first `if` whose test begins with `starts`."
    for n in ast.walk(ast.parse(src)):
        if isinstance(n, ast.If) and ast.get_source_segment(src, n.test).startswith(starts):
            return ast.get_source_segment(src, n.test)
    raise AssertionError(starts)


def official(root: Path) -> NS:
    sys.path.insert(0, str(root))
    import flow_grpo.stat_tracking as st
    src = (root / SCRIPT).read_text()
    ns = {"np": np, "torch": torch}
    exec(definitions(src, ["RiskCompensator"]), ns)
    return NS(stat=st, RiskCompensator=ns["RiskCompensator"],
              ranks=compile(lines_between(src, "reward_std = []", "reward_std = reward_std > threshold"), SCRIPT, "exec"),
              kl=compile(statement(src, "kl_loss = torch.mean(") , SCRIPT, "exec"),
              reset=compile(condition(src, "(epoch !=0 and reset==True)"), SCRIPT, "eval"))


class StableSort:
    "torch, with `sort` keeping equal values in index order."
    def __getattr__(self, name): return getattr(torch, name)
    @staticmethod
    def sort(x, descending=False): return torch.sort(x, descending=descending, stable=True)


def rewards_of(kind: str, n: int, g: torch.Generator) -> torch.Tensor:
    if kind == "continuous": return torch.rand(n, generator=g, dtype=torch.float64)
    if kind == "tied": return torch.randint(0, 3, (n,), generator=g).double() / 2
    return torch.randint(0, 2, (n,), generator=g).double()


def compare_round(o: NS, kind: str, P: int, G: int, g: torch.Generator, controller, ours: GateFraction) -> dict:
    n = P * G
    prompts = [f"prompt {i % P}" for i in range(n)]                 # a group's samples anywhere in the batch
    proxy, aes, ir = (rewards_of(kind, n, g) for _ in range(3))
    feats = torch.randn(n, 16, generator=g, dtype=torch.float64)
    feats[1] = feats[1 + P]                                          # a duplicate image in one group
    T = 3                                                            # the script repeats the reward over its timesteps
    out = {}
    # advantages, both trackers
    adv_t = o.stat.PerPromptStatTracker().update(prompts, proxy[:, None].repeat(1, T).numpy(), feats.numpy(), type="gardo")
    adv_n, _ = o.stat.PerPromptStatTrackerNFT().update(prompts, proxy[:, None].repeat(1, T).numpy(), feats.numpy())
    adv, w, nov = gardo_advantages(proxy, prompts, feats)
    out["advantages (tracker)"] = np.abs(adv_t[:, 0] - adv.numpy()).max()
    out["advantages (NFT tracker)"] = np.abs(adv_n[:, 0] - adv.numpy()).max()
    # u, the fraction, the threshold and the gate: the script's block as written
    ns = {"torch": torch, "np": np, "config": NS(main_reward="proxy"), "dynamic_controller": controller,
          "gathered_rewards": {"aesthetic": aes.numpy(), "imagereward": ir.numpy(), "proxy": proxy.numpy()}}
    as_written = {**ns, "dynamic_controller": copy.deepcopy(controller)}
    exec(o.ranks, as_written)                                   # torch's unstable sort, as the script runs it
    stable = {**ns, "torch": StableSort()}
    exec(o.ranks, stable)                                       # the same block, ties kept in index order
    mask_theirs, threshold_theirs = stable["reward_std"], float(stable["threshold"])
    u = rank_uncertainty(proxy, [aes, ir], ties="first")
    p = ours.update(u)
    mask, threshold = uncertainty_gate(u, p)
    u_theirs = np.array(controller.risk_buffer[-1])   # the round's mean non-negative u, as the controller kept it
    out["risk (mean u >= 0), relative"] = abs(float(u_theirs) - ours.history[-1]) / max(1.0, abs(ours.history[-1]))
    out["fraction"] = abs(float(controller.beta) - p)
    out["threshold"] = abs(threshold_theirs - threshold) / max(1.0, abs(threshold))
    out["gate differs"] = float((mask_theirs.numpy() != mask.numpy()).mean())
    out["gate differs from the unstable sort's"] = float((as_written["reward_std"].numpy() != mask.numpy()).mean())
    # the KL over the gated samples, the script's statement as written
    mean = torch.randn(n, 4, 3, 3, generator=g, dtype=torch.float64)
    ref = mean + 0.1 * torch.randn(n, 4, 3, 3, generator=g, dtype=torch.float64)
    std = 0.2 + torch.rand(n, 1, 1, 1, generator=g, dtype=torch.float64)
    if mask.any():
        kns = {"torch": torch, "prev_sample_mean": mean, "prev_sample_mean_ref": ref, "std_dev_t": std, "idx": mask}
        exec(o.kl, kns)
        out["gated KL"] = abs(kns["kl_loss"].item() - gated_step_kl(mean, ref, std, mask).item())
    return out


def compare_resets(o: NS, rounds: int, g: torch.Generator, thres: float = 3e-4, freq: int = 15) -> int:
    "Rounds at which the reference is copied, the script's condition and state against ReferenceReset's: the differences."
    ours, theirs = ReferenceReset(thres, freq), []
    reset, prev_epoch, mine = False, 0, []
    for epoch in range(rounds):
        if eval(o.reset, {"epoch": epoch, "reset": reset, "prev_epoch": prev_epoch, "config": NS(reset_freq=freq)}):
            reset, prev_epoch = False, epoch
            theirs.append(epoch)
        if ours.start_of_round(epoch): mine.append(epoch)
        for _ in range(2):   # two optimiser steps a round, each logging a KL
            kl = float(10 ** (-5 + 1.6 * torch.rand((), generator=g)))
            if kl > thres: reset = True
            ours.after_step(kl)
    return len(set(theirs) ^ set(mine)), len(theirs)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--official", type=Path, required=True, help="a checkout of tinnerhrhe/GARDO")
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    o = official(args.official)
    worst, tied_gap = {}, []
    for a, kind in enumerate(("continuous", "tied", "binary")):
        for b, (P, G) in enumerate(((3, 4), (8, 24))):
            g = torch.Generator().manual_seed(10 * a + b)
            controller, ours = o.RiskCompensator(), GateFraction()
            for _ in range(args.rounds):
                r = compare_round(o, kind, P, G, g, controller, ours)
                for k, v in r.items():
                    key = f"{k} [{kind}]" if "unstable" in k else k
                    worst[key] = max(worst.get(key, 0.0), float(v))
    same = np.ones((8, 16))                                          # a group whose images are all the same
    prompts, r = ["a"] * 4 + ["b"] * 4, np.array([0.1, 0.5, 0.9, 0.3, 0.2, 0.4, 0.6, 0.8])
    theirs = o.stat.PerPromptStatTracker().update(prompts, r[:, None], same, type="gardo")[:, 0]
    ours_same = gardo_advantages(r, prompts, same)[0].numpy()
    print(f"identical images: their advantages {np.round(theirs, 3).tolist()}, ours {np.round(ours_same, 3).tolist()}")
    assert np.isnan(theirs).any() and np.isfinite(ours_same).all()
    diffs, copies = compare_resets(o, 60, torch.Generator().manual_seed(0))
    for k, v in worst.items(): print(f"{k:52s} largest difference {v:.1e}")
    print(f"reference copies over 60 rounds: {copies}, rounds that differ: {diffs}")
    exact = [k for k in worst if "unstable" not in k and "risk" not in k]
    assert all(worst[k] <= 1e-9 for k in exact), {k: worst[k] for k in exact}
    assert worst["risk (mean u >= 0), relative"] <= 1e-6 and diffs == 0
    print("equal: every figure to 1e-9 (the risk to float32's 1e-6), ties kept in index order as ties='first' keeps them")
