"""A run that can be watched: `glm-grpo train --report-to tensorboard` leaves TensorBoard event files holding every
metric row, the learning rates, the evaluations and the sample grids, read back with TensorBoard's own reader."""
import json
import subprocess

from PIL import Image

from conftest import clean_env


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True, env=clean_env(), timeout=600)


def test_tensorboard_holds_scalars_evaluations_and_images(glm_grpo, tiny_path, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    prompts, evals = tmp_path / "prompts.txt", tmp_path / "eval.txt"
    prompts.write_text("a red square\na blue field\n")
    evals.write_text("a green circle\n")
    out = tmp_path / "run"
    r = run(glm_grpo, "train", "--model", str(tiny_path), "--prompts", str(prompts), "--reward", "redness", "--steps", "3",
            "--group-size", "2", "--prompts-per-step", "2", "--num-inference-steps", "4", "--ar-lora", "4", "--dit-lora", "4",
            "--report-to", "tensorboard", "--run-name", "red", "--log-images-every", "2", "--eval-prompts", str(evals),
            "--eval-every", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in (out / "samples").iterdir()) == ["step-000000.png", "step-000002.png"]
    assert json.loads((out / "run_config.json").read_text())["settings"]["report_to"] == "tensorboard"
    assert Image.open(out / "samples" / "step-000002.png").size[0] > 100
    runs = list((out / "red").glob("events.out.tfevents.*"))   # the run's name; its settings sit in a folder below
    assert len(runs) == 1 and list((out / "red").rglob("hparams.yml")), list(out.rglob("*"))
    ea = EventAccumulator(str(out / "red"), size_guidance={"images": 0, "scalars": 0}).Reload()
    tags = ea.Tags()
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    for key in ("reward_mean", "ar/loss", "dit/loss", "lr/ar", "lr/dit", "eval/reward"):
        assert key in tags["scalars"], (key, tags["scalars"])
    assert [e.step for e in ea.Scalars("reward_mean")] == [0, 1, 2]
    mine = [row["reward_mean"] for row in rows if "reward_mean" in row]
    assert [round(e.value, 5) for e in ea.Scalars("reward_mean")] == [round(v, 5) for v in mine]   # the same numbers
    assert [e.step for e in ea.Scalars("eval/reward")] == [row["step"] for row in rows if "eval/reward" in row]
    assert "samples" in tags["images"] and [e.step for e in ea.Images("samples")] == [0, 2]
    assert ea.Images("samples")[0].width > 100


def test_eval_every_needs_eval_prompts(glm_grpo, tiny_path, tmp_path):
    (tmp_path / "p.txt").write_text("a red square\n")
    r = run(glm_grpo, "train", "--model", str(tiny_path), "--prompts", str(tmp_path / "p.txt"), "--reward", "redness",
            "--eval-every", "2", "--out", str(tmp_path / "run"))
    assert r.returncode == 2 and "add --eval-prompts FILE" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = run(glm_grpo, "train", "--model", str(tiny_path), "--prompts", str(tmp_path / "p.txt"), "--reward", "redness",
            "--report-to", "tensorbored", "--out", str(tmp_path / "run"))
    assert r.returncode == 2 and "--report-to must be one or more of tensorboard" in r.stderr, r.stderr   # the option's name


def test_run_config_records_the_run_and_reruns_it(glm_grpo, tiny_path, tmp_path):
    "run_config.json holds the settings, command line, versions and data digest; --rerun makes the same run elsewhere."
    (tmp_path / "p.txt").write_text("a red square\na blue field\n")
    first = [glm_grpo, "train", "--model", str(tiny_path), "--prompts", str(tmp_path / "p.txt"), "--reward", "redness",
             "--steps", "2", "--group-size", "2", "--prompts-per-step", "2", "--num-inference-steps", "4",
             "--ar-lora", "4", "--dit-lora", "4", "--lr", "3e-3", "--out", str(tmp_path / "one")]
    r = run(*first)
    assert r.returncode == 0, r.stderr[-3000:]
    rec = json.loads((tmp_path / "one" / "run_config.json").read_text())
    assert rec["command"][1:] == first[1:] and rec["settings"]["lr"] == 3e-3 and rec["settings"]["group_size"] == 2
    assert {"python", "torch", "transformers", "diffusers", "peft", "bitsandbytes", "accelerate", "glm_grpo_nb"} <= set(rec["versions"])
    assert all(rec["versions"].values()) and rec["gpu"] is None and rec["num_processes"] == 1
    assert rec["data"]["rows"] == 2 and len(rec["data"]["fingerprint"]) >= 8 and rec["run"]["reward"]["reward_fn"] == "redness"
    again = run(glm_grpo, "train", "--rerun", str(tmp_path / "one" / "run_config.json"), "--out", str(tmp_path / "two"))
    assert again.returncode == 0, again.stderr[-3000:]
    rows = lambda d: [json.loads(l) for l in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
    same = lambda row: {k: v for k, v in row.items() if not k.startswith("seconds/")}
    assert [same(x) for x in rows("one")] == [same(x) for x in rows("two")]   # the same run, step for step
    assert json.loads((tmp_path / "two" / "run_config.json").read_text())["settings"] == rec["settings"]
    bad = run(glm_grpo, "train", "--rerun", str(tmp_path / "one" / "run_config.json"), "--out", str(tmp_path / "one"))
    assert bad.returncode == 2 and "pass --out NEW" in bad.stderr, bad.stderr


def test_train_reads_a_dataset_with_its_own_column_names(glm_grpo, tiny_path, tmp_path):
    "DrawBench's prompt column is 'Prompts': --prompt-column names it; without it the error lists the columns."
    (tmp_path / "drawbench.csv").write_text("Prompts,Category\nA red colored car.,Colors\nA blue cube.,Colors\n")
    args = [glm_grpo, "train", "--model", str(tiny_path), "--prompts", str(tmp_path / "drawbench.csv"), "--reward",
            "redness", "--steps", "1", "--group-size", "2", "--prompts-per-step", "2", "--num-inference-steps", "4"]
    r = run(*args, "--out", str(tmp_path / "no"))
    assert r.returncode == 2 and "its columns are ['Prompts', 'Category']" in r.stderr, r.stderr[-2000:]
    r = run(*args, "--prompt-column", "Prompts", "--out", str(tmp_path / "yes"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((tmp_path / "yes" / "run_config.json").read_text())["data"]["rows"] == 2
