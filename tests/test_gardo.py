"""GARDO in the trainer (`guard="gardo"`): the reference copied from the policy and kept in checkpoints (a run stopped after
a copy resumes bit for bit), undone with a failed step, the KL and the reference's forwards on the gated samples only, and
its settings refused before any model loads."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from glm_grpo_nb.pixel_rewards import RednessReward
from glm_grpo_nb.policy import GlmImagePolicy
from glm_grpo_nb.trainer import GRPOTrainer

from conftest import clean_env

PROMPTS = ["a blue square", "a green circle", "a cyan field", "a gray field"]


def blue(images, prompts, targets=None, sources=None):
    return torch.tensor([np.asarray(im.convert("RGB"))[..., 2].mean() / 255 for im in images])


def green(images, prompts, targets=None, sources=None):
    return torch.tensor([np.asarray(im.convert("RGB"))[..., 1].mean() / 255 for im in images])


GATES = {"blue": blue, "green": green}


def trainer(tiny_path, **kw):
    policy = GlmImagePolicy.from_pretrained(tiny_path, ar_lora=4, dit_lora=4, device="cpu", verbose=False)
    settings = dict(group_size=4, prompts_per_step=2, height=64, width=64, num_inference_steps=4, sde_window=(0, 2), lr=3e-3,
                    guard="gardo", gate_fraction=0.2, reference_reset_every=1, kl_all_every=2, seed=3)
    return policy, GRPOTrainer(policy, RednessReward(), PROMPTS, gate_rewards=GATES, **{**settings, **kw})


def adapters(policy):
    return {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}


def test_resume_after_a_reference_copy_is_exact(tiny_path, tmp_path):
    _, full = trainer(tiny_path, output_dir=tmp_path / "a")
    for _ in range(3): full.step()
    assert full.guard.reset.resets >= 1   # every round past the first copies (reference_reset_every=1)
    ckpt = full.save()
    kept = [w.clone() for w in full.guard.reference.weights]
    for _ in range(2): full.step()
    policy = GlmImagePolicy.from_pretrained(tiny_path, ar_lora=4, dit_lora=4, device="cpu", verbose=False)
    resumed = GRPOTrainer.resume(ckpt, policy, RednessReward(), PROMPTS, gate_rewards=GATES)
    assert all(torch.equal(a, b) for a, b in zip(resumed.guard.reference.weights, kept))
    for _ in range(2): resumed.step()
    same = lambda row: {k: v for k, v in row.items() if not k.startswith("seconds/")}
    assert [same(r) for r in full.history] == [same(r) for r in resumed.history]
    assert all(torch.equal(a, b) for a, b in zip(full.guard.reference.weights, resumed.guard.reference.weights))
    assert full.guard.state_dict() == resumed.guard.state_dict()
    full.close(); resumed.close()


def test_a_failed_step_leaves_the_guard_as_it_was(tiny_path):
    _, t = trainer(tiny_path)
    t.step(); t.step()
    before, weights = t.guard.state_dict(), [w.clone() for w in t.guard.reference.weights]
    snap = t._snapshot()
    t.step()   # copies the reference, moves the gate's fraction and the watch
    assert t.guard.state_dict() != before
    t._restore(snap)
    assert t.guard.state_dict() == before
    assert all(torch.equal(a, b) for a, b in zip(t.guard.reference.weights, weights))
    t.close()


def test_reference_forwards_and_kl_on_the_gated_samples_only(tiny_path):
    policy, t = trainer(tiny_path, train_ar=False, kl_all_every=0, updates_per_batch=1)
    t.step()   # the adapters move away from the reference
    s = t.sample()
    dit = t.objectives["dit"]
    gate = torch.zeros(len(s.prompts), dtype=torch.bool); gate[[1, 6]] = True
    t.kl_gate, t.kl_all_due = gate, False
    t.kl_weight, t.kl_none = t._kl_weights(gate)
    assert torch.equal(t.kl_weight[gate], torch.full((2,), len(gate) / 2.0, dtype=torch.float64)) and t.kl_weight[~gate].sum() == 0
    with t.guard.reference_of(policy): gated, _ = dit.prepare(s.trajectory)
    t.kl_gate = None
    with t.guard.reference_of(policy): every, _ = dit.prepare(s.trajectory)
    assert torch.allclose(gated["reference"][gate], every["reference"][gate], atol=1e-6)
    assert gated["reference"][~gate].abs().sum() == 0   # never computed
    adv = torch.zeros(len(s.prompts))
    _, m = dit.loss(s.trajectory, adv, gated, 0)
    _, m_all = dit.loss(s.trajectory, adv, every, 0)
    assert m["kl"] > 0 and m["kl"] != m_all["kl"]
    params = [p for _, p in dit.named_params]
    def grad_norm(prepared):
        for p in params: p.grad = None
        loss, m = dit.loss(s.trajectory, adv, prepared, 0)   # advantages 0: any gradient is the KL's
        loss.backward()
        return sum(p.grad.abs().sum().item() for p in params if p.grad is not None), m
    g_gated, _ = grad_norm(gated)
    g_none, m_none = grad_norm({**gated, "kl_weight": torch.zeros(len(gate), dtype=torch.float64)})   # none gated: no KL, no gradient
    assert g_gated > 0 and g_none == 0.0 and m_none["kl"] == 0.0
    t.close()


@pytest.mark.parametrize("args, says", [
    (["--guard", "gardo", "--mode", "decoupled"], "pass --mode joint"),
    (["--guard", "gardo", "--dit-objective", "dgpo"], "dgpo's group score"),
    (["--gate-fraction", "0.5"], "must be in [0.02, 0.2] while it adapts"),
    (["--guard", "gardo", "--gate-sign", "down"], "'upstream', 'proxy_over'"),
])
def test_bad_settings_are_one_line_before_any_model(glm_grpo, tiny_path, tmp_path, args, says):
    (tmp_path / "p.txt").write_text("a red field\n")
    r = subprocess.run([glm_grpo, "train", "--model", str(tiny_path), "--prompts", str(tmp_path / "p.txt"),
                        "--reward", "redness", "--out", str(tmp_path / "run"), *args],
                       capture_output=True, text=True, env=clean_env(), timeout=120)
    assert r.returncode != 0 and says in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_readme_reward_hacking_commands_parse():
    "The README's reward-hacking commands are ones their commands' parsers take, with the settings they name."
    import re
    import shlex
    from conftest import ROOT
    from glm_grpo_nb.cli import parser_of
    from glm_grpo_nb.options import _option_style
    readme = (ROOT / "README.md").read_text()
    part = readme[readme.index("## Reward hacking"):readme.index("## Memory for 1024")]
    lines = [l for block in re.findall(r"```bash\n(.*?)```", part, re.S) for l in block.replace("\\\n", " ").splitlines() if l.strip()]
    assert len(lines) == 2
    for line in lines:
        words = shlex.split(line.split("#")[0])
        parser = parser_of(words[1])
        args = vars(parser.parse_args(_option_style(parser, words[2:])))
        assert args.get("guard") == "gardo", line


def test_features_of_your_own(tiny_path, tmp_path):
    "diversity_features=fn: the novelty from your features; the settings say 'custom', and a resume without fn says what to pass."
    calls = []
    def brightness_features(images):
        calls.append(len(images))
        return torch.tensor([[np.asarray(im.convert("L"), dtype=np.float64).mean(), 1.0] for im in images])
    _, t = trainer(tiny_path, diversity_features=brightness_features, output_dir=tmp_path / "run")
    assert t.config.diversity_features == "custom"
    res = t.step()
    assert calls == [len(res.images)] and "diversity_weight" in res.per_sample
    ckpt = t.save(); t.close()
    policy = GlmImagePolicy.from_pretrained(tiny_path, ar_lora=4, dit_lora=4, device="cpu", verbose=False)
    with pytest.raises(ValueError, match="diversity_features='custom' is a callable"):
        GRPOTrainer.resume(ckpt, policy, RednessReward(), PROMPTS, gate_rewards=GATES)
    again = GRPOTrainer.resume(ckpt, policy, RednessReward(), PROMPTS, gate_rewards=GATES, diversity_features=brightness_features)
    assert again.changed_settings == {} and again.step().per_sample["diversity_weight"].shape == res.per_sample["diversity_weight"].shape
    again.close()


def test_guard_turned_on_at_resume_starts_from_the_resumed_adapters(tiny_path, tmp_path):
    "A run resumed with guard='gardo' (and a KL: the checkpoint's settings hold kl_coef=0) from a checkpoint that has no"
    " reference: the reference is the adapters resumed."
    _, plain = trainer(tiny_path, guard="none", output_dir=tmp_path / "run")
    plain.step()
    ckpt = plain.save(); plain.close()
    policy = GlmImagePolicy.from_pretrained(tiny_path, ar_lora=4, dit_lora=4, device="cpu", verbose=False)
    on = GRPOTrainer.resume(ckpt, policy, RednessReward(), PROMPTS, guard="gardo", gate_rewards=GATES, kl_coef=0.04)
    trained = [p.detach() for p in on.guard.reference.params]
    assert any(t.abs().sum() > 0 for n, t in zip(on.guard.reference.names, trained) if "lora_B" in n)   # the step moved B
    assert all(torch.equal(w, t) for w, t in zip(on.guard.reference.weights, trained))
    on.close()
