"""Served rewards scored while the DiT samples (`reward_overlap`): the same rewards, advantages, updates and checkpoints
as scoring after sampling, index for index, with servers that answer out of order; a resumed run is bit-identical;
a reward that never comes back fails the step before the optimiser step and leaves no thread behind."""
import threading
import time
import warnings

import pytest
import torch

from glm_grpo_nb.policy import GlmImagePolicy
from glm_grpo_nb.rewards import RednessReward, RemoteReward, RewardServiceError, combine, serve_reward
from glm_grpo_nb.trainer import GRPOTrainer

PROMPTS = ["a blue square on a white background", "a green circle on a gray background", "a gradient from navy to teal"]
SETTINGS = dict(group_size=2, prompts_per_step=3, height=64, width=64, num_inference_steps=4, sde_window=(0, 2), lr=3e-3,
                seed=0, dit_sample_batch=2, decode_batch=2, updates_per_batch=1, diversity_warning=0.0)


class Late(RednessReward):
    "Redness that answers late for the requests holding the prompt `slow_on` (its chunk comes back after later ones)."
    def __init__(self, name, slow_on):
        super().__init__()
        self.name, self.slow_on = name, slow_on

    def score(self, images, prompts, targets=None, sources=None):
        if self.slow_on in prompts: time.sleep(0.4)
        return super().score(images, prompts, targets, sources)


@pytest.fixture(scope="module")
def servers():
    first, last = (serve_reward(Late(name, PROMPTS[k]), port=0, background=True)
                   for name, k in (("late_first", 0), ("late_last", 2)))
    yield first, last
    first.stop(); last.stop()


def reward(servers):
    "Two served rewards (the first answers its first chunk last, the second its last chunk last) and one in process."
    return combine({RemoteReward(servers[0].url): 1.0, RemoteReward(servers[1].url): 0.5, "redness": 0.25}, normalize=True)


def trainer(tiny_path, servers, **more):
    policy = GlmImagePolicy.from_pretrained(tiny_path, ar_lora=4, dit_lora=4, device="cpu", lora_seed=0, verbose=False)
    return GRPOTrainer(policy, reward(servers), PROMPTS, **{**SETTINGS, **more})


def weights(t):
    return {n: p.detach().clone() for n, p in t.policy.named_parameters() if p.requires_grad}


def test_overlapped_steps_equal_the_serial_ones(tiny_path, servers):
    on, off = trainer(tiny_path, servers), trainer(tiny_path, servers, reward_overlap=False)
    assert on._overlap_chunk() == 2 and off._overlap_chunk() is None
    s_on, s_off = on.sample(step=0), off.sample(step=0)
    for k in s_off.reward.components: assert torch.equal(s_on.reward.components[k], s_off.reward.components[k]), k
    assert torch.equal(s_on.reward.total, s_off.reward.total)
    assert all(torch.equal(a, b) for a, b in zip(s_on.trajectory.latents, s_off.trajectory.latents))
    h_on, h_off = on.fit(2, progress=False), off.fit(2, progress=False)
    for a, b in zip(h_on, h_off):
        for k in ("reward_mean", "reward_std", "ar/loss", "dit/loss", "ar/grad_norm", "dit/grad_norm"): assert a[k] == b[k], k
    w_on, w_off = weights(on), weights(off)
    assert all(torch.equal(w_on[k], w_off[k]) for k in w_off)
    # what the overlap did, in the history: the late answers of the first chunk came while later chunks sampled
    assert all({"reward/wait_s", "reward/overlap", "reward/inflight_peak"} <= set(r) for r in h_on)
    assert not any("reward/wait_s" in r for r in h_off)
    assert all(1 <= r["reward/inflight_peak"] <= 2 and 0 <= r["reward/overlap"] <= 1 for r in h_on)
    assert all(r["reward/overlap"] > 0 for r in h_on)   # the first chunks' calls ran while later ones sampled
    on.close(); off.close()


