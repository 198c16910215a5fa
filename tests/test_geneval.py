"""GenEval end to end: its reward drives GRPO on the tiny GLM-Image (with the detector for flat-colour scenes in
Mask2Former's place), the command line refuses bad metadata before any model loads, and `glm-grpo evaluate --benchmark
geneval` runs on tiny random detector and colour models and writes the official results format."""
import json
import time
from pathlib import Path

from conftest import ROOT, clean_env
from test_cli import run

from glm_grpo_nb.geneval import GenEvalReward, SceneDetector, make_tiny_mask2former, scene_colors
from glm_grpo_nb.geneval_results import geneval_scores
from glm_grpo_nb.policy import GlmImagePolicy
from glm_grpo_nb.trainer import GRPOTrainer

PROMPTS = ["a red circle on a gray background", "a blue square on a white background", "a green circle on a gray background",
           "a yellow square on a black background", "a cyan field", "a gradient from navy to teal"]
ONE_BALL = {"tag": "single_object", "include": [{"class": "sports ball", "count": 1}]}


def test_geneval_reward_drives_training(tiny_path):
    "Asked for exactly one object, DiT-only GRPO makes the scenes' blots into one: the partial credit rises."
    detector = SceneDetector(square="sports ball", circle="sports ball", tolerance=40)
    policy = GlmImagePolicy.from_pretrained(tiny_path, ar_lora=8, dit_lora=8, device="cpu", lora_seed=1, verbose=False)
    trainer = GRPOTrainer(policy, GenEvalReward(detector=detector, color_of=scene_colors),
                          [{"prompt": p, **ONE_BALL} for p in PROMPTS], group_size=4, prompts_per_step=3, height=64,
                          width=64, num_inference_steps=6, sde_window=(0, 3), seed=1, train_ar=False, dit_lr=1e-2)
    history = trainer.fit(24, progress=False)
    rewards = [h["reward_mean"] for h in history]
    first, last = sum(rewards[:6]) / 6, sum(rewards[-6:]) / 6
    assert last > first + 0.2, f"GenEval's score did not rise ({first:.3f} -> {last:.3f}); per step {rewards}"
    assert {"info/geneval/correct", "info/geneval/strict", "info/geneval/score"} <= set(history[-1]), sorted(history[-1])
    assert abs(history[-1]["info/geneval/score"] - history[-1]["reward_mean"]) < 1e-6   # reward_type="score" is trained on


def test_bad_metadata_refused_before_the_model_loads(glm_grpo, tiny_path, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"tag": "colors", "include": [{"class": "sofa", "count": 1, "color": "red"}],
                                   "prompt": "a photo of a red sofa"}) + "\n")
    start = time.time()
    # offline, the default detector not in the cache: one line naming it and the option, before the policy or any image
    r = run(glm_grpo, "train", "--model", str(tiny_path), "--prompts", str(prompts), "--reward", "geneval",
            "--out", str(tmp_path / "run"), "--device", "cpu")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-800:]
    assert "facebook/mask2former-swin-small-coco-instance is not in the local Hugging Face cache" in r.stderr, r.stderr[-800:]
    assert "--reward-models geneval=PATH" in r.stderr and not (tmp_path / "run").exists(), r.stderr[-800:]
    r = run(glm_grpo, "train", "--model", str(tiny_path), "--prompts", str(prompts), "--reward", "geneval",
            "--reward-models", "geneval=./no/such/detector", "--out", str(tmp_path / "run"), "--device", "cpu")
    assert r.returncode == 2 and "./no/such/detector does not exist" in r.stderr, r.stderr[-800:]
    plugged = "geneval.detector=glm_grpo_nb.geneval:SceneDetector,geneval.color_of=glm_grpo_nb.geneval:scene_colors"
    r = run(glm_grpo, "train", "--model", str(tiny_path), "--prompts", str(prompts), "--reward", "geneval",
            "--reward-models", plugged, "--out", str(tmp_path / "run"), "--device", "cpu")
    assert r.returncode == 2
    assert "unknown class 'sofa'" in r.stderr and "prompt 0 ('a photo of a red sofa')" in r.stderr, r.stderr[-800:]
    assert not (tmp_path / "run" / "checkpoints").exists()
    plain = tmp_path / "plain.txt"
    plain.write_text("a photo of a cup\n")
    r = run(glm_grpo, "train", "--model", str(tiny_path), "--prompts", str(plain), "--reward", "geneval",
            "--reward-models", plugged, "--out", str(tmp_path / "run2"), "--device", "cpu")
    assert r.returncode != 0 and "has no GenEval metadata" in r.stderr, r.stderr[-800:]
    r = run(glm_grpo, "train", "--model", str(tiny_path), "--prompts", str(prompts), "--reward", "geneval",
            "--reward-models", plugged + ",geneval.threshold=0.1", "--out", str(tmp_path / "run"), "--device", "cpu")
    assert r.returncode == 2 and "reward 'geneval' has no option 'threshold'; its options are reward_type" in r.stderr, r.stderr[-800:]
    assert time.time() - start < 240


