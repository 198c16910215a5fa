"""Faults injected into a GRPO step, one at a time (the table of `nbs/04c_faults.ipynb` says what each must do): out of
memory in every phase, a retry that must not keep the failed attempt alive, another process holding the run folder,
a non-finite weight after the optimiser step, and a metrics file that cannot be written."""
import json
import subprocess
import sys
import warnings
import weakref

import pytest
import torch

from glm_grpo_nb.faults import OutOfMemory
from glm_grpo_nb.policy import GlmImagePolicy
from glm_grpo_nb.rewards import RednessReward
from glm_grpo_nb.trainer import GRPOTrainer

PROMPTS = ["a red square on a blue background", "a green circle on a white background", "a gradient from yellow to navy"]
SETTINGS = dict(group_size=4, prompts_per_step=2, height=64, width=64, num_inference_steps=6, sde_window=(0, 2),
                lr=3e-3, seed=0)


@pytest.fixture
def new_trainer(tiny_path):
    def make(**over):
        policy = GlmImagePolicy.from_pretrained(tiny_path, ar_lora=8, dit_lora=8, verbose=False)
        return GRPOTrainer(policy, RednessReward(), PROMPTS, **{**SETTINGS, **over})
    return make


def adapters(trainer):
    return {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if p.requires_grad}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def oom_above(obj, name, limit, count):
    "Make obj.name raise CUDA's out-of-memory error when called with more than `limit` samples."
    real = getattr(obj, name)
    def wrapped(*a, **k):
        n = count(*a, **k)
        if n > limit: raise torch.OutOfMemoryError(f"CUDA out of memory (injected: {n} > {limit} samples)")
        return real(*a, **k)
    setattr(obj, name, wrapped)


PHASES = {"sample_ar": ("sample_tokens", 2, lambda prompts, G, *a, **k: len(prompts) * G, "ar_sample_batch"),
          "sample_dit": ("sample_latents", 2, lambda roll, *a, **k: roll.num_samples, "dit_sample_batch"),
          "decode": ("decode", 1, lambda traj, b=2, *a, **k: min(b, traj.rollout.num_samples), "decode_batch"),
          "update": ("token_logprobs", 2, lambda roll, *a, **k: roll.num_samples, "micro_batch_size")}


@pytest.mark.parametrize("phase", list(PHASES))
def test_out_of_memory_halves_the_phase_batch(new_trainer, phase):
    "The step goes through with the phase's batch halved until it fits, and equals a step started with that batch."
    method, limit, count, name = PHASES[phase]
    t = new_trainer()
    oom_above(t.policy, method, limit, count)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = t.step()
    smaller = new_trainer(**{name: limit})
    want = smaller.step()
    assert getattr(t.config, name) == limit and got.metrics[f"lowered/{name}"] == limit
    assert any(f"out of memory in {phase}" in str(x.message) for x in caught)
    assert torch.equal(got.rewards, want.rewards) and torch.equal(got.advantages, want.advantages)
    assert same(adapters(t), adapters(smaller))


def test_out_of_memory_at_a_batch_of_one_names_the_phase_and_the_plan(new_trainer):
    t = new_trainer()
    oom_above(t.policy, "decode", 0, lambda traj, *a, **k: 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(OutOfMemory, match="out of memory in decode with decode_batch=2 then 1"): t.step()
    with pytest.raises(OutOfMemory, match="glm-grpo plan --height 64 --width 64 --group-size 4 --prompts-per-step 2 "
                                          "--no-load-in-4bit"):
        t.step()
    assert t.step_count == 0


def test_retry_runs_after_the_failed_attempt_is_gone(new_trainer):
    """A tensor the failed attempt held is freed before the retry; a cuBLAS allocation failure is retried like torch's
    out-of-memory error; the final error carries no chained traceback; any other error passes through untouched."""
    held = []
    def fails_once():
        if not held:
            activations = torch.zeros(1000)
            held.append(weakref.ref(activations))
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
        assert held[0]() is None, "the failed attempt's tensor is still alive"
        return "retried"
    t = new_trainer()
    t.policy._kv[(8, "cpu")] = ("a cache", 100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert t._retry_oom("decode", 8, fails_once) == "retried"
    assert (t.config.decode_batch, t.policy._kv) == (1, {})   # halved once; the sampling caches freed
    def never_fits(): raise torch.OutOfMemoryError("CUDA out of memory (injected)")
    with pytest.raises(OutOfMemory, match="OutOfMemoryError") as e: t._retry_oom("decode", 8, never_fits)
    assert e.value.__context__ is None and e.value.__cause__ is None
    def shape_bug(): raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"): t._retry_oom("decode", 8, shape_bug)
    assert t.config.decode_batch == 1


def test_one_live_trainer_per_output_dir(new_trainer, tmp_path):
    """Another process holding the folder makes a new trainer fail; once it is gone its stale lock is taken over. In one
    process the newer trainer takes over and the older stops writing. A new run on a folder holding a run is refused."""
    busy = tmp_path / "busy_run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from glm_grpo_nb.run_files import RunLock, mark_folder; "
                               "l = RunLock(mark_folder(sys.argv[1], 'run')); print('locked', flush=True); time.sleep(300)",
                               str(busy)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RuntimeError, match=f"in use by process {holder.pid}"): new_trainer(output_dir=busy)
    finally:
        holder.kill(); holder.wait()
    after = new_trainer(output_dir=busy)   # the dead holder's lock is stale
    newer = new_trainer(output_dir=busy)
    with pytest.raises(RuntimeError, match="taken over"): after.step()
    newer.step()
    with pytest.raises(ValueError, match="already holds a run"): new_trainer(output_dir=busy)
    newer.close()


def test_non_finite_weight_after_the_optimiser_step_is_undone(new_trainer):
    "A learning rate that became NaN: the step is skipped, weights and optimiser state put back."
    t = new_trainer()
    t.step()
    weights, steps = adapters(t), [s["step"].clone() for s in t.optimizer.state.values()]
    for g in t.optimizer.param_groups: g["lr"] = float("nan")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = t.step()
    assert r.skipped and any("not finite after the optimiser step" in str(x.message) for x in caught)
    assert same(weights, adapters(t))
    assert [s["step"] for s in t.optimizer.state.values()] == steps


def test_a_failed_metrics_write_changes_nothing(new_trainer, tmp_path):
    """metrics.jsonl cannot be opened (a full or read-only disk): step() raises and nothing changed; once fixed, the
    retried step gives exactly the run that never failed."""
    t = new_trainer(output_dir=tmp_path / "faulty_disk")
    t.step()
    metrics = tmp_path / "faulty_disk" / "metrics.jsonl"
    metrics.rename(tmp_path / "metrics.bak"); metrics.mkdir()   # opening it for appending now fails
    weights = adapters(t)
    with pytest.raises(OSError, match="Is a directory"): t.step()
    assert (t.step_count, len(t.history)) == (1, 1)
    assert same(weights, adapters(t))
    metrics.rmdir(); (tmp_path / "metrics.bak").rename(metrics)
    t.step()
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [0, 1]
    uninterrupted = new_trainer()
    uninterrupted.fit(2, progress=False)
    assert same(adapters(t), adapters(uninterrupted))
    t.close()
