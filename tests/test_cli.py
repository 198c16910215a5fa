"The installed `glm-grpo` console script, end to end in a subprocess."
import subprocess

import numpy as np

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
    assert r.returncode == 0 and "{flow_grpo,grpo_guard,flow_dppo,nft,awm,dgpo,dpo}" in r.stdout and "--ar-objective {grpo,dpo}" in r.stdout
    for option in ("--sde-window-schedule", "--awm-weighting", "--dgpo-beta", "--ema-decay-max", "--matching-adv-clip",
                   "--dpo-beta", "--dpo-loss-type", "--dit-dpo-beta", "--dpo-timesteps", "--dppo-threshold"):
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
    r = run(glm_grpo, "demo", "--out", str(tmp_path / "demo"), "--eval-reward", "ocr",   # OCR: a held-out reward
            "--base-tail-steps", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"reward [-+.\d]+, with the base DiT's last 2 of 6 steps [-+.\d]+", r.stdout), r.stdout
    out = tmp_path / "demo"
    assert (out / "adapters" / "ar").is_dir() and (out / "adapters" / "dit").is_dir()
    card = (out / "adapters" / "README.md").read_text()   # a model card, filled in from the run
    assert card.startswith("---\nlibrary_name: diffusers\n") and "20 steps" in card and "| redness | 1 |" in card
    assert "the GLM-Image model in the local folder" in card and "base_model" not in card   # the demo's model is local
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
    t = run(glm_grpo, "generate", "--model", str(out / "model"), "--adapters", str(out / "adapters"), "--prompt",
            "a blue square on a white background", "--num-inference-steps", "4", "--out", str(tmp_path / "tail.png"),
            "--base-tail-steps", "2")   # the base DiT finishes the last two steps
    assert t.returncode == 0 and "the last 2 DiT steps without them" in t.stdout, t.stderr
    tuned, tail = (np.asarray(Image.open(tmp_path / f), dtype=np.float32) for f in ("tuned.png", "tail.png"))
    assert 0 < np.abs(tuned - tail).mean() < 64, np.abs(tuned - tail).mean()   # the same layout, other detail
    bad = run(glm_grpo, "generate", "--model", str(out / "model"), "--prompt", "x", "--base-tail-steps", "2")
    assert bad.returncode != 0 and "pass --adapters with a dit/ adapter" in bad.stderr and "Traceback" not in bad.stderr
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
    # the trained adapters beside themselves with the base DiT's last 3 of 6 steps: the same tokens, other fine detail
    tail = run(glm_grpo, "evaluate", "--model", str(out / "model"), "--adapters", f"demo={out / 'adapters'}", "--prompts",
               str(tmp_path / "eval_prompts.txt"), "--metrics", "redness", "--num-inference-steps", "6",
               "--base-tail-steps", "3", "--out", str(tmp_path / "eval_tail"))
    assert tail.returncode == 0, tail.stderr[-3000:]
    tm = json.loads((tmp_path / "eval_tail" / "metrics.json").read_text())["models"]
    assert list(tm) == ["base", "demo", "demo+base-tail-3"], list(tm)
    assert tm["demo+base-tail-3"]["metrics"]["redness"]["mean"] != tm["demo"]["metrics"]["redness"]["mean"]
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


def test_readme_main_job_commands_parse():
    "Every command of the README's main job, as written, is one its command's parser takes: no flag the CLI lacks."
    import re
    import shlex
    from conftest import ROOT
    from glm_grpo_nb.cli import COMMANDS, parser_of
    from glm_grpo_nb.options import _option_style
    readme = (ROOT / "README.md").read_text()
    job = readme[readme.index("### The main job, step by step"):readme.index("## Set-up and the tests")]
    lines = [l for block in re.findall(r"```bash\n(.*?)```", job, re.S) for l in block.splitlines() if l.strip()]
    seen = []
    for line in lines:
        words = shlex.split(line.replace("$(which glm-grpo)", "glm-grpo"))
        at = words.index("glm-grpo")
        name, rest = words[at + 1], words[at + 2:]
        assert name in COMMANDS, line
        parser = parser_of(name)
        try: parser.parse_args(_option_style(parser, rest))
        except SystemExit: raise AssertionError(f"the README's `{line}` is not what glm-grpo {name} takes") from None
        seen.append(name)
    assert {"train", "generate", "evaluate", "plan", "sft", "push"} <= set(seen) and len(seen) >= 9, seen


