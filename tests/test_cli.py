"The installed `glm-grpo` console script, end to end in a subprocess."
import subprocess

from PIL import Image

from conftest import clean_env


def run(*args, cwd=None):
    return subprocess.run(list(args), capture_output=True, text=True, env=clean_env(), cwd=cwd, timeout=600)


def test_help_and_version(glm_grpo):
    import glm_grpo_nb
    r = run(glm_grpo, "--help")
    assert r.returncode == 0 and "tiny" in r.stdout and "generate" in r.stdout
    r = run(glm_grpo, "--version")
    assert r.returncode == 0 and r.stdout.strip() == glm_grpo_nb.__version__
    r = run(glm_grpo, "generate", "--help")
    assert r.returncode == 0 and "--num-inference-steps" in r.stdout and "multiple of 32" in r.stdout
    r = run(glm_grpo, "train", "--help")   # every objective, and every setting of them, is an option
    assert r.returncode == 0 and "{flow_grpo,grpo_guard,nft,awm,dgpo}" in r.stdout
    for option in ("--sde-window-schedule", "--awm-weighting", "--dgpo-beta", "--ema-decay-max", "--matching-adv-clip"):
        assert option in r.stdout, option
    r = run(glm_grpo, "plan", "--dit-objective", "dgpo", "--train", "dit")
    assert r.returncode == 0 and "EMA DiT LoRA" in r.stdout, r.stdout + r.stderr


def test_tiny_then_generate(glm_grpo, tmp_path):
    r = run(glm_grpo, "tiny", str(tmp_path / "tiny"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "tiny" / "model_index.json").exists()
    r = run(glm_grpo, "generate", "--model", str(tmp_path / "tiny"), "--prompt", "a 'HI' sign", "--num-images", "2",
            "--num-inference-steps", "2", "--out", str(tmp_path / "out" / "img.png"))
    assert r.returncode == 0, r.stderr
    for i in range(2):
        assert Image.open(tmp_path / "out" / f"img_{i}.png").size == (64, 64)


def test_bad_input_is_a_clear_error(glm_grpo, tiny_path, tmp_path):
    r = run(glm_grpo, "generate", "--model", str(tiny_path), "--prompt", "x", "--width", "40")
    assert r.returncode == 2 and "multiples of 32" in r.stderr and "Traceback" not in r.stderr
    r = run(glm_grpo, "generate", "--model", str(tmp_path), "--prompt", "x")
    assert r.returncode == 2 and "model_index.json" in r.stderr
    r = run(glm_grpo, "frobnicate")
    assert r.returncode == 2 and "unknown command" in r.stderr
    r = run(glm_grpo, "train", "--model", "nobody/no-such-model", "--prompts", "p.txt", "--reward", "ssim")
    assert r.returncode == 2 and "not in the local Hugging Face cache" in r.stderr and "Traceback" not in r.stderr


def test_demo_reward_rises(glm_grpo, tmp_path):
    import json
    import re
    r = run(glm_grpo, "demo", "--out", str(tmp_path / "demo"), "--eval-reward", "ocr")   # OCR: a held-out reward
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "demo"
    assert (out / "adapters" / "ar").is_dir() and (out / "adapters" / "dit").is_dir()
    card = (out / "adapters" / "README.md").read_text()   # a model card, filled in from the run
    assert card.startswith("---\nbase_model: zai-org/GLM-Image\n") and "20 steps" in card and "| redness | 1 |" in card
    p = run(glm_grpo, "push", "--adapters", str(out / "adapters"), "--repo", "me/glm-image-red")   # offline here
    assert p.returncode == 2 and "offline mode (HF_HUB_OFFLINE=1)" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert Image.open(out / "report.png").size[0] > 500
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    rewards = [row["reward_mean"] for row in rows if "reward_mean" in row]
    assert len(rewards) == 20
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.1, rewards
    before, after = map(float, re.search(r"on fixed prompts and seeds ([-+.\d]+) -> ([-+.\d]+)", r.stdout).groups())
    assert after > before + 0.2, r.stdout                     # the evaluation on fixed prompts and seeds rises plainly
    assert f"--adapters {out / 'adapters'}" in r.stdout       # the report says how to use what was trained
    assert re.search(r"held-out reward [-+.\d]+ -> [-+.\d]+; within-group diversity [.\d]+ -> [.\d]+", r.stdout), r.stdout
    assert any("eval/heldout" in row for row in rows)          # the held-out reward is logged with the evaluations
    stderr = [l for l in r.stderr.splitlines() if l.strip() and not l.startswith("GRPO")]
    assert not stderr, stderr                                 # one progress bar, no upstream noise
    g = run(glm_grpo, "generate", "--model", str(out / "model"), "--adapters", str(out / "adapters"), "--prompt",
            "a blue square on a white background", "--num-inference-steps", "4", "--out", str(tmp_path / "tuned.png"))
    assert g.returncode == 0 and not g.stderr.strip(), g.stderr
    assert Image.open(tmp_path / "tuned.png").size == (64, 64)   # the tiny model's own size
    # before and after, on the same prompts and seeds, as papers report it; run again, it resumes and makes nothing
    (tmp_path / "eval_prompts.txt").write_text("a sign that says 'OK'\na blue square on a white background\n")
    ev = [glm_grpo, "evaluate", "--model", str(out / "model"), "--adapters", f"demo={out / 'adapters'}", "--prompts",
          str(tmp_path / "eval_prompts.txt"), "--metrics", "ocr,redness", "--samples-per-prompt", "2",
          "--num-inference-steps", "6", "--out", str(tmp_path / "eval")]
    e = run(*ev)
    assert e.returncode == 0, e.stderr[-3000:]
    m = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert list(m["models"]) == ["base", "demo"] and m["settings"]["samples_per_prompt"] == 2
    base, demo = m["models"]["base"]["metrics"], m["models"]["demo"]["metrics"]
    assert {"word_accuracy", "ned", "whole_reading_ned", "all_words_read", "ocr", "redness"} <= set(base)
    assert base["word_accuracy"]["images"] == base["ocr"]["images"] == 2 and base["redness"]["images"] == 4   # text apart
    assert demo["redness"]["mean"] > base["redness"]["mean"], (base["redness"], demo["redness"])   # trained towards red
    assert "base (4 images, 2 with text): word_accuracy" in e.stdout and Image.open(tmp_path / "eval" / "report.png")
    assert len((tmp_path / "eval" / "samples.csv").read_text().splitlines()) == 1 + 8
    card = (out / "adapters" / "README.md").read_text()   # the adapters' card now carries the table
    assert "## Evaluation" in card and "demo (4 images, 2 with text)" in card and (out / "adapters" / "evaluation.png").is_file()
    made = {p: p.stat().st_mtime_ns for p in (tmp_path / "eval" / "images").rglob("*.png")}
    again = run(*ev)
    assert again.returncode == 0 and again.stdout == e.stdout, again.stderr[-2000:]
    assert (out / "adapters" / "README.md").read_text().count("## Evaluation") == 1   # replaced, not added again
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "eval" / "images").rglob("*.png")} == made
    bad = run(*ev[:-1], str(tmp_path / "eval"), "--seed", "3")
    assert bad.returncode == 2 and "seed differ" in bad.stderr and "Traceback" not in bad.stderr
    # a benchmark's own prompt files: CVTG-2K's layout, its table printed beside the base model
    (tmp_path / "cvtg" / "CVTG").mkdir(parents=True)
    (tmp_path / "cvtg" / "CVTG" / "2.json").write_text(json.dumps({"data_list": [
        {"index": 0, "prompt": "A sign that says 'READ'. A cup with the word 'MORNING'.", "carrier_list": ["sign", "cup"]},
        {"index": 1, "prompt": "A billboard reading 'Adventure'. A window with 'Drive'.", "carrier_list": ["billboard", "window"]}]}))
    b = run(glm_grpo, "evaluate", "--model", str(out / "model"), "--adapters", f"demo={out / 'adapters'}", "--prompts",
            str(tmp_path / "cvtg"), "--benchmark", "cvtg-2k", "--num-inference-steps", "4", "--out", str(tmp_path / "cvtg_eval"))
    assert b.returncode == 0, b.stderr[-3000:]
    assert "CVTG-2K (word accuracy by text regions, average; NED)" in b.stdout and "2 regions" in b.stdout, b.stdout
    bm = json.loads((tmp_path / "cvtg_eval" / "metrics.json").read_text())
    assert bm["settings"]["benchmark"] == "cvtg-2k" and bm["models"]["demo"]["benchmark"]["aggregate"]["total_words"] == 4
    wrong = run(glm_grpo, "evaluate", "--model", str(out / "model"), "--prompts", str(tmp_path / "eval_prompts.txt"),
                "--benchmark", "cvtg-2k", "--out", str(tmp_path / "wrong"))
    assert wrong.returncode == 2 and "no JSON file" not in wrong.stderr and "read_cvtg2k" in wrong.stderr, wrong.stderr


