"""Rewards served by `glm-grpo serve-reward` in their own process, on loopback: a training step with a served reward
equals the step with the same reward in-process, bit for bit; a stopped, a slow and a misbehaving server each give an
error that names the URL, before anything reaches the weights."""
import json
import re
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import ROOT, clean_env

from glm_grpo_nb.policy import GlmImagePolicy
from glm_grpo_nb.rewards import RednessReward, RemoteReward, RewardServiceError
from glm_grpo_nb.trainer import GRPOTrainer

PROMPTS = ["a blue square on a white background", "the word 'OK' in white on blue"]

USER_REWARDS = '''
import time, torch
from glm_grpo_nb.rewards import RednessReward

def slow(images, prompts, targets=None, sources=None):
    time.sleep(3)
    return torch.zeros(len(images))

def one_short(images, prompts, targets=None, sources=None):
    return torch.zeros(len(images) - 1)

def nan_scores(images, prompts, targets=None, sources=None):
    return torch.full((len(images),), float("nan"))

class Redder(RednessReward):
    name = "redder"

class DiesAfter3(RednessReward):
    "Redness that takes its server down with it at the fourth request (a reward model that crashes)."
    name = "redness"
    calls = 0
    def __call__(self, images, prompts, **kw):
        DiesAfter3.calls += 1
        if DiesAfter3.calls == 4:
            import os
            os._exit(1)
        return super().__call__(images, prompts, **kw)
'''


