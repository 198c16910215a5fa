"""`bench.device_check` in its dry mode: the device script's own code path at the tiny model's size on the CPU, one step
of each part, so that a lent GPU never finds a mistake a CPU would have shown."""
import json
import subprocess
import sys

from conftest import ROOT, clean_env


def test_the_device_check_runs_dry(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench.device_check", "--dry", "--budget", "900", "--out", str(tmp_path)],
                       cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "device_check.json").read_text())
    parts = summary["parts"]
    assert set(parts) == {"gpu_step_cpu_dry_alone.json", "gpu_step_cpu_dry_profile.json", "learning_released_dry.json"}, parts
    assert not any(p.get("error") or p.get("skipped") for p in parts.values()), parts
    # (a) the step: its phases timed, nothing skipped, the first ratios at 1
    step = json.loads((tmp_path / "gpu_step_cpu_dry_alone.json").read_text())
    assert len(step["steps"]) == 1 and step["steps"][0]["failure"] is None, step
    assert {"sample_ar", "sample_dit", "update_ar", "update_dit"} <= set(step["steps"][0]["seconds"]), step
    # its profile: both tables, each with the operators that ran
    table = (tmp_path / "gpu_step_cpu_dry_profile.txt").read_text()
    assert "20 decode steps" in table and "one DiT forward" in table and table.count("aten::") > 20, table[:2000]
    profile = json.loads((tmp_path / "gpu_step_cpu_dry_profile.json").read_text())
    assert profile["decode_21_seconds"] > 0 and profile["dit_forward_seconds"] > 0, profile
    # (b) learning: each run evaluated before and after, a step taken, only its own halves' adapters moved
    learn = json.loads((tmp_path / "learning_released_dry.json").read_text())
    assert set(learn) >= {"joint", "ar_alone", "dit_alone"}, learn
    for name, run in ((k, learn[k]) for k in ("joint", "ar_alone", "dit_alone")):
        assert run["steps_done"] == 1 and "eval/reward" in run["before"] and "eval/reward" in run["after"], (name, run)
        step = run["steps"][0]
        assert step["reward"] == step["reward"], (name, step)
        assert (step["ar/sampler_gap"] is not None) == (name != "dit_alone"), (name, step)   # measured where the AR trains
    moved = {name: {h: learn[name]["lora_update"][h] > 0 for h in ("ar", "dit")} for name in ("joint", "ar_alone", "dit_alone")}
    assert moved == {"joint": {"ar": True, "dit": True}, "ar_alone": {"ar": True, "dit": False},
                     "dit_alone": {"ar": False, "dit": True}}, learn
    assert learn["joint"]["steps"][0]["ar/is_masked_fraction"] is not None   # the correction's figures are recorded
