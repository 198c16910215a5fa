"""Ctrl-C and SIGTERM (what clusters send before preemption) during `fit` and `glm-grpo train`: the step in flight is
undone or finished, the last completed step is checkpointed, the run folder is released, the exit code is 130 / 143,
and the run resumes exactly."""
import json
import os
import signal
import subprocess
import time

import pytest
import torch

from conftest import clean_env

from glm_grpo_nb.checkpoint import checkpoints
from glm_grpo_nb.policy import GlmImagePolicy
from glm_grpo_nb.rewards import RednessReward
from glm_grpo_nb.trainer import GRPOTrainer, TrainingStopped

PROMPTS = ["a blue square on a white background", "the word 'OK' in white on blue", "a cyan field"]
SETTINGS = dict(group_size=2, prompts_per_step=2, height=64, width=64, num_inference_steps=4, sde_window=(0, 2), seed=0, lr=3e-3)


class SignalAt(RednessReward):
    "Redness, but the `call`-th call (one per step) sends `sig` to this process first: a signal while sampling."
    name = "redness"
    def __init__(self, call, sig): self.call, self.sig, self.calls = call, sig, 0
    def score(self, images, prompts, targets=None, sources=None):
        self.calls += 1
        if self.calls == self.call: os.kill(os.getpid(), self.sig)
        return super().score(images, prompts)


def policy(tiny_path):
    return GlmImagePolicy.from_pretrained(tiny_path, ar_lora=4, dit_lora=4, device="cpu", lora_seed=0, verbose=False)


def adapters(trainer):
    return {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if p.requires_grad}


def steps_logged(folder):
    return [json.loads(l)["step"] for l in (folder / "metrics.jsonl").read_text().splitlines()]


def test_sigterm_while_sampling(tiny_path, tmp_path):
    "The step in flight is undone, the two completed steps are checkpointed, and the resumed run is the uninterrupted one."
    out = tmp_path / "run"
    t = GRPOTrainer(policy(tiny_path), SignalAt(3, signal.SIGTERM), PROMPTS, output_dir=out, **SETTINGS)
    with pytest.raises(TrainingStopped) as stopped:
        t.fit(5, progress=False)
    assert stopped.value.code == 143 and stopped.value.step == 2 == t.step_count
    assert stopped.value.checkpoint == out / "checkpoints" / "step-000002"
    assert [p.name for p in checkpoints(out / "checkpoints")] == ["step-000002"]
    assert not (out / "run.lock").exists() and steps_logged(out) == [0, 1]
    straight = GRPOTrainer(policy(tiny_path), RednessReward(), PROMPTS, **SETTINGS)
    straight.fit(4, progress=False)
    resumed = GRPOTrainer.resume(out, policy(tiny_path), RednessReward(), PROMPTS)
    resumed.fit(2, progress=False)
    a, b = adapters(straight), adapters(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [h["reward_mean"] for h in resumed.history] == [h["reward_mean"] for h in straight.history]


def test_sigint_while_updating_finishes_the_step(tiny_path, tmp_path):
    out = tmp_path / "run"
    t = GRPOTrainer(policy(tiny_path), RednessReward(), PROMPTS, output_dir=out, **SETTINGS)
    update, calls = t.update, []
    def interrupted_update(*a, **k):
        calls.append(1)
        if len(calls) == 2: os.kill(os.getpid(), signal.SIGINT)
        return update(*a, **k)
    t.update = interrupted_update
    with pytest.raises(TrainingStopped) as stopped:
        t.fit(5, progress=False)
    assert stopped.value.code == 130 and t.step_count == 2 and steps_logged(out) == [0, 1]
    assert [p.name for p in checkpoints(out / "checkpoints")] == ["step-000002"]


def test_second_signal_stops_at_once(tiny_path, tmp_path):
    "A second Ctrl-C during the final save: KeyboardInterrupt at once, and no checkpoint half-written."
    out = tmp_path / "run"
    t = GRPOTrainer(policy(tiny_path), SignalAt(2, signal.SIGTERM), PROMPTS, output_dir=out, **SETTINGS)
    real_save = torch.save
    def save_interrupted(*a, **k):
        os.kill(os.getpid(), signal.SIGINT)
        return real_save(*a, **k)
    torch.save = save_interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            t.fit(5, progress=False)
    finally:
        torch.save = real_save
    assert checkpoints(out / "checkpoints") == [] and not any(p.name.startswith(".") for p in (out / "checkpoints").iterdir())
    assert t.step_count == 1 and steps_logged(out) == [0]


def test_notebook_ctrl_c_returns(tiny_path, monkeypatch, capsys):
    "In a notebook, Ctrl-C ends fit with one line and a trainer that continues."
    import glm_grpo_nb.widgets as widgets
    monkeypatch.setattr(widgets, "in_notebook", lambda: True)
    t = GRPOTrainer(policy(tiny_path), SignalAt(2, signal.SIGINT), PROMPTS, **SETTINGS)
    done = t.fit(4, progress=False, live=False)
    assert len(done) == 1 and done.stopped_by == "SIGINT" and t.step_count == 1 and "stopped by SIGINT" in repr(done)
    err = capsys.readouterr().err
    assert "SIGINT: stopped after 1 steps" in err and "Traceback" not in err
    assert len(t.fit(1, progress=False, live=False)) == 1 and t.step_count == 2


def test_glm_grpo_train_sigterm_then_resume(glm_grpo, tiny_path, tmp_path):
    (tmp_path / "prompts.txt").write_text("\n".join(PROMPTS))
    out = tmp_path / "run"
    args = [glm_grpo, "train", "--model", str(tiny_path), "--prompts", str(tmp_path / "prompts.txt"), "--reward", "redness",
            "--out", str(out), "--group-size", "2", "--prompts-per-step", "1", "--num-inference-steps", "4", "--sde-window", "0", "2",
            "--ar-lora", "4", "--dit-lora", "4", "--save-every", "0"]
    proc = subprocess.Popen(args + ["--steps", "200"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env())
    deadline = time.time() + 300
    while time.time() < deadline and not ((out / "metrics.jsonl").exists() and len(steps_logged(out)) >= 2):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err[-3000:]
    n = len(steps_logged(out))
    assert f"SIGTERM: stopped after {n} steps" in err and "Traceback" not in err
    assert [p.name for p in checkpoints(out / "checkpoints")] == [f"step-{n:06d}"] and not (out / "run.lock").exists()
    again = subprocess.run(args + ["--steps", str(n + 1)], capture_output=True, text=True, env=clean_env(), timeout=300)
    assert again.returncode == 0 and f"resumed from step {n}" in again.stdout, again.stderr[-3000:]
    assert steps_logged(out) == list(range(n + 1))