class Server:
    "`glm-grpo serve-reward ARGS --port 0` in a subprocess; its URL is read from the line it prints."
    def __init__(self, glm_grpo, *args, cwd=None, port=0):
        self.proc = subprocess.Popen([glm_grpo, "serve-reward", *args, "--port", str(port)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=clean_env(), cwd=cwd)
        line = self.proc.stdout.readline()
        found = re.search(r"at (http://127\.0\.0\.1:\d+)", line)
        if not found:
            self.proc.kill()
            raise AssertionError(f"serve-reward did not start: {line!r} {self.proc.stderr.read()[-2000:]}")
        self.url = found.group(1)

    def stop(self):
        "SIGTERM, as a cluster sends it; the server stops cleanly."
        self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, out, err

    def __enter__(self): return self
    def __exit__(self, *exc):
        if self.proc.poll() is None: self.proc.kill(); self.proc.wait()


@pytest.fixture
def user_rewards(tmp_path):
    (tmp_path / "user_rewards.py").write_text(textwrap.dedent(USER_REWARDS))
    return tmp_path


def trainer_with(tiny_path, reward_fn):
    policy = GlmImagePolicy.from_pretrained(tiny_path, ar_lora=4, dit_lora=4, device="cpu", lora_seed=0, verbose=False)
    return GRPOTrainer(policy, reward_fn, PROMPTS, group_size=2, prompts_per_step=2, height=64, width=64, num_inference_steps=4,
                       sde_window=(0, 2), seed=0, lr=1e-3)


def adapters(trainer):
    return {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if p.requires_grad}


def test_served_step_equals_local_step(glm_grpo, tiny_path):
    local = trainer_with(tiny_path, RednessReward())
    want = local.step()
    with Server(glm_grpo, "redness") as server:
        remote = trainer_with(tiny_path, RemoteReward(server.url))
        got = remote.step()
        rc, out, _ = server.stop()
    assert rc == 0 and "reward server stopped" in out
    assert torch.equal(got.rewards, want.rewards) and torch.equal(got.advantages, want.advantages)
    overlap = {"reward/wait_s", "reward/overlap", "reward/inflight_peak"}   # a served reward is scored while sampling
    assert overlap <= set(got.metrics) and {k: v for k, v in got.metrics.items() if k not in overlap} == want.metrics
    a, b = adapters(remote), adapters(local)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_stopped_server_is_found_when_the_trainer_is_built(glm_grpo, tiny_path, user_rewards):
    with Server(glm_grpo, "user_rewards:Redder", cwd=user_rewards) as server:
        reward = RemoteReward(server.url, wait=0.2, backoff=0.05)
        assert reward.name == "redder"
        server.stop()
    with pytest.raises(RewardServiceError, match=re.escape(server.url) + ".*cannot connect"):
        trainer_with(tiny_path, reward)


def test_slow_server_times_out(glm_grpo, user_rewards):
    from PIL import Image
    with Server(glm_grpo, "user_rewards:slow", cwd=user_rewards) as server:
        reward = RemoteReward(server.url, timeout=0.5, wait=0.6, backoff=0.05)
        with pytest.raises(RewardServiceError, match=re.escape(server.url) + r".*no answer within 0\.5 s.*gave up after 1 s"):
            reward([Image.new("RGB", (8, 8))] * 2, ["a", "b"])


def test_wrong_length_answer(glm_grpo, tiny_path, user_rewards):
    with Server(glm_grpo, "user_rewards:one_short", cwd=user_rewards) as server:
        trainer = trainer_with(tiny_path, RemoteReward(server.url, wait=0))
        before = adapters(trainer)
        with pytest.raises(RewardServiceError, match=re.escape(server.url) + ".*one score per image"):
            trainer.step()
    after = adapters(trainer)
    assert trainer.step_count == 0 and all(torch.equal(before[k], after[k]) for k in before)


def test_nan_scores_skip_the_step(glm_grpo, tiny_path, user_rewards):
    with Server(glm_grpo, "user_rewards:nan_scores", cwd=user_rewards) as server:
        trainer = trainer_with(tiny_path, RemoteReward(server.url))
        before = adapters(trainer)
        with pytest.warns(UserWarning, match="update skipped"):
            res = trainer.step()
    after = adapters(trainer)
    assert res.skipped and trainer.skipped_total == 1 and all(torch.equal(before[k], after[k]) for k in before)


def test_beyond_loopback_needs_a_token(glm_grpo):
    r = subprocess.run([glm_grpo, "serve-reward", "redness", "--host", "0.0.0.0", "--port", "0"], capture_output=True,
                       text=True, env={k: v for k, v in clean_env().items() if k != "GLM_GRPO_REWARD_TOKEN"}, timeout=120)
    assert r.returncode == 2 and "beyond loopback" in r.stderr and "--token" in r.stderr


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_vlm_judge_against_transformers_serve(tmp_path):
    "VLMJudgeReward against `transformers serve` running a tiny vision-language model built offline."
    import os
    import time
    from pathlib import Path

    import requests
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from glm_grpo_nb.rewards import VLMJudgeReward, evaluate_reward
    from glm_grpo_nb.tiny_rewards import make_tiny_vlm
    model_dir = make_tiny_vlm(tmp_path / "vlm")
    (tmp_path / "hub").mkdir()
    exe = Path(sys.executable).parent / "transformers"
    port = free_port()
    env = {**clean_env(), "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    proc = subprocess.Popen([str(exe), "serve", str(model_dir), "--port", str(port), "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        for _ in range(600):
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).ok: break
            except requests.ConnectionError: pass
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            time.sleep(0.1)
        images = [Image.new("RGB", (64, 64), c) for c in ("red", "blue", "white", "black", (10, 200, 90), "gray")]
        prompts = ["red", "a blue sky", "snow", "night", "grass", "fog"]
        judge = VLMJudgeReward(f"http://127.0.0.1:{port}/v1", str(model_dir), question="Is this {prompt}? Answer yes or no.",
                               max_tokens=1, max_workers=3)
        out = evaluate_reward(judge, images, prompts)
        # the same questions asked of the same model in this process, greedy, as the server answers them
        model, proc_ = AutoModelForImageTextToText.from_pretrained(model_dir), AutoProcessor.from_pretrained(model_dir)
        want = []
        for im, p in zip(images, prompts):
            msgs = [{"role": "user", "content": [{"type": "image", "image": im},
                                                 {"type": "text", "text": f"Is this {p}? Answer yes or no."}]}]
            x = proc_.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt")
            want.append(proc_.decode(model.generate(**x, max_new_tokens=1, do_sample=False)[0, -1:], skip_special_tokens=True))
        assert out.texts["vlm_judge/answer"] == want and set(want) == {"yes", "no"}, (out.texts, want)
        assert torch.equal(out.total, torch.tensor([float(a == "yes") for a in want]))
    finally:
        proc.terminate(); proc.wait(timeout=30)


def test_a_restarting_service_is_waited_for(glm_grpo, tiny_path, capsys):
    "The service goes away mid-run and comes back on the same address: the step waits, says so twice, and completes."
    import threading, time
    with Server(glm_grpo, "redness") as first:
        trainer = trainer_with(tiny_path, RemoteReward(first.url, wait=120, backoff=0.2))
        trainer.step()
        first.stop()
    port = int(first.url.rsplit(":", 1)[1])
    later = {}
    def restart():   # the reward model reloads for a while, then serves again where it was
        time.sleep(2)
        later["server"] = Server(glm_grpo, "redness", port=port)
    thread = threading.Thread(target=restart)
    thread.start()
    try:
        res = trainer.step()
    finally:
        thread.join()
        later["server"].__exit__()
    assert not res.skipped and trainer.step_count == 2
    err = capsys.readouterr().err
    waiting = [l for l in err.splitlines() if "waiting up to 120 s for it to come back" in l]
    back = [l for l in err.splitlines() if re.search(r"/score: back after \d+ s\.", l)]
    assert len(waiting) == 1 and first.url in waiting[0] and len(back) == 1, err


def test_train_keeps_its_steps_when_the_service_stays_away(glm_grpo, tiny_path, tmp_path, user_rewards):
    "glm-grpo train: the reward server dies after 3 steps; the run waits --reward-wait s, checkpoints step 3, exits 2."
    (tmp_path / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    out = tmp_path / "run"
    with Server(glm_grpo, "user_rewards:DiesAfter3", cwd=user_rewards) as server:
        r = subprocess.run([glm_grpo, "train", "--model", str(tiny_path), "--prompts", str(tmp_path / "prompts.txt"),
                            "--reward", server.url, "--reward-wait", "1", "--steps", "10", "--out", str(out),
                            "--group-size", "2", "--prompts-per-step", "1", "--num-inference-steps", "4", "--ar-lora", "4",
                            "--dit-lora", "4"], capture_output=True, text=True, env=clean_env(), timeout=600)
    assert r.returncode == 2, r.stderr[-3000:]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000003"]
    lines = r.stderr.splitlines()
    assert any("waiting up to 1 s for it to come back" in l for l in lines), r.stderr[-2000:]
    saved = [l for l in lines if l.startswith("RewardServiceError after 3 steps: saved ")]
    assert len(saved) == 1 and "the same glm-grpo train command" in saved[0], r.stderr[-2000:]
    assert lines[-1].startswith(f"glm-grpo train: reward service {server.url}/score: ") and "gave up after" in lines[-1]
    assert not (out / "run.lock").exists() and "Traceback" not in r.stderr


def test_soak_within_limits(glm_grpo):
    "300 requests, 8 at a time, a third of them over a limit: every answer right, every refusal a 4xx, memory flat."
    # run as its docstring says, from the repository root: `bench` is not an installed package
    r = subprocess.run([sys.executable, "-m", "bench.reward_soak", "--requests", "300", "--concurrency", "8",
                        "--glm-grpo", glm_grpo], capture_output=True, text=True, cwd=ROOT, env=clean_env(), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]   # it raises on any wrong answer or refusal
    figures = json.loads(r.stdout)
    assert figures["counts"]["valid"] == 114 and figures["seconds_after_warmup"] < 120, figures
    assert figures["rss_mb_end"] - figures["rss_mb_after_warmup"] < 25, figures   # no request leaves memory behind
