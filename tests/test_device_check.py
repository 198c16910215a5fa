"""`bench.device_check` in its dry mode: the device script's own code path at the tiny model's size on the CPU, so that
a lent GPU never finds a mistake a CPU would have shown; and on a simulated clock with the card's recorded durations,
what one call of the device tool would bring back: its files (at most 8 with the kit's env.txt), the figures at the end
of stdout, each part's record when a part hangs or crashes."""
import json
import subprocess
import sys

from conftest import ROOT, clean_env

TIMELINE = ROOT / "bench" / "timelines" / "h200-2026-11-26.json"


def device_check(out, *args, timeout=600):
    r = subprocess.run([sys.executable, "-m", "bench.device_check", "--dry", "--out", str(out), *args],
                       cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((out / "device_check.json").read_text())["parts"], r.stdout


def simulated(tmp_path, name, speed=20, scale=1.0, **changes):
    "A call on the simulated clock with the recorded timeline, each phase `scale` times as long, some phases changed."
    timeline = {k: v * scale for k, v in json.loads(TIMELINE.read_text()).items()} | changes
    f = tmp_path / f"{name}.json"
    f.write_text(json.dumps(timeline))
    out = tmp_path / name
    parts, stdout = device_check(out, "--timeline", str(f), "--speed", str(speed))
    steps = out / "gpu_step_cpu_dry_steps.jsonl"
    lines = [json.loads(line) for line in steps.read_text().splitlines()] if steps.exists() else []
    decode = json.loads((out / "decode_cpu_dry.json").read_text()) if (out / "decode_cpu_dry.json").exists() else {}
    return parts, lines, decode, stdout, out


def test_one_default_call_with_the_recorded_timeline(tmp_path):
    "The H200's durations: ms per token step, cudagraph_skips and both step lines (both optimiser steps) come back, in stdout too."
    parts, lines, decode, stdout, out = simulated(tmp_path, "recorded", speed=10)
    assert parts["decode"]["status"] == "done" and parts["step"]["status"] == "done", parts
    assert decode["ms_per_token_step"] == round(1000 * 28 / 1280, 3) and decode["after_second"]["cudagraph_skips"] == 0
    assert len(lines) == 2 and all(s["optimizer_steps"] == 2 for s in lines), lines
    tail = stdout.strip().splitlines()[-(len(parts) + 4):]   # the figures are the last lines
    assert any(l.startswith("FIGURE decode: ms per token step 21.875") and "cudagraph_skips 0" in l for l in tail), tail
    assert any(l.startswith("FIGURE step 1: 85.0 s") for l in tail) and "FIGURE first step's extra: 73.0 s" in tail, tail
    assert all(f"PART {p}:" in stdout for p in parts), stdout
    assert len(list(out.iterdir())) <= 7   # with the kit's env.txt, at most the 8 files the device tool returns


def test_a_slower_card_still_returns_the_decode_and_a_step(tmp_path):
    "Every recorded duration 1.5 times as long: ms per token step and the first step line."
    parts, lines, decode, _, _ = simulated(tmp_path, "slower", speed=10, scale=1.5)
    assert decode.get("ms_per_token_step") == round(1000 * 42 / 1280, 3), (parts, decode)
    assert len(lines) >= 1 and lines[0]["step_seconds"] == 237.0, (parts, lines)


def test_a_hanging_decode_leaves_the_step_its_time(tmp_path):
    "(a) hangs: it is stopped where the step's reserve begins, and the step starts with its minimum and writes a line."
    parts, lines, decode, _, _ = simulated(tmp_path, "hang", decode_first=2000)
    assert parts["decode"]["status"] == "stopped at the budget" and "ms_per_token_step" not in decode, parts
    assert parts["step"]["status"] in ("done", "stopped at the budget") and len(lines) >= 1, (parts, lines)


def test_a_crashing_step_is_a_failed_part_and_the_next_runs(tmp_path):
    parts, lines, _, stdout, _ = simulated(tmp_path, "crash", speed=40, step_first="crash")
    assert parts["step"]["status"].startswith("failed: exit status 1"), parts
    assert "simulated crash in step_first" in parts["step"]["error"] and not lines, parts
    assert parts["profile"]["status"] == "done", parts   # the next part still ran
    assert "PART step: failed: exit status 1" in stdout


def test_a_second_call_reaches_the_tests(tmp_path):
    "--parts learning,gpu_tests: learning runs long, and is stopped where the tests' minimum begins; the tests run."
    f = tmp_path / "long_learning.json"
    f.write_text(json.dumps(json.loads(TIMELINE.read_text()) | {"learning_step": 300, "tests": 30}))
    parts, _ = device_check(tmp_path / "second", "--timeline", str(f), "--speed", "40", "--budget", "300",
                            "--parts", "learning,gpu_tests")
    assert parts["learning"]["status"] == "stopped at the budget" and parts["gpu_tests"]["status"] == "done", parts


def test_every_part_writes_at_most_seven_files(tmp_path):
    "Budget enough for every part: device_check.json, the five parts' files and logs.tar.gz (env.txt is the kit's)."
    f = tmp_path / "quick.json"
    f.write_text(json.dumps({k: 1 for k in json.loads(TIMELINE.read_text())}))
    parts, _ = device_check(tmp_path / "all", "--timeline", str(f), "--speed", "20")
    assert set(parts) == {"decode", "step", "profile", "learning", "gpu_tests"} and all(
        p["status"] == "done" for p in parts.values()), parts
    files = sorted(p.name for p in (tmp_path / "all").iterdir())
    assert files == sorted(["device_check.json", "decode_cpu_dry.json", "gpu_step_cpu_dry_steps.jsonl",
                            "decode_cpu_dry_profile.txt", "learning_released_cpu_dry.jsonl", "gpu_tests.json",
                            "logs.tar.gz"]), files
    import tarfile
    with tarfile.open(tmp_path / "all" / "logs.tar.gz") as tar: names = tar.getnames()
    assert {"decode.log", "step.log", "profile.log", "learning.log", "gpu_tests.log"} <= set(names), names


def test_a_cut_off_part_keeps_what_it_wrote(tmp_path):
    "The real code on the tiny model: decode's figures whole, the steps that ended as whole lines, the profile's tables."
    parts, stdout = device_check(tmp_path, "--budget", "100", "--dry-steps", "500", "--parts", "decode,step,profile")
    assert parts["decode"]["status"] == "done", parts
    assert parts["step"]["status"] == "stopped at the budget", parts
    assert parts["profile"]["status"].startswith("skipped"), parts   # less left than its minimum: not started
    decode = json.loads((tmp_path / "decode_cpu_dry.json").read_text())
    assert decode["done"] and decode["rows"] == 8 and decode["tokens"] == 260, decode
    assert decode["ms_per_token_step"] > 0, decode
    assert decode["after_first"]["unique_graphs"] == 1 and decode["new_graphs_in_second_call"] == 0, decode
    assert decode["after_second"]["graph_breaks"] == 0 and decode["after_second"]["cudagraph_skips"] == 0, decode
    # (b) the step: killed mid-run, every step that ended is a whole JSON line with both optimiser steps
    steps = [json.loads(line) for line in (tmp_path / "gpu_step_cpu_dry_steps.jsonl").read_text().splitlines()]
    assert 1 <= len(steps) < 500, len(steps)
    assert [s["step"] for s in steps] == list(range(len(steps)))
    for s in steps:
        assert s["failure"] is None and {"sample_ar", "sample_dit", "update_ar", "update_dit"} <= set(s["seconds"]), s
        assert s["cudagraph_skips"] == 0 and s["optimizer_steps"] == 2, s
        assert s["compile_seconds"] is None or s["compile_seconds"] >= 0, s   # eager on the CPU: nothing timed, null
    assert "FIGURE step 0:" in stdout and "PART step: stopped at the budget" in stdout


def test_the_profile_part_writes_its_tables(tmp_path):
    parts, _ = device_check(tmp_path, "--budget", "300", "--parts", "profile")
    assert parts["profile"]["status"] == "done", parts
    table = (tmp_path / "decode_cpu_dry_profile.txt").read_text()
    assert "20 replays of the compiled decode step" in table and "one DiT forward" in table and table.count("aten::") > 20
    figures = json.loads(table.strip().splitlines()[-1])
    assert figures["replay_20_steps_seconds"] > 0 and figures["dit_forward_seconds"] > 0
    assert figures["after_replays"]["unique_graphs"] == 1 and figures["after_replays"]["graph_breaks"] == 0, figures


def test_the_learning_part_runs_dry(tmp_path):
    "(d): each run evaluated before and after, a line per step, only its own halves' adapters moved."
    parts, _ = device_check(tmp_path, "--budget", "300", "--parts", "learning")
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


def test_unknown_parts_and_timelines_are_refused(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench.device_check", "--dry", "--parts", "decode,speed", "--out", str(tmp_path)],
                       cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "unknown part(s) ['speed']" in r.stderr and "decode, step, profile, learning, gpu_tests" in r.stderr
    (tmp_path / "t.json").write_text(json.dumps({"build": 1}))
    r = subprocess.run([sys.executable, "-m", "bench.device_check", "--dry", "--timeline", str(tmp_path / "t.json"),
                        "--out", str(tmp_path)], cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "missing ['decode_first'" in r.stderr, r.stderr