def test_an_overlapped_run_resumes_bit_identically(tiny_path, servers, tmp_path):
    straight = trainer(tiny_path, servers)
    straight.fit(2, progress=False)
    first = trainer(tiny_path, servers, output_dir=tmp_path / "run", save_every=1)
    first.fit(1, progress=False)
    first.close()
    policy = GlmImagePolicy.from_pretrained(tiny_path, ar_lora=4, dit_lora=4, device="cpu", lora_seed=5, verbose=False)
    resumed = GRPOTrainer.resume(tmp_path / "run", policy, reward(servers), PROMPTS)
    resumed.fit(1, progress=False)
    a, b = weights(straight), weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.history[-1]["reward_mean"] == straight.history[-1]["reward_mean"]
    straight.close(); resumed.close()


def test_a_reward_that_never_comes_back_fails_the_step_before_the_update(tiny_path):
    gone = serve_reward(Late("served_redness", "no such prompt"), port=0, background=True)
    remote = RemoteReward(gone.url)
    t = GRPOTrainer(GlmImagePolicy.from_pretrained(tiny_path, ar_lora=4, dit_lora=4, device="cpu", verbose=False),
                    combine({remote: 1.0, "redness": 1.0}), PROMPTS, **SETTINGS)
    before = weights(t)
    gone.stop()
    remote.wait, remote.timeout = 0.5, 2.0   # a service gone for good: given up after half a second
    with pytest.raises(RewardServiceError, match="reward service"): t.step()
    after = weights(t)
    assert all(torch.equal(before[k], after[k]) for k in before) and t.step_count == 0
    assert not [th for th in threading.enumerate() if th.name.startswith("reward-overlap")]
    t.close()


def test_overlap_asked_for_with_nothing_served_says_so_once(tiny_path):
    policy = GlmImagePolicy.from_pretrained(tiny_path, ar_lora=4, dit_lora=4, device="cpu", verbose=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = GRPOTrainer(policy, RednessReward(), PROMPTS, **SETTINGS, reward_overlap=True)
        t.step()
    said = [str(w.message) for w in caught if "reward_overlap=True" in str(w.message)]
    assert len(said) == 1 and "no reward here is served" in said[0]
    assert "reward/wait_s" not in t.history[-1]
    t.close()
    with pytest.raises(ValueError, match="reward_max_inflight"):
        GRPOTrainer(policy, RednessReward(), PROMPTS, **SETTINGS, reward_max_inflight=0)


def test_evaluation_scores_served_metrics_while_making_images_the_same(servers, tmp_path, monkeypatch):
    "glm-grpo evaluate: a served metric scored on each batch as it is made gives samples.csv as scoring afterwards does."
    from glm_grpo_nb.evaluation import ServedWhileMaking, evaluate_model
    taken, output = [], ServedWhileMaking.output
    def counted(self, name, reward, ks):
        out = output(self, name, reward, ks)
        taken.append(out is not None)
        return out
    monkeypatch.setattr(ServedWhileMaking, "output", counted)

    class Colours:   # an image model of its own: a colour field per prompt and seed, four images a batch
        batch_size = 4
        def batch(self, prompts, seeds, sources=None):
            return [Image.new("RGB", (32, 32), ((37 * s) % 256, (91 * s) % 256, len(p) % 256)) for p, s in zip(prompts, seeds)]

    from PIL import Image
    metrics = [RemoteReward(servers[0].url), RemoteReward(servers[1].url), "redness"]
    runs = {}
    for overlap in (True, False):
        out = tmp_path / f"overlap_{overlap}"
        res = evaluate_model(prompts=PROMPTS, out=out, metrics=metrics, models={"colours": Colours()}, samples_per_prompt=3,
                             reward_overlap=overlap, progress=False)
        runs[overlap] = ((out / "samples.csv").read_text(), res["models"])
        # with the overlap every served metric of every batch came from what was scored while the images were made
        assert (taken == [True, True, False]) if overlap else not taken, taken   # 2 served metrics, one batch; redness here
        taken.clear()
    assert runs[True] == runs[False]
    assert "late_first" in runs[True][0] and "late_last" in runs[True][0]
    assert not [th for th in threading.enumerate() if th.name.startswith("reward-overlap")]
