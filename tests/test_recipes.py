"""Each DiT objective as its authors run it, checked from their equations and recipes rather than from our code: the
noise levels each trains, the clip that only a second optimiser step per sampled batch can exercise, DGPO's trust
region against a lagging EMA, and its group weight leaving 1/2 at its defaults."""
import pytest
import torch

from glm_grpo_nb.config import GRPOConfig
from glm_grpo_nb.policy import GlmImagePolicy
from glm_grpo_nb.rewards import RednessReward
from glm_grpo_nb.trainer import GRPOTrainer

PROMPTS = ["a red square on a blue background", "a green circle on a white background", "a gradient from yellow to navy",
           "a 'HI' sign on a wall"]


def trainer(tiny_path, objective, **settings):
    policy = GlmImagePolicy.from_pretrained(tiny_path, ar_lora=4, dit_lora=4, device="cpu", lora_seed=0, verbose=False)
    kw = dict(group_size=4, prompts_per_step=2, height=64, width=64, lr=3e-3, seed=0, train_ar=False,
              diversity_warning=0.0)
    return GRPOTrainer(policy, RednessReward(), PROMPTS, dit_objective=objective, **{**kw, **settings})


def test_recipe_defaults():
    "What each objective resolves to when nothing is set: its authors' published values (configs named in 04a_objectives)."
    flow, guard, nft, awm, dgpo = (GRPOConfig(dit_objective=o) for o in ("flow_grpo", "grpo_guard", "nft", "awm", "dgpo"))
    assert (flow.dit_clip_range, flow.updates_per_batch, flow.kl_type) == (1e-4, 2, "mean")   # flow_grpo config/base.py, grpo.py
    assert (guard.dit_clip_range, guard.updates_per_batch) == (1e-4, 2)
    dppo = GRPOConfig(dit_objective="flow_dppo")   # verl-omni's flowdppo example: its Flow-GRPO settings, tau 1e-5
    assert (dppo.dppo_threshold, dppo.updates_per_batch, dppo.kl_type, dppo.guidance_scale) == (1e-5, 2, "mean", 1.5)
    assert (nft.updates_per_batch, nft.nft_decay_rate, nft.nft_decay_max, nft.guidance_scale) == (1, 0.001, 0.5, 1.0)
    assert (awm.dit_clip_range, awm.awm_weighting, awm.awm_ghuber_power, awm.awm_ema_coef) == (1.0, "ghuber", 0.25, 1.0)
    assert (awm.ema_decay_rate, awm.ema_decay_max, awm.updates_per_batch) == (0.001, 0.3, 1)
    assert (dgpo.dit_clip_range, dgpo.dgpo_reference, dgpo.dgpo_beta, dgpo.dgpo_trunc_steps) == (1e-2, "base", 100.0, 6)
    assert GRPOConfig(dit_objective="flow_grpo", sde_window_schedule="progressive").sde_window_every == 25   # MixGRPO
    # unset, a recipe value follows what it depends on; set, it stays
    assert GRPOConfig(prompts_per_step=3).updates_per_batch == 1 and flow.replace(dit_objective="awm").dit_clip_range == 1.0
    assert GRPOConfig(dit_clip_range=0.2).replace(dit_objective="awm").dit_clip_range == 0.2
    with pytest.raises(ValueError, match="not a multiple"): GRPOConfig(prompts_per_step=3, updates_per_batch=2)


@pytest.mark.parametrize("objective", ["nft", "awm", "dgpo"])
def test_each_objective_trains_its_recipes_noise_levels(tiny_path, objective):
    """AWM: one index in each stratum of [1, int(0.9 S)); DGPO: 0..trunc (0.6 S), pure noise included, without
    replacement; DiffusionNFT: the whole schedule. Over many steps' draws, each covers its support and nothing else."""
    t = trainer(tiny_path, objective, num_inference_steps=10)
    s = t.sample(step=0)
    obj, seen = t.objectives["dit"], set()
    for step in range(12):
        t.step_count = step   # the points of step `step`, without training
        idx = obj.prepare(s.trajectory)[0]["points"].sigma_index
        if objective == "dgpo": assert all(len(set(r)) == idx.shape[1] for r in idx.tolist())   # without replacement
        seen |= set(idx.flatten().tolist())
    want = {"nft": set(range(10)), "awm": set(range(1, 9)), "dgpo": set(range(7))}[objective]
    assert seen == want, (objective, sorted(seen))


