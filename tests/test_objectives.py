"""Every DiT objective resumes bit-exactly (its own state included: DiffusionNFT's old adapter, the EMA adapter of AWM and
DGPO, the position of a moving window) and, when a step fails after its update, is put back as it was."""
import pytest
import torch

from glm_grpo_nb.config import DIT_OBJECTIVES
from glm_grpo_nb.policy import GlmImagePolicy
from glm_grpo_nb.rewards import RednessReward
from glm_grpo_nb.trainer import GRPOTrainer

PROMPTS = ["a red square on a blue background", "a green circle on a white background", "a gradient from yellow to navy"]
SETTINGS = dict(group_size=2, prompts_per_step=2, height=64, width=64, num_inference_steps=4, lr=3e-3, seed=0,
                kl_coef=0.05, micro_batch_size=3, num_inner_epochs=2)
OWN = {"flow_grpo": dict(sde_window=(0, 2), sde_window_schedule="progressive"),
       "grpo_guard": dict(sde_window=(0, 2), sde_window_schedule="random", sde_window_every=2),
       "flow_dppo": dict(sde_window=(0, 2), dppo_threshold=1e-7),   # a small tau: steps are dropped from the first update
       "nft": dict(nft_timesteps=2, nft_decay_rate=0.2),
       "awm": dict(awm_timesteps=2, awm_ema_coef=0.1, ema_decay_rate=0.2, awm_weighting="ghuber"),
       "dgpo": dict(dgpo_timesteps=2, ema_decay_rate=0.2),
       "dpo": dict(dpo_timesteps=2, ar_objective="dpo", micro_batch_size=2)}   # whole groups per micro-batch


def trainer(tiny_path, objective, **more):
    policy = GlmImagePolicy.from_pretrained(tiny_path, ar_lora=4, dit_lora=4, device="cpu", lora_seed=0, verbose=False)
    return GRPOTrainer(policy, RednessReward(), PROMPTS, dit_objective=objective, **{**SETTINGS, **OWN[objective]}, **more)


def state(t):
    "The adapters and the DiT objective's own tensors."
    own = {f"{f}/{n}": w.clone() for f, ts in t.objectives["dit"].checkpoint_tensors().items() for n, w in ts.items()}
    return {**{n: p.detach().clone() for n, p in t.policy.named_parameters() if p.requires_grad}, **own}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("objective", DIT_OBJECTIVES)
def test_resume_is_exact(tiny_path, tmp_path, objective):
    straight = trainer(tiny_path, objective)
    straight.fit(3, progress=False)
    first = trainer(tiny_path, objective, output_dir=tmp_path / "run", save_every=2)
    first.fit(2, progress=False)
    first.close()
    policy = GlmImagePolicy.from_pretrained(tiny_path, ar_lora=4, dit_lora=4, device="cpu", lora_seed=5, verbose=False)
    resumed = GRPOTrainer.resume(tmp_path / "run", policy, RednessReward(), PROMPTS)
    resumed.fit(1, progress=False)
    assert same(state(straight), state(resumed))
    assert resumed.history[-1]["reward_mean"] == straight.history[-1]["reward_mean"]
    if "sde_window_schedule" in OWN[objective]:   # the window continued where it was
        assert resumed.history[-1]["sde_window_start"] == straight.history[-1]["sde_window_start"]
    resumed.close()


@pytest.mark.parametrize("objective", DIT_OBJECTIVES)
def test_a_failed_step_restores_the_objective(tiny_path, tmp_path, objective):
    "metrics.jsonl cannot be written after the update: the adapters and the objective's state are as before the step."
    t = trainer(tiny_path, objective, output_dir=tmp_path / "run")
    t.step()
    before = state(t)
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.unlink(); metrics.mkdir()   # opening it for appending now fails
    with pytest.raises(OSError): t.step()
    assert same(before, state(t)) and t.step_count == 1
    t.close()


@pytest.mark.parametrize("objective", ["flow_grpo", "nft", "dgpo"])
def test_bf16_base_trains_float32_adapters(tiny_path, objective):
    "On a bf16 base the adapters, their optimiser state and the objective's copies are float32, so steps below bf16's resolution count."
    policy = GlmImagePolicy.from_pretrained(tiny_path, ar_lora=4, dit_lora=4, torch_dtype=torch.bfloat16, device="cpu", verbose=False)
    lora = lambda: {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad and "transformer." in n}
    trainer = GRPOTrainer(policy, RednessReward(), ["a red square", "a blue field"], group_size=2, prompts_per_step=2,
                          height=64, width=64, num_inference_steps=4, lr=1e-6, seed=0, dit_objective=objective,
                          **({"nft_timesteps": 2} if objective == "nft" else {"dgpo_timesteps": 2} if objective == "dgpo" else {}))
    trainer.fit(1, progress=False)   # B leaves zero; A's gradients start at the next step
    before = lora()
    trainer.fit(1, progress=False)
    after = lora()
    assert {p.dtype for p in policy.parameters() if p.requires_grad} == {torch.float32}
    assert {s.dtype for st in trainer.optimizer.state.values() for s in st.values() if torch.is_tensor(s) and s.ndim} == {torch.float32}
    copies = [t for o in trainer.objectives.values() for ts in o.checkpoint_tensors().values() for t in ts.values()]
    assert all(t.dtype == torch.float32 for t in copies) and (objective == "flow_grpo" or copies)
    A = [n for n in before if "lora_A" in n]
    moved = max((after[n] - before[n]).abs().max().item() for n in A)
    assert 0 < moved < 3e-5, moved                      # A moved, by less than half a bf16 step at |A| ~ 0.01
    kept = sum((after[n].to(torch.bfloat16) != before[n].to(torch.bfloat16)).sum().item() for n in A)
    assert kept < 0.05 * sum(before[n].numel() for n in A), kept   # in bf16 nearly all of it would have rounded away
