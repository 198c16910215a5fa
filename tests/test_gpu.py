"""The CUDA path on the tiny GLM-Image: everything a CPU test cannot see (device moves, bf16, the sampling copy with a
static, compiled cache). Skipped where there is no CUDA; `python -m bench.gpu_step` measures the full-size model."""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_step_on_cuda_is_on_policy(tiny_path, tmp_path):
    from glm_grpo_nb.policy import GlmImagePolicy
    from glm_grpo_nb.rewards import RednessReward
    from glm_grpo_nb.trainer import GRPOTrainer
    policy = GlmImagePolicy.from_pretrained(tiny_path, load_in_4bit=True, ar_lora=8, dit_lora=8, verbose=False)
    assert policy.device.type == "cuda" and policy.sampling_copy   # the defaults on CUDA
    trainer = GRPOTrainer(policy, RednessReward(), ["a red square", "a 'HI' sign"], group_size=4, prompts_per_step=2,
                          num_steps=4, sde_window=[0, 1], micro_batch_size=3, output_dir=tmp_path / "run", save_every=1)
    for _ in range(2):
        m = trainer.step().metrics
        assert not m["skipped"]
        assert abs(m["ar/ratio_min"] - 1) < 1e-3 and abs(m["ar/ratio_max"] - 1) < 1e-3, m   # old log-probs: training forward
        assert abs(m["dit/ratio_min"] - 1) < 1e-3 and abs(m["dit/ratio_max"] - 1) < 1e-3, m
        assert 0 <= m["ar/sampler_gap"] < 0.1, m                                             # bf16 copy vs NF4 + LoRA
    trainer.save()
    resumed = GRPOTrainer.resume(tmp_path / "run", GlmImagePolicy.from_pretrained(tiny_path, load_in_4bit=True, ar_lora=8,
                                                                                  dit_lora=8, verbose=False),
                                 RednessReward(), ["a red square", "a 'HI' sign"])
    assert resumed.step_count == 2


def test_sampling_copy_on_cuda_matches_in_float32(tiny_path):
    from torch._dynamo.utils import counters
    from glm_grpo_nb.policy import GlmImagePolicy
    torch._dynamo.reset(); counters.clear()
    kw = dict(ar_lora=8, torch_dtype=torch.float32, device="cuda", verbose=False)
    slow, fast = (GlmImagePolicy.from_pretrained(tiny_path, sampling_copy=s, **kw) for s in (False, True))
    a = slow.sample_tokens(["a red square", "a blue circle"], 3, 64, 64, seed=0)
    b = fast.sample_tokens(["a red square", "a blue circle"], 3, 64, 64, seed=0)
    assert torch.equal(a.completion, b.completion)   # the copy left-pads prompts to a multiple of 64 tokens
    assert (a.logprobs - b.logprobs).abs().max() < 1e-3
    assert counters["stats"]["unique_graphs"] >= 1                     # the decode step was compiled ...
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])   # ... as one graph