def test_flow_grpo_clips_with_two_optimiser_steps(tiny_path):
    "Flow-GRPO's recipe: two optimiser steps per sampled batch, clip 1e-4; the second step's ratios leave the region."
    t = trainer(tiny_path, "flow_grpo", num_inference_steps=4, sde_window=(0, 2))
    m = t.step().metrics
    assert t.optimizer_steps == 2 and (m["dit/first_ratio_min"], m["dit/first_ratio_max"]) == (1.0, 1.0)
    assert m["dit/clip_fraction"] > 0 and (m["dit/ratio_max"] > 1 + 1e-4 or m["dit/ratio_min"] < 1 - 1e-4), m
    one = trainer(tiny_path, "flow_grpo", num_inference_steps=4, sde_window=(0, 2), updates_per_batch=1).step().metrics
    assert one["dit/clip_fraction"] == 0.0   # one step per batch: every ratio is 1, the clip never acts


def test_dgpo_trust_region_and_group_weight(tiny_path):
    """DGPO at one inner epoch and one optimiser step per batch: once the fast EMA lags the adapter, samples whose
    matching-error ratio against the EMA leaves 1 ± c are frozen; and against the base reference (beta 100) the groups'
    weights sigmoid(S_g) spread away from 1/2 within a few steps."""
    t = trainer(tiny_path, "dgpo", num_inference_steps=6, dgpo_timesteps=2, lr=3e-2, ema_decay_rate=0.1)
    rows = [t.step().metrics for _ in range(4)]
    assert rows[0]["dit/frozen_fraction"] == 0.0   # the EMA starts as the adapter
    assert max(r["dit/frozen_fraction"] for r in rows[1:]) > 0, [r["dit/frozen_fraction"] for r in rows]
    assert rows[0]["dit/group_weight_min"] == rows[0]["dit/group_weight_max"] == 0.5   # LoRA's B = 0: the base itself
    spread = max(r["dit/group_weight_max"] - r["dit/group_weight_min"] for r in rows[1:])
    assert spread > 0.05, [(r["dit/group_weight_min"], r["dit/group_weight_max"]) for r in rows]
    # the EMA follows after every optimiser step, its decay from the optimiser steps counted (the authors' global_step)
    assert [r["dit/ema_decay"] for r in rows] == [pytest.approx(min(0.3, 0.1 * k)) for k in range(1, 5)]


def test_kl_mean_is_flow_grpos_form(tiny_path):
    """kl_type='mean' is Flow-GRPO's code, |mu - mu_ref|^2 / (2 s^2) with s its std_dev_t (so its beta of 0.04 carries
    over); 'exact' is the step's Gaussian KL, / (2 s^2 |dt|): on one stochastic step the two differ by exactly |dt|."""
    kls = {}
    for kind in ("mean", "exact"):
        t = trainer(tiny_path, "flow_grpo", num_inference_steps=4, sde_window=[1], kl_coef=0.04, kl_type=kind,
                    updates_per_batch=1)
        t.step()   # LoRA's B starts at 0: the policy is the reference, KL 0 and no KL gradient, so both runs stay equal
        s = t.sample()
        kls[kind] = t.step().metrics["dit/kl"]
    dt = (s.trajectory.sigmas[2] - s.trajectory.sigmas[1]).abs().item()
    assert kls["mean"] > 0 and kls["mean"] == pytest.approx(kls["exact"] * dt, rel=1e-5), (kls, dt)


def test_mixgrpo_flash_trains(tiny_path):
    """MixGRPO-Flash (ode_solver='flash'): the window's steps sample and train as before (first ratios 1), the tail after it
    takes int(0.4 (S - last)) - 1 second-order steps; an objective without a window refuses it."""
    t = trainer(tiny_path, "flow_grpo", num_inference_steps=10, sde_window=(0, 2), sde_window_schedule="progressive",
                ode_solver="flash")
    s = t.sample(step=0)
    assert s.trajectory.num_steps == 2 + int(0.4 * 8) - 1 and s.trajectory.window == [0, 1]
    m = t.step().metrics
    assert not m["skipped"] and m["dit/first_ratio_min"] == m["dit/first_ratio_max"] == 1.0 and m["dit/grad_norm"] > 0
    with pytest.raises(ValueError, match="has no window"): GRPOConfig(dit_objective="nft", ode_solver="flash")
    with pytest.raises(ValueError, match="flash_compress must be in"): GRPOConfig(flash_compress=0.0)