def test_evaluate_geneval_writes_the_official_results(glm_grpo, tiny_path, tmp_path):
    from glm_grpo_nb.tiny_rewards import make_tiny_clip
    m2f, clip = make_tiny_mask2former(tmp_path / "m2f"), make_tiny_clip(tmp_path / "clip")
    out = tmp_path / "eval"
    r = run(glm_grpo, "evaluate", "--model", str(tiny_path), "--prompts", str(ROOT / "examples/geneval/prompts.jsonl"),
            "--benchmark", "geneval", "--samples-per-prompt", "1", "--reward-models",
            f"geneval={m2f},geneval.clip_model={clip}", "--num-inference-steps", "2", "--height", "64", "--width", "64",
            "--out", str(out), "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "GenEval (share of images correct per task" in r.stdout and "overall" in r.stdout, r.stdout
    results = [json.loads(l) for l in (out / "images" / "base" / "results.jsonl").read_text().splitlines()]
    assert len(results) == 12 and {r["tag"] for r in results} == {"single_object", "two_object", "counting", "colors",
                                                                   "position", "color_attr"}
    metrics = json.loads((out / "metrics.json").read_text())["models"]["base"]
    assert abs(metrics["benchmark"]["overall"]["mean"] - geneval_scores(results)["overall"]) < 1e-12
    assert {"geneval/correct", "geneval/strict", "geneval/score"} <= set(metrics["metrics"])
    assert all(Path(r["filename"]).exists() for r in results)
    # what scored is recorded beside the figures, and the images are also in GenEval's own layout
    scorers = json.loads((out / "metrics.json").read_text())["settings"]["scorers"]
    assert scorers == {"geneval": {"detector": str(m2f), "colours": str(clip)}}, scorers
    assert f"scored by geneval: detector {m2f}, colours {clip}" in r.stdout, r.stdout
    record = json.loads((out / "images" / "base" / "results_run.json").read_text())
    assert record["scorers"] == scorers and record["samples_per_prompt"] == 1, record
    laid = sorted(p.relative_to(out / "geneval" / "base").as_posix() for p in (out / "geneval" / "base").rglob("*.png"))
    assert laid == [f"{i:05d}/samples/00000.png" for i in range(12)], laid
    first = json.loads((out / "geneval" / "base" / "00000" / "metadata.jsonl").read_text())
    assert first == json.loads((ROOT / "examples/geneval/prompts.jsonl").read_text().splitlines()[0]), first


def test_evaluate_geneval_with_ones_own_detector(glm_grpo, tiny_path, tmp_path):
    "--reward-models geneval.detector=module:callable plugs a detector of one's own (a class made with no arguments)."
    (tmp_path / "my_detector.py").write_text(
        "from glm_grpo_nb.geneval import SceneDetector\n"
        "class Balls(SceneDetector):\n"
        "    def __init__(self): super().__init__(square='sports ball', circle='sports ball')\n")
    out = tmp_path / "eval"
    r = run(glm_grpo, "evaluate", "--model", str(tiny_path), "--prompts", str(ROOT / "examples/geneval/prompts.jsonl"),
            "--benchmark", "geneval", "--samples-per-prompt", "1", "--reward-models",
            "geneval.detector=my_detector:Balls,geneval.color_of=glm_grpo_nb.geneval:scene_colors",
            "--num-inference-steps", "2", "--height", "64", "--width", "64", "--out", str(out), "--device", "cpu", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    scorers = json.loads((out / "metrics.json").read_text())["settings"]["scorers"]["geneval"]
    assert scorers == {"detector": "my_detector:Balls", "colours": "glm_grpo_nb.geneval:scene_colors"}, scorers
    r = run(glm_grpo, "evaluate", "--model", str(tiny_path), "--prompts", str(ROOT / "examples/geneval/prompts.jsonl"),
            "--benchmark", "geneval", "--reward-models", "geneval.detector=my_detector:Nothing,geneval.color_of=my_detector:Balls",
            "--out", str(tmp_path / "e2"),
            "--device", "cpu", cwd=tmp_path)
    assert r.returncode == 2 and "geneval: detector: cannot import 'my_detector:Nothing'" in r.stderr, r.stderr[-800:]
    assert not (tmp_path / "e2" / "images").exists()


def test_the_official_prompt_file_parses():
    "GenEval's own evaluation_metadata.jsonl (beside the project, never part of it) is a prompts file as it is."
    import pytest
    from glm_grpo_nb.data import PromptDataset
    from glm_grpo_nb.geneval import TASKS, read_geneval
    official = ROOT.parent / "shared" / "geneval" / "evaluation_metadata.jsonl"
    if not official.exists(): pytest.skip(f"GenEval's metadata file is not at {official}")
    records = read_geneval(official)
    assert len(records) == 553 and list(dict.fromkeys(r["tag"] for r in records)) == list(TASKS)
    data = PromptDataset(official)
    assert len(data) == 553 and data.column_names == ["tag", "include", "exclude"]
    GenEvalReward().check_rows([data[i] for i in range(len(data))])   # nothing loaded, every line judged judgeable
