"""Nothing the loss ignores reaches a gradient, and a skipped step says what and where.

The AR's training forward runs left-padded prompts; the places the loss ignores are padded positions (in attention),
masked and dropped tokens and the forced end token (in log-probs, old and reference log-probs, logits), and the DiT's
deterministic steps (in per-step log-probs). Values planted there, inf or NaN, must leave every gradient as it was."""
import json
import warnings

import pytest
import torch
import torch.nn.functional as F

from glm_grpo_nb.policy import GlmImagePolicy
from glm_grpo_nb.rewards import RednessReward
from glm_grpo_nb.trainer import GRPOTrainer

PROMPTS = ["a red square on a blue background", "a dot"]   # different lengths: left padding inside a batch


def _trainer(tiny_path, tmp_path=None, **kw):
    policy = GlmImagePolicy.from_pretrained(tiny_path, ar_lora=8, dit_lora=8, sampling_copy=True, verbose=False)
    return GRPOTrainer(policy, RednessReward(), PROMPTS, group_size=2, prompts_per_step=2, height=64, width=64,
                       num_inference_steps=4, sde_window=(0, 2), micro_batch_size=4, updates_per_batch=1, seed=0,
                       output_dir=None if tmp_path is None else tmp_path / "run", **kw)


def _grads(policy) -> dict:
    out = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
    policy.zero_grad(set_to_none=True)
    return out


class _EmptyRowsPoisonQueries(torch.autograd.Function):
    "Identity forward; backward gives NaN to the queries of empty attention rows, as CUDA's memory-efficient kernel can."
    @staticmethod
    def forward(ctx, q, empty):
        ctx.save_for_backward(empty)
        return q.view_as(q)

    @staticmethod
    def backward(ctx, grad):
        (empty,) = ctx.saved_tensors
        return grad.masked_fill(empty[..., None], float("nan")), None


@pytest.fixture
def kernel_with_empty_row_fault(monkeypatch):
    "SDPA whose backward poisons the queries of rows with no key to attend to; records how many such rows it met."
    real, seen = F.scaled_dot_product_attention, []
    def sdpa(q, k, v, attn_mask=None, *a, **kw):
        if attn_mask is not None and attn_mask.dtype == torch.bool and q.requires_grad:
            empty = ~attn_mask.any(-1)   # [b, 1 or h, S]
            seen.append(int(empty.sum()))
            q = _EmptyRowsPoisonQueries.apply(q, empty.expand(q.shape[:-1]))
        return real(q, k, v, attn_mask, *a, **kw)
    monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa)
    return seen


def test_padded_positions_never_attend_to_nothing(tiny_path, kernel_with_empty_row_fault):
    "Left padding (different prompt lengths, the copy's multiple of 64) gives no empty attention row in the training forward."
    t = _trainer(tiny_path)
    roll = t.policy.sample_tokens(PROMPTS, 2, 64, 64, seed=0)
    assert (roll.attention_mask == 0).sum(1).min() > 0 and len(set((roll.attention_mask == 0).sum(1).tolist())) == 2
    lp = t.policy.token_logprobs(roll)
    lp[roll.completion_mask].sum().backward()
    assert kernel_with_empty_row_fault and sum(kernel_with_empty_row_fault) == 0   # masks were built, none had an empty row
    grads = _grads(t.policy)
    assert grads and all(torch.isfinite(g).all() for g in grads.values())
    with torch.no_grad(): assert (lp - roll.logprobs.to(lp)).abs().max() < 1e-4   # and the log-probs are the sampled ones


