"HPSv2, ImageReward and HPSv3 from the command line: evaluated as metrics, served, and a missing checkpoint named before the model loads."
import csv
import json

import numpy as np
import torch
from PIL import Image

from test_cli import run


def test_evaluate_scores_with_hpsv2_imagereward_and_hpsv3(glm_grpo, tiny_path, tmp_path):
    from glm_grpo_nb.preference_rewards import HPSv2Reward, HPSv3Reward, ImageRewardReward
    from glm_grpo_nb.tiny_rewards import make_tiny_hpsv2, make_tiny_hpsv3, make_tiny_imagereward
    hps, ir, h3 = make_tiny_hpsv2(tmp_path / "hps"), make_tiny_imagereward(tmp_path / "ir"), make_tiny_hpsv3(tmp_path / "h3")
    (tmp_path / "prompts.txt").write_text("a red cube\na dog on a sign\n")
    models = (f"hpsv2={hps},hpsv2.tokenizer={hps / 'tokenizer'},imagereward={ir},imagereward.tokenizer={ir / 'tokenizer'},"
              f"hpsv3={h3},hpsv3.backbone={h3 / 'backbone'},hpsv3.dtype=float32")
    e = run(glm_grpo, "evaluate", "--model", str(tiny_path), "--prompts", str(tmp_path / "prompts.txt"), "--metrics",
            "hpsv2,imagereward,hpsv3", "--reward-models", models, "--samples-per-prompt", "2", "--num-inference-steps", "3",
            "--out", str(tmp_path / "eval"))
    assert e.returncode == 0, e.stderr[-3000:]
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())["models"]["base"]["metrics"]
    assert metrics["hpsv2"]["images"] == metrics["imagereward"]["images"] == metrics["hpsv3"]["images"] == 4
    # each image's score in samples.csv is what the reward gives that image in this process
    rows = list(csv.DictReader((tmp_path / "eval" / "samples.csv").open()))
    images = [Image.open(tmp_path / "eval" / r["image"]) for r in rows]
    prompts = [r["prompt"] for r in rows]
    for name, reward in (("hpsv2", HPSv2Reward(str(hps), tokenizer=str(hps / "tokenizer"), device="cpu")),
                         ("imagereward", ImageRewardReward(str(ir), tokenizer=str(ir / "tokenizer"), device="cpu")),
                         ("hpsv3", HPSv3Reward(str(h3), backbone=str(h3 / "backbone"), device="cpu", dtype=torch.float32))):
        expect = reward(images, prompts)
        got = torch.tensor([float(r[name]) for r in rows])
        assert torch.allclose(got, expect, atol=1e-5), (name, got, expect)
        assert abs(metrics[name]["mean"] - expect.mean().item()) < 1e-5


def test_a_missing_checkpoint_is_named_before_the_model_loads(glm_grpo, tiny_path, tmp_path):
    (tmp_path / "prompts.txt").write_text("a red cube\n")
    r = run(glm_grpo, "train", "--model", str(tiny_path), "--prompts", str(tmp_path / "prompts.txt"), "--reward", "hpsv2",
            "--reward-models", f"hpsv2={tmp_path / 'nowhere.pt'}", "--steps", "1", "--out", str(tmp_path / "run"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "--reward-models hpsv2=PATH" in r.stderr and "nowhere.pt does not exist" in r.stderr, r.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_offline_without_the_weights_names_each_hub_id_and_its_option(tmp_path, monkeypatch):
    "Offline with an empty Hugging Face cache, each preference reward names what it needs and the option that sets it."
    import pytest

    from glm_grpo_nb.rewards import load_reward
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for name, hub_id in (("hpsv2", "xswu/HPSv2"), ("imagereward", "THUDM/ImageReward"), ("hpsv3", "MizzenAI/HPSv3")):
        with pytest.raises(ValueError) as e:
            load_reward(name)
        assert hub_id in str(e.value) and f"--reward-models {name}=PATH" in str(e.value), str(e.value)
    with pytest.raises(ValueError) as e:   # its checkpoint on disk, its tokenizer not in the cache
        from glm_grpo_nb.tiny_rewards import make_tiny_imagereward
        load_reward("imagereward", checkpoint=str(make_tiny_imagereward(tmp_path / "ir")))
    assert "google-bert/bert-base-uncased" in str(e.value) and "--reward-models imagereward.tokenizer=PATH" in str(e.value), str(e.value)
    with pytest.raises(ValueError) as e:   # HPSv3's checkpoint on disk, the backbone's files not in the cache
        from glm_grpo_nb.tiny_rewards import make_tiny_hpsv3
        load_reward("hpsv3", checkpoint=str(make_tiny_hpsv3(tmp_path / "h3")))
    assert "Qwen/Qwen2-VL-7B-Instruct" in str(e.value) and "--reward-models hpsv3.backbone=PATH" in str(e.value), str(e.value)


def test_hpsv3_served_equals_in_process(glm_grpo, tmp_path):
    "`glm-grpo serve-reward hpsv3` (a second GPU's reward): the same μ as in this process, and σ beside it."
    from test_reward_service import Server

    from glm_grpo_nb.preference_rewards import HPSv3Reward
    from glm_grpo_nb.served import RemoteReward
    from glm_grpo_nb.tiny_rewards import make_tiny_hpsv3
    h3 = make_tiny_hpsv3(tmp_path / "h3")
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (64, 48 + 16 * i, 3), dtype=np.uint8)) for i in range(3)]
    prompts = ["a red cube", "a dog on a sign", "two cats"]
    local = HPSv3Reward(str(h3), backbone=str(h3 / "backbone"), device="cpu", dtype=torch.float32)
    want = local(images, prompts)
    with Server(glm_grpo, "hpsv3", "--reward-models", f"hpsv3={h3},hpsv3.backbone={h3 / 'backbone'},hpsv3.dtype=float32") as server:
        remote = RemoteReward(server.url)
        out = remote.evaluate(images, prompts)
        rc, _, _ = server.stop()
    assert rc == 0 and remote.name == "hpsv3"
    assert torch.allclose(out.total, want, atol=1e-5), (out.total, want)
    sigma = next(v for k, v in out.info.items() if k.endswith("sigma"))
    assert torch.allclose(sigma, local.last_info["sigma"], atol=1e-5)
