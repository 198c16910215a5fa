"""`bench.device_check` in its dry mode: the device script's own code path at the tiny model's size on the CPU, so that
a lent GPU never finds a mistake a CPU would have shown; and what a part cut off by the budget leaves on disk."""
import json
import subprocess
import sys

from conftest import ROOT, clean_env


def device_check(out, *args, timeout=600):
    r = subprocess.run([sys.executable, "-m", "bench.device_check", "--dry", "--out", str(out), *args],
                       cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((out / "device_check.json").read_text())["parts"]


def test_a_cut_off_part_keeps_what_it_wrote(tmp_path):
    "A budget too small for the step part to finish: decode's figures whole, the steps that ended, the next part skipped."
    parts = device_check(tmp_path, "--budget", "60", "--dry-steps", "500", "--parts", "decode,step,learning")
    assert parts["decode"]["status"] == "done", parts
    assert parts["step"]["status"].startswith("stopped at the budget"), parts
    assert parts["learning"]["status"].startswith("skipped"), parts   # less left than its minimum: not started
    # (a) decode: both samplings' figures and the replays', the step captured once and replayed without a new graph
    decode = json.loads((tmp_path / "decode_cpu_dry.json").read_text())
    assert decode["done"] and decode["rows"] == 8 and decode["tokens"] == 260, decode
    assert decode["ms_per_token_step"] > 0 and decode["replay_20_steps_seconds"] > 0 and decode["dit_forward_seconds"] > 0
    assert decode["after_first"]["unique_graphs"] == 1 and decode["new_graphs_in_second_call"] == 0, decode
    assert decode["after_replays"]["unique_graphs"] == 1 and decode["after_replays"]["graph_breaks"] == 0, decode
    assert decode["after_replays"]["cudagraph_skips"] == 0, decode
    table = (tmp_path / "decode_cpu_dry_profile.txt").read_text()
    assert "20 replays of the compiled decode step" in table and "one DiT forward" in table and table.count("aten::") > 20
    # (b) the step: killed mid-run, every step that ended is a whole JSON line, the final report never written
    lines = (tmp_path / "gpu_step_cpu_dry_steps.jsonl").read_text().splitlines()
    steps = [json.loads(line) for line in lines]
    assert 1 <= len(steps) < 500, len(steps)
    assert [s["step"] for s in steps] == list(range(len(steps)))
    for s in steps:
        assert s["failure"] is None and {"sample_ar", "sample_dit", "update_ar", "update_dit"} <= set(s["seconds"]), s
        assert s["cudagraph_skips"] == 0 and s["compile_seconds"] >= 0, s
    assert not (tmp_path / "gpu_step_cpu_dry_alone.json").exists()
    assert (tmp_path / "step.log").exists() and (tmp_path / "torch_logs_step.txt").exists()


def test_the_learning_part_runs_dry(tmp_path):
    "(c): each run evaluated before and after, a line per step, only its own halves' adapters moved."
    parts = device_check(tmp_path, "--budget", "300", "--parts", "learning")
    assert parts == {"learning": {"status": "done", "seconds": parts["learning"]["seconds"]}}, parts
    lines = [json.loads(line) for line in (tmp_path / "learning_released_cpu_dry.jsonl").read_text().splitlines()]
    runs = {r["run"]: r for r in lines if "before" in r}
    steps = [r for r in lines if "step" in r]
    assert set(runs) == {"joint", "ar_alone", "dit_alone"} and len(steps) == 3, lines
    for name, run in runs.items():
        assert run["steps_done"] == 1 and "eval/reward" in run["before"] and "eval/reward" in run["after"], (name, run)
    for step in steps:
        assert step["reward"] == step["reward"], step
        assert (step["ar/sampler_gap"] is not None) == (step["run"] != "dit_alone"), step   # measured where the AR trains
    moved = {name: {h: runs[name]["lora_update"][h] > 0 for h in ("ar", "dit")} for name in runs}
    assert moved == {"joint": {"ar": True, "dit": True}, "ar_alone": {"ar": True, "dit": False},
                     "dit_alone": {"ar": False, "dit": True}}, runs
    assert next(s for s in steps if s["run"] == "joint")["ar/is_masked_fraction"] is not None   # the correction's figures


def test_unknown_parts_are_refused(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench.device_check", "--dry", "--parts", "decode,speed", "--out", str(tmp_path)],
                       cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "unknown part(s) ['speed']" in r.stderr and "decode, step, learning, gpu_tests" in r.stderr