def _ar_loss_grads(t, roll, adv, prepared, plant=None):
    "The AR's loss on the whole rollout and its gradients; `plant(lp)` changes the new log-probs the loss sees."
    obj, real = t.objectives["ar"], t.policy.token_logprobs
    if plant is not None: t.policy.token_logprobs = lambda r, **kw: plant(real(r, **kw))
    try:
        loss, _ = obj.loss(roll, adv, prepared, 0)
        loss.backward()
    finally: t.policy.token_logprobs = real
    return loss.item(), _grads(t.policy)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_values_planted_where_the_ar_loss_looks_away_change_no_gradient(tiny_path, bad):
    t = _trainer(tiny_path, kl_coef=0.1)
    roll = t.policy.sample_tokens(PROMPTS, 2, 64, 64, seed=0)
    obj, adv = t.objectives["ar"], torch.tensor([1.0, -1.0, 0.5, -0.5])
    prepared, _ = obj.prepare(roll)
    drop = (1, 3)   # a sampled token the training forward's truncation dropped (its old log-prob is finfo.min)
    prepared["old_logprobs"][drop] = torch.finfo(torch.float32).min
    prepared["kept"] = roll.completion_mask & (prepared["old_logprobs"] > -1e30)
    clean_loss, clean = _ar_loss_grads(t, roll, adv, prepared)
    ignored = ~prepared["kept"]   # the end token of every sample and the dropped token
    assert ignored.sum() == roll.num_samples + 1
    planted = {k: v.clone() for k, v in prepared.items()}
    for k in ("old_logprobs", "ref_logprobs"): planted[k][ignored] = bad
    head = t.policy.ar.lm_head.register_forward_hook(lambda m, a, out: out.index_fill(1, torch.tensor([out.shape[1] - 1]), bad))
    try:   # the logits of the last position (they would predict the forced end token) and the new log-probs
        loss, grads = _ar_loss_grads(t, roll, adv, planted, plant=lambda lp: lp.masked_fill(ignored.to(lp.device), bad))
    finally: head.remove()
    assert loss == clean_loss and grads.keys() == clean.keys()
    for n, g in grads.items(): assert torch.equal(g, clean[n]), n


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_values_planted_at_deterministic_steps_change_no_dit_gradient(tiny_path, bad):
    t = _trainer(tiny_path, train_ar=False)
    s = t.sample(step=0)
    traj, obj, adv = s.trajectory, t.objectives["dit"], torch.tensor([1.0, -1.0, 0.5, -0.5])
    assert traj.stochastic.any() and not traj.stochastic.all()
    loss, _ = obj.loss(traj, adv, {}, 0)
    loss.backward()
    clean_loss, clean = loss.item(), _grads(t.policy)
    ode = ~traj.stochastic
    traj.logprobs[:, ode] = bad   # the sampling-time (old) log-probs of the ODE steps
    real = t.policy.latent_logprobs
    t.policy.latent_logprobs = lambda tr, **kw: (lambda out: (out[0].masked_fill(t.policy.on_device(ode), bad), *out[1:])
                                                 if isinstance(out, tuple) else out.masked_fill(t.policy.on_device(ode), bad))(real(tr, **kw))
    try:
        loss, _ = obj.loss(traj, adv, {}, 0)
        loss.backward()
    finally: t.policy.latent_logprobs = real
    grads = _grads(t.policy)
    assert loss.item() == clean_loss and grads.keys() == clean.keys() and clean
    for n, g in grads.items(): assert torch.equal(g, clean[n]), n


class PoisonedSiLU(torch.autograd.Function):
    "SiLU whose backward returns NaN: a stand-in for a kernel that fails in the backward only."
    @staticmethod
    def forward(ctx, x): return F.silu(x)

    @staticmethod
    def backward(ctx, grad): return torch.full_like(grad, float("nan"))


class PoisonedActivation(torch.nn.Module):
    def forward(self, x): return PoisonedSiLU.apply(x) if torch.is_grad_enabled() else F.silu(x)


def test_a_skipped_step_says_what_and_where(tiny_path, tmp_path, monkeypatch):
    t = _trainer(tiny_path, tmp_path)
    mlp = t.policy.ar.model.language_model.layers[0].mlp
    monkeypatch.setattr(mlp, "activation_fn", PoisonedActivation())
    before = {n: p.detach().clone() for n, p in t.policy.named_parameters() if p.requires_grad}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = t.step()
    assert res.skipped
    why = t.skip_reason
    # which half, gradient (not loss), how many elements, the first tensors by name, the log-probs, the operation
    assert why.startswith("the ar gradient was not finite: "), why
    assert "layers.0." in why and "lora_" in why and "the forward's log-probs were finite" in why, why
    assert "PoisonedSiLUBackward" in why and "test_nonfinite.py" in why, why
    m = res.metrics
    assert m["nonfinite/ar_grad_elements"] > 0 and m["nonfinite/ar_grad_tensors"] > 0 and m["nonfinite/ar_logprobs"] == 0
    assert any(why in str(w.message) for w in seen)   # the console line
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["skipped"] == 1.0 and row["skip_reason"] == why
    assert all(torch.equal(p, before[n]) for n, p in t.policy.named_parameters() if p.requires_grad)


def test_a_non_finite_loss_says_the_log_probs_held_it(tiny_path, tmp_path):
    t = _trainer(tiny_path, tmp_path)
    t.policy.ar.lm_head.register_forward_hook(
        lambda m, a, out: out.index_fill(1, torch.tensor([0]), float("nan")) if torch.is_grad_enabled() else out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = t.step()
    assert res.skipped and t.skip_reason.startswith("the ar loss was nan on micro-batch rows [0, 1, 2, 3]"), t.skip_reason
    assert "the forward's log-probs held 4 non-finite value(s)" in t.skip_reason, t.skip_reason
    assert res.metrics["nonfinite/ar_loss"] == 1.0 and res.metrics["nonfinite/ar_logprobs"] == 4