def test_eval_prompts_alone_and_the_wrong_kind_of_run_folder(glm_grpo, tiny_path, tmp_path):
    "--eval-prompts without --eval-every evaluates before and after training, printed and in the card; an SFT command "
    "pointed at this GRPO run's folder is refused before any model loads, and the word 'damaged' is not used."
    import time
    (tmp_path / "p.txt").write_text("a red square\na blue field\n")
    out = tmp_path / "run"
    r = run(glm_grpo, "train", "--model", str(tiny_path), "--prompts", str(tmp_path / "p.txt"), "--reward", "redness",
            "--eval-prompts", str(tmp_path / "p.txt"), "--steps", "2", "--group-size", "2", "--height", "64", "--width",
            "64", "--num-inference-steps", "2", "--out", str(out), "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "evaluation before training: reward " in r.stdout and "evaluation after 2 steps: reward " in r.stdout, r.stdout
    card = (out / "adapters" / "README.md").read_text()
    assert "## Progress on the evaluation prompts" in card and "| 0 | " in card and "| 2 | " in card, card
    start = time.time()
    (tmp_path / "targets").mkdir()
    for i in range(2): Image.new("RGB", (64, 64), "red").save(tmp_path / "targets" / f"{i}.png")
    r = run(glm_grpo, "sft", "--model", str(tiny_path), "--prompts", str(tmp_path / "p.txt"), "--targets",
            str(tmp_path / "targets"), "--out", str(out), "--device", "cpu")
    assert r.returncode == 2 and "holds the checkpoints of GRPO training (written by glm-grpo train)" in r.stderr, r.stderr
    assert "damaged" not in r.stderr and time.time() - start < 30


def test_argument_errors_answer_without_torch(tiny_path):
    "Missing or bad arguments of the commands are answered before torch is imported (in a fraction of a second)."
    import sys
    cases = [["train"], ["sft"], ["evaluate"], ["train", "--model", str(tiny_path), "--prompts", "p", "--reward", "r",
             "--group-size", "1"], ["sft", "--model", str(tiny_path), "--prompts", "p", "--lr", "0"],
             ["train", "--model", "/no/such/model", "--prompts", "p", "--reward", "r"],
             ["train", "--model", str(tiny_path), "--prompts", "p", "--reward", "r", "--height", "33"],
             ["evaluate", "--model", str(tiny_path), "--prompts", "p", "--height", "33"]]
    code = ("import sys\nfrom glm_grpo_nb.cli import main\n"
            f"for args in {cases!r}:\n    assert main(args) == 2, args\n    assert 'torch' not in sys.modules, args\nprint('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
    assert "--group-size must be an int >= 2" in r.stderr and "--lr must be a finite number > 0" in r.stderr, r.stderr


def test_dpo_data_errors_answer_without_torch(tiny_path, tmp_path):
    "glm-grpo dpo names every problem of its pairs and folders before torch is imported, as sft does; its flags by name."
    import sys
    from PIL import Image
    for sub in ("chosen", "rejected"): (tmp_path / sub).mkdir()
    (tmp_path / "p.txt").write_text("a red square\na blue circle\n")
    for f in ("chosen/0.png", "chosen/1.png", "rejected/0.png"): Image.new("RGB", (64, 64)).save(tmp_path / f)
    base = ["dpo", "--model", str(tiny_path), "--prompts", str(tmp_path / "p.txt")]
    cases = [(base + ["--chosen", str(tmp_path / "chosen"), "--rejected", str(tmp_path / "rejected")], "rejected: pair 1: missing"),
             (base + ["--chosen", str(tmp_path / "nowhere"), "--rejected", str(tmp_path / "rejected")],
              f"--chosen {tmp_path / 'nowhere'}: no such folder"),
             (base + ["--chosen", str(tmp_path / "chosen"), "--rejected", str(tmp_path / "rejected"), "--eval-every", "2"],
              "add --eval-pairs FILE"),
             (["sft", "--model", str(tiny_path), "--prompts", str(tmp_path / "p.txt"), "--targets", str(tmp_path / "none")],
              f"--targets {tmp_path / 'none'}: no such folder")]
    code = ("import sys\nfrom glm_grpo_nb.cli import main\n"
            f"for args, _ in {cases!r}:\n    assert main(args) == 2, args\n    assert 'torch' not in sys.modules, args\nprint('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
    for _, said in cases: assert said in r.stderr, (said, r.stderr)
    assert "Traceback" not in r.stderr and "--eval-prompts" not in r.stderr, r.stderr


def test_dpo_offers_only_its_options(glm_grpo):
    "Settings that only shape an evaluation's images are not dpo's: its evaluation scores held-out pairs, making none."
    r = run(glm_grpo, "dpo", "--help")
    assert r.returncode == 0 and "--dpo-beta" in r.stdout and "--eval-pairs" in r.stdout, r.stdout
    for option in ("--temperature", "--top-k", "--top-p", "--num-inference-steps", "--decode-batch", "--ar-sample-batch",
                   "--dit-sample-batch", "--guidance-scale"):
        assert option not in r.stdout, option
    r = run(glm_grpo, "dpo", "--model", "m", "--prompts", "p", "--temperature", "0.9")
    assert r.returncode == 2 and "--temperature" in r.stderr, r.stderr


def test_dpo_command(glm_grpo, tiny_path, tmp_path):
    "glm-grpo dpo trains on chosen and rejected folders, evaluates the held-out pairs before and after, writes adapters "
    "with a DPO card; pairs it cannot use are refused before any model loads and nothing is written."
    import json
    from glm_grpo_nb.tiny import scene_pair
    rng = np.random.default_rng(0)
    rows = [scene_pair(rng) for _ in range(3)]
    for sub in ("chosen", "rejected"): (tmp_path / sub).mkdir()
    (tmp_path / "p.txt").write_text("\n".join(p for p, _, _ in rows) + "\n")
    for i, (_, c, r) in enumerate(rows):
        c.save(tmp_path / "chosen" / f"{i}.png"); r.save(tmp_path / "rejected" / f"{i}.png")
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps({"prompt": p, "chosen": f"chosen/{i}.png", "rejected": f"rejected/{i}.png"}) + "\n"
                            for i, (p, _, _) in enumerate(rows)))
    out = tmp_path / "run"
    args = ["--model", str(tiny_path), "--prompts", str(tmp_path / "p.txt"), "--chosen", str(tmp_path / "chosen"),
            "--rejected", str(tmp_path / "rejected"), "--device", "cpu"]
    r = run(glm_grpo, "dpo", *args, "--eval-pairs", str(held), "--steps", "2", "--prompts-per-step", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "evaluation before training: ar_logp_margin " in r.stdout and "ar_accuracy 0.0000" in r.stdout and "evaluation after 2 steps: " in r.stdout, r.stdout
    metrics = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "ar/dpo_loss" in m]
    assert len(steps) == 2 and abs(steps[0]["ar/dpo_loss"] - np.log(2)) < 1e-6 and steps[0]["dit/margin"] == 0, steps
    card = (out / "adapters" / "README.md").read_text()
    assert "trained on preference pairs (DPO)" in card and "Diffusion-DPO (beta 100)" in card and "- dpo" in card, card
    # continuing that run on other pairs is refused before any model loads (the model itself is compared once loaded)
    (tmp_path / "p2.txt").write_text("\n".join(p for p, _, _ in rows[:2]) + "\n")
    other = ["--model", str(tiny_path), "--prompts", str(tmp_path / "p2.txt"), "--chosen", str(tmp_path / "chosen"),
             "--rejected", str(tmp_path / "rejected"), "--device", "cpu", "--steps", "3", "--out", str(out)]
    r = run(glm_grpo, "dpo", *other)
    assert r.returncode == 2 and f"dpo: --out {out} holds a run with another dataset" in r.stderr, r.stderr[-800:]
    assert "--allow-changes dataset" in r.stderr and "resume:" not in r.stderr, r.stderr[-800:]
    # a pair without its rejected image, a wrong size: refused by name, before any model loads, nothing written
    (tmp_path / "rejected" / "1.png").unlink()
    r = run(glm_grpo, "dpo", *args, "--out", str(tmp_path / "bad"))
    assert r.returncode == 2 and "rejected: pair 1: missing" in r.stderr and not (tmp_path / "bad").exists(), r.stderr
    rows[1][2].resize((96, 96)).save(tmp_path / "rejected" / "1.png")
    r = run(glm_grpo, "dpo", *args, "--out", str(tmp_path / "bad"))
    assert r.returncode == 2 and "rejected image" in r.stderr and "1.png is 96x96" in r.stderr and not (tmp_path / "bad").exists(), r.stderr
    assert "--resize" in r.stderr and "--height 96" not in r.stderr, r.stderr   # the other images are 64x64: resizing is the way
    r = run(glm_grpo, "sft", "--model", str(tiny_path), "--prompts", str(tmp_path / "p.txt"), "--targets",
            str(tmp_path / "chosen"), "--out", str(out), "--device", "cpu")
    assert r.returncode == 2 and "holds the checkpoints of DPO training (written by glm-grpo dpo)" in r.stderr, r.stderr


def test_dpo_reads_pick_a_pic_as_saved_parquet_and_csv(tmp_path):
    "Pick-a-Pic's layout from a save_to_disk folder, a parquet file and a CSV (labels as text): ties dropped, flips counted."
    import io
    import datasets
    from PIL import Image
    from glm_grpo_nb.cli import _pair_reader
    from glm_grpo_nb.config import DPOConfig
    def png(c):
        buf = io.BytesIO(); Image.new("RGB", (64, 64), c).save(buf, format="PNG"); return buf.getvalue()
    red, blue = png((200, 30, 30)), png((30, 30, 200))
    rows = {"caption": ["red wins", "blue wins", "a tie"], "jpg_0": [red] * 3, "jpg_1": [blue] * 3, "label_0": [1.0, 0.0, 0.5]}
    ds = datasets.Dataset.from_dict(rows)
    ds.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "splits"))
    ds.to_parquet(str(tmp_path / "pairs.parquet"))
    for name, data in (("red", red), ("blue", blue)): (tmp_path / f"{name}.png").write_bytes(data)
    (tmp_path / "pairs.csv").write_text("caption,jpg_0,jpg_1,label_0\nred wins,red.png,blue.png,1\nblue wins,red.png,blue.png,0\n"
                                        "a tie,red.png,blue.png,0.5\n")
    pairs_of = _pair_reader(DPOConfig(), None, None, None, "train", False, "prompt", "chosen", "rejected")
    for source in ("saved", "splits", "pairs.parquet", "pairs.csv"):
        pairs = pairs_of(str(tmp_path / source))
        assert (len(pairs), pairs.ties_dropped, pairs.flipped) == (2, 1, 1), (source, pairs)
        second = pairs.pair(1)
        assert second["prompt"] == "blue wins" and second["chosen"].getpixel((0, 0)) == (30, 30, 200), (source, second)
    try: _pair_reader(DPOConfig(), None, None, None, "test", False, "prompt", "chosen", "rejected")(str(tmp_path / "splits"))
    except ValueError as e: assert "has the splits train, not 'test'; pass --split" in str(e), e
    else: raise AssertionError("a missing split was not refused")


