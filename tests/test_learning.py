"""Learning check: on the tiny GLM-Image, GRPO with a redness reward raises the reward, for AR-only, DiT-only and joint
training, and DiT-only with GRPO-Guard, Flow-DPPO and DiffusionNFT (at the learning rates `bench.learning` found for them; both rise
on all three seeds measured in BENCHMARKS.md, AWM and DGPO on only some, so their learning is shown on the 1-D flows of
`01d_matching` instead). Mean reward of the last steps against the first steps."""
import pytest

from glm_grpo_nb.rewards import RednessReward
from glm_grpo_nb.trainer import GRPOTrainer
from glm_grpo_nb.policy import GlmImagePolicy

PROMPTS = ["a blue square on a white background", "a green circle on a gray background", "a gradient from navy to teal",
           "the word 'OK' in white on blue", "green on the left, black on the right", "a cyan field"]
STEPS, WINDOW = 24, 6

# The tiny model's adapters need larger steps than the real model's (the trainer's default lr is 1e-4).
SETTINGS = {
    "ar": dict(train_ar=True, train_dit=False, ar_lr=3e-3),
    "dit": dict(train_ar=False, train_dit=True, dit_lr=1e-2),
    "joint": dict(train_ar=True, train_dit=True, ar_lr=3e-3, dit_lr=3e-3),
    "dit grpo_guard": dict(train_ar=False, dit_objective="grpo_guard", dit_lr=1e-1),
    # two passes over each batch: the second is off-policy, where the divergence mask acts (one is on-policy, where
    # Flow-DPPO's gradient is Flow-GRPO's)
    "dit flow_dppo": dict(train_ar=False, dit_objective="flow_dppo", dit_lr=1e-2, num_inner_epochs=2),
    "dit nft": dict(train_ar=False, dit_objective="nft", dit_lr=1e-2),
}


def run(tiny_path, which, seed):
    policy = GlmImagePolicy.from_pretrained(tiny_path, ar_lora=8, dit_lora=8, device="cpu", lora_seed=seed, verbose=False)
    trainer = GRPOTrainer(policy, RednessReward(), PROMPTS, group_size=4, prompts_per_step=3, height=64, width=64,
                          num_inference_steps=6, sde_window=(0, 3), seed=seed, **SETTINGS[which])
    return trainer.fit(STEPS, progress=False)


@pytest.mark.parametrize("which", list(SETTINGS))
def test_reward_rises(tiny_path, which):
    seed = 1
    history = run(tiny_path, which, seed)
    rewards = [h["reward_mean"] for h in history]
    if "flow_dppo" in which: assert max(h["dit/dppo_mask_fraction"] for h in history) > 0.1   # the mask acted
    first, last = sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW
    print(f"{which}: first {first:.3f} last {last:.3f}")
    assert last > first + 0.1, f"{which}: reward did not rise enough ({first:.3f} -> {last:.3f}); per step {rewards}"