def test_plan_answers_for_trains_defaults():
    "glm-grpo plan and memory.plan default to what glm-grpo train and GRPOConfig do, so the plan is of the run you get."
    import inspect
    from glm_grpo_nb import cli, memory
    from glm_grpo_nb.config import GRPOConfig
    config, train = GRPOConfig().replace(**cli.TRAIN_DEFAULTS), inspect.signature(cli.train).parameters
    for where in (cli.plan, memory.plan):
        p = inspect.signature(where).parameters
        for k in ("group_size", "prompts_per_step", "micro_batch_size", "num_inference_steps", "sde_window", "dit_objective",
                  "decode_batch"):
            assert p[k].default == getattr(config, k), (where.__module__, k, p[k].default, getattr(config, k))
        assert p["load_in_4bit"].default == train["load_in_4bit"].default
        assert p["lora_rank"].default == train["ar_lora"].default == train["dit_lora"].default
        assert p["guidance_scale"].default is None   # the objective's, as the trainer resolves it
    default = memory.plan()
    assert default.peak == memory.plan(micro_batch_size=None, load_in_4bit=False, guidance_scale=config.guidance_scale).peak


def test_generate_a_model_saved_in_bf16(glm_grpo, tiny_path, tmp_path):
    "The release is saved in bf16: every component must load in one dtype (the AR and glyph encoder kept bf16 before)."
    import shutil
    import torch
    from safetensors.torch import load_file, save_file
    model = tmp_path / "bf16"
    shutil.copytree(tiny_path, model)
    for f in model.rglob("*.safetensors"):
        save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in load_file(f).items()}, f)
    for f in model.rglob("config.json"):   # as the release's configs say
        f.write_text(f.read_text().replace('"float32"', '"bfloat16"'))
    r = run(glm_grpo, "generate", "--model", str(model), "--prompt", "a 'HI' sign", "--num-inference-steps", "2",
            "--out", str(tmp_path / "img.png"), "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    assert Image.open(tmp_path / "img.png").size == (64, 64)