def test_a_missing_reward_model_answers_before_the_policy_code_loads(tiny_path, tmp_path):
    "A reward whose model is not here is one line from train and from evaluate, before the policy's modules (transformers', diffusers') are imported."
    import sys
    (tmp_path / "p.txt").write_text("a red square\n")
    p = str(tmp_path / "p.txt")
    cases = [["train", "--model", str(tiny_path), "--prompts", p, "--reward", "imagereward", "--out", str(tmp_path / "t")],
             ["train", "--model", str(tiny_path), "--prompts", p, "--reward", "redness", "--eval-reward", "hpsv2",
              "--out", str(tmp_path / "t2")],
             ["evaluate", "--model", str(tiny_path), "--prompts", p, "--metrics", "imagereward", "--out", str(tmp_path / "e")]]
    code = ("import sys\nfrom glm_grpo_nb.cli import main\n"
            f"for args in {cases!r}:\n    assert main(args) == 2, args\n"
            "    assert 'glm_grpo_nb.policy' not in sys.modules and 'diffusers' not in sys.modules, args\nprint('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
    lines = [l for l in r.stderr.splitlines() if l.startswith("glm-grpo")]
    assert len(lines) == 3 and all("not in the local Hugging Face cache" in l for l in lines), r.stderr
    assert "THUDM/ImageReward" in lines[0] and "hpsv2" in lines[1] and lines[2].startswith("glm-grpo evaluate"), lines
