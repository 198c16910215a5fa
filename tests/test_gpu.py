"""The CUDA path on the tiny GLM-Image: everything a CPU test cannot see (device moves, bf16, the sampling copy with a
static, compiled cache). Skipped where there is no CUDA; `python -m bench.gpu_step` measures the full-size model."""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def new_cudagraph_skips():
    "The graphs inductor could not run as CUDA graphs since this test began (the counter is the session's: a delta)."
    from torch._dynamo.utils import counters
    start = counters["inductor"]["cudagraph_skips"]
    return lambda: counters["inductor"]["cudagraph_skips"] - start


@pytest.fixture(autouse=True)
def no_tf32():
    "CPU float32 is compared with CUDA here: cuDNN's default TF32 (10-bit mantissa) would miss the tolerances."
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def test_step_on_cuda_is_on_policy(tiny_path, tmp_path):
    from glm_grpo_nb.policy import GlmImagePolicy
    from glm_grpo_nb.rewards import RednessReward
    from glm_grpo_nb.trainer import GRPOTrainer
    # float32 compute under NF4: the recomputation is exact up to float32 (bf16 on this tiny DiT moves a first ratio by
    # about 1e-3 through batch shapes alone: its latent is 1,024 numbers; at the released size, 1e-6, in bench.gpu_step)
    trainer = _trainer(tiny_path, torch_dtype=torch.float32, sde_window=[0, 1], micro_batch_size=3,
                       output_dir=tmp_path / "run", save_every=1)
    policy = trainer.policy
    assert policy.device.type == "cuda" and policy.sampling_copy   # the defaults on CUDA
    for _ in range(2):
        m = trainer.step().metrics
        assert not m["skipped"]
        assert abs(m["ar/first_ratio_min"] - 1) < 1e-3 and abs(m["ar/first_ratio_max"] - 1) < 1e-3, m   # old log-probs: training forward
        assert abs(m["dit/first_ratio_min"] - 1) < 1e-4 and abs(m["dit/first_ratio_max"] - 1) < 1e-4, m
        assert 0 <= m["ar/sampler_gap"] < 0.1, m                                             # the copy vs NF4 + LoRA
    trainer.save()
    resumed = GRPOTrainer.resume(tmp_path / "run", GlmImagePolicy.from_pretrained(tiny_path, load_in_4bit=True, ar_lora=8,
                                                                                  dit_lora=8, torch_dtype=torch.float32,
                                                                                  verbose=False),
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


def test_4bit_sampling_copy_is_bf16_and_compiled(tiny_path):
    """Under 4-bit in bf16 (the CLI's path): the copy is bf16 with its own bf16 head, carries no quantizer, and its decode
    loop compiles the step into one graph; small adapter changes reach it (the sampler gap stays at bf16 noise)."""
    from torch._dynamo.utils import counters
    from glm_grpo_nb.policy import GlmImagePolicy
    from glm_grpo_nb.sampling_copy import LowRankLinear
    torch._dynamo.reset(); counters.clear()
    policy = GlmImagePolicy.from_pretrained(tiny_path, load_in_4bit=True, ar_lora=8, verbose=False)
    copy = policy.sampling_model()
    assert getattr(policy.ar, "hf_quantizer", None) is not None and copy.hf_quantizer is None
    dtypes = {p.dtype for p in copy.model.language_model.parameters()} | {copy.lm_head.weight.dtype}
    assert dtypes == {torch.bfloat16}, dtypes
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n: p.copy_(torch.randn(p.shape, generator=g).to(p) * 1e-4)   # far below a bf16 step
    roll = policy.sample_tokens(["a red square", "a blue circle"], 4, 64, 64, seed=0)
    assert counters["stats"]["unique_graphs"] >= 1 and sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert next(iter(policy._kv.values()))[0].layers[0].keys.dtype == torch.bfloat16   # the KV cache in bf16 too
    # the rollout lives on the host, the policy's log-probs (with their graph) on its device: `on_device` crosses
    with torch.no_grad(): lp = policy.token_logprobs(roll)
    gap = (policy.on_device(roll.logprobs) - lp).abs()[policy.on_device(roll.completion_mask)].mean().item()
    assert gap < 5e-3, gap
    assert any(m.lora_A.shape[0] and m.lora_B.abs().max() > 0 for m in copy.modules() if isinstance(m, LowRankLinear))
    graphs = counters["stats"]["unique_graphs"]
    for step in range(2):   # the same batch size again: the cache is reused and nothing recompiles
        policy.sample_tokens(["a red square", "a blue circle"], 4, 64, 64, seed=step)
    assert counters["stats"]["unique_graphs"] == graphs
    # with the run's row bucket (the trainer's), an evaluation of 4 rows at another temperature replays the same graph
    policy.row_bucket = 8
    policy.sample_tokens(["a red field", "a blue field", "a green field", "a grey field"], 1, 64, 64, seed=3, temperature=0.7)
    policy.sample_tokens(["a red square", "a blue circle"], 4, 64, 64, seed=4)
    assert counters["stats"]["unique_graphs"] == graphs
    assert counters["inductor"]["cudagraph_skips"] == 0   # since the counters.clear() above: every graph of this test ran as a CUDA graph


def test_model_rewards_on_cuda_match_cpu(tmp_path):
    "Reward models placed on the GPU: inputs go to their device, scores come back as CPU float tensors, as on the CPU."
    from PIL import Image
    from glm_grpo_nb.rewards import (AestheticReward, CLIPScoreReward, OCRReward, PerceptualReward, PickScoreReward,
                                      evaluate_reward)
    from glm_grpo_nb.tiny_rewards import make_tiny_clip, make_tiny_ocr
    from safetensors.torch import save_file
    clip, ocr = str(make_tiny_clip(tmp_path / "clip")), str(make_tiny_ocr(tmp_path / "ocr"))
    dim = CLIPScoreReward(clip).image_embeds([Image.new("RGB", (32, 32))]).shape[-1]
    save_file({"0.weight": torch.randn(4, dim), "0.bias": torch.randn(4), "1.weight": torch.randn(1, 4)}, tmp_path / "head.safetensors")
    images = [Image.new("RGB", (64, 64), c) for c in ("red", "green", "navy")]
    prompts, targets = ["a red square", "a 'HI' sign", "navy"], [Image.new("RGB", (64, 64), "red")] * 3
    makers = [lambda d: CLIPScoreReward(clip, device=d), lambda d: PickScoreReward(clip, processor=None, device=d),
              lambda d: AestheticReward(tmp_path / "head.safetensors", model=clip, device=d),
              lambda d: PerceptualReward(clip, device=d), lambda d: OCRReward(model=ocr, device=d, max_new_tokens=6)]
    for make in makers:
        on_cpu, on_gpu = make("cpu"), make("cuda")
        a = evaluate_reward(on_cpu, images, prompts, targets=targets).total
        b = evaluate_reward(on_gpu, images, prompts, targets=targets).total
        model = on_gpu.model if hasattr(on_gpu, "model") else on_gpu.ocr.model   # OCRReward holds a TransformersOCR
        assert next(model.parameters()).device.type == "cuda", type(on_gpu).__name__
        assert b.device.type == "cpu" and b.dtype == torch.float32 and b.shape == (3,), type(on_gpu).__name__
        assert torch.allclose(a, b, atol=1e-3), (type(on_gpu).__name__, a, b)
    assert next(CLIPScoreReward(clip).model.parameters()).device.type == "cuda"   # unasked, a reward model goes to the GPU


def test_nft_step_on_cuda(tiny_path, tmp_path):
    "DiffusionNFT on CUDA in 4-bit bf16: the old adapter swaps on the device, points and velocities cross in one place."
    from glm_grpo_nb.policy import GlmImagePolicy
    from glm_grpo_nb.rewards import RednessReward
    from glm_grpo_nb.trainer import GRPOTrainer
    policy = GlmImagePolicy.from_pretrained(tiny_path, load_in_4bit=True, ar_lora=8, dit_lora=8, verbose=False)
    trainer = GRPOTrainer(policy, RednessReward(), ["a red square", "a 'HI' sign"], group_size=4, prompts_per_step=2,
                          num_inference_steps=4, dit_objective="nft", nft_timesteps=2, nft_decay_rate=0.3, kl_coef=0.01,
                          micro_batch_size=3, output_dir=tmp_path / "run", save_every=1)
    assert all(w.device.type == "cuda" for w in trainer.objectives['dit'].old.weights)
    for _ in range(2):
        m = trainer.step().metrics
        assert not m["skipped"] and m["dit/grad_norm"] > 0 and m["dit/kl"] >= 0, m
    assert any(not torch.equal(w, p) for w, p in zip(trainer.objectives['dit'].old.weights, trainer.dit_params))
    trainer.save(); trainer.close()
    resumed = GRPOTrainer.resume(tmp_path / "run", GlmImagePolicy.from_pretrained(tiny_path, load_in_4bit=True, ar_lora=8,
                                                                                  dit_lora=8, verbose=False),
                                 RednessReward(), ["a red square", "a 'HI' sign"])
    assert all(torch.equal(a, b) for a, b in zip(resumed.objectives['dit'].old.weights, trainer.objectives['dit'].old.weights))


def test_cfg_free_flow_grpo_on_cuda(tiny_path):
    "Flow-GRPO with guidance 1.0, cps steps and the KL on the velocity, on CUDA: on-policy ratios stay 1."
    trainer = _trainer(tiny_path, torch_dtype=torch.float32,   # float32 compute: see test_step_on_cuda_is_on_policy
                       sde_window=[0, 1], sde_type="cps", guidance_scale=1.0, kl_coef=0.1, kl_type="velocity", train_ar=False)
    m = trainer.step().metrics
    assert abs(m["dit/first_ratio_min"] - 1) < 1e-4 and abs(m["dit/first_ratio_max"] - 1) < 1e-4 and m["dit/kl"] >= 0, m


def _trainer(tiny_path, load_in_4bit=True, data=("a red square", "a 'HI' sign"), torch_dtype=None, **kw):
    from glm_grpo_nb.policy import GlmImagePolicy
    from glm_grpo_nb.rewards import RednessReward
    from glm_grpo_nb.trainer import GRPOTrainer
    policy = GlmImagePolicy.from_pretrained(tiny_path, load_in_4bit=load_in_4bit, ar_lora=8, dit_lora=8,
                                            torch_dtype=torch_dtype, verbose=False)
    return GRPOTrainer(policy, RednessReward(), list(data), group_size=4, prompts_per_step=2, num_inference_steps=4, **kw)


@pytest.mark.parametrize("load_in_4bit", [True, False], ids=["nf4", "bf16"])
@pytest.mark.parametrize("objective,kw", [
    ("grpo_guard", dict(sde_window=[0, 1], sde_window_schedule="progressive")),
    ("awm", dict(awm_timesteps=2)),
    ("dgpo", dict(dgpo_timesteps=2)),
    ("flow_grpo", dict(sde_window=[0, 1])),
    ("nft", dict(nft_timesteps=2))])
def test_every_objective_on_cuda_in_both_dtypes(tiny_path, objective, kw, load_in_4bit):
    """Each DiT objective on CUDA, NF4 and plain bf16 bases: the adapters, the optimiser's state and every old/EMA copy
    stay float32 on the device, and two steps train without a skip (the window moves for GRPO-Guard)."""
    trainer = _trainer(tiny_path, load_in_4bit, dit_objective=objective, micro_batch_size=3, **kw)
    assert trainer.policy.dit_dtype == torch.bfloat16
    trained = trainer.ar_params + trainer.dit_params
    assert {(p.dtype, p.device.type) for p in trained} == {(torch.float32, "cuda")}
    for _ in range(2):
        m = trainer.step().metrics
        assert not m["skipped"] and m["dit/grad_norm"] > 0, m
    states = [s for st in trainer.optimizer.state.values() for s in st.values() if torch.is_tensor(s) and s.dim()]
    assert states and {(s.dtype, s.device.type) for s in states} == {(torch.float32, "cuda")}
    copy = getattr(trainer.objectives["dit"], "adapter_copy", None)   # the NFT old adapter, AWM and DGPO EMAs
    if copy is not None: assert {(w.dtype, w.device.type) for w in copy.weights} == {(torch.float32, "cuda")}
    if objective == "grpo_guard": assert "sde_window_start" in m
    trainer.close()


def test_i2i_and_decoupled_on_cuda(tiny_path):
    "Image-to-image (the source's keys and values once per prompt, on the device) and decoupled mode, on CUDA."
    from PIL import Image
    src = [Image.linear_gradient("L").convert("RGB").resize((64, 64))]
    trainer = _trainer(tiny_path, data=[{"prompt": "make it red", "source": src}, {"prompt": "add a dot", "source": src}],
                       sde_window=[0, 1], micro_batch_size=3, torch_dtype=torch.float32)   # as on_policy: float32 compute
    m = trainer.step().metrics
    assert not m["skipped"] and abs(m["dit/first_ratio_min"] - 1) < 1e-4 and abs(m["dit/first_ratio_max"] - 1) < 1e-4, m
    assert "_sources" not in trainer.policy.__dict__   # released after the update
    trainer.close()
    trainer = _trainer(tiny_path, mode="decoupled", sde_window=[0, 1], torch_dtype=torch.float32)
    res = trainer.step()
    assert not res.skipped and res.dit_images is not None and abs(res.metrics["dit/first_ratio_max"] - 1) < 1e-4, res.metrics
    trainer.close()


def test_evaluate_and_out_of_memory_retry_on_cuda(tiny_path, monkeypatch):
    """evaluate() during fit on CUDA, in sampling batches decoded in training's one cache (the row bucket); an
    out-of-memory error in sampling halves the batch and the step still trains (the retry frees CUDA memory first)."""
    trainer = _trainer(tiny_path, eval_prompts=["a red field", "a blue field", "a green field"], eval_every=1,
                       dit_sample_batch=8, ar_sample_batch=2)
    policy, real = trainer.policy, trainer.policy.sample_latents
    calls = []
    def flaky(roll, **kw):
        calls.append(roll.num_samples)
        if roll.num_samples > 4: raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real(roll, **kw)
    monkeypatch.setattr(policy, "sample_latents", flaky)
    hist = trainer.fit(1, progress=False)
    assert calls[0] == 8 and trainer.config.dit_sample_batch == 4 and hist[-1]["lowered/dit_sample_batch"] == 4
    assert "eval/reward" in hist[-1] and [k[0] for k in policy._kv] == [policy.row_bucket] == [2]   # one cache: training's
    trainer.close()


def test_released_width_step_learns_on_cuda(tmp_path, new_cudagraph_skips):
    """The released width, vocabulary and token ids with two layers per stack, one GRPO step at 1024x1024 with the
    trainer's defaults (G = 4 x 2, 10 denoising steps, NF4, the sampling copy, gradient checkpointing): not skipped, and
    every AR and DiT gradient of the first optimiser step finite (the H200's first run skipped every step: ar/grad_norm NaN)."""
    from glm_grpo_nb.policy import GlmImagePolicy
    from glm_grpo_nb.rewards import RednessReward
    from glm_grpo_nb.tiny import make_random_glm_image
    from glm_grpo_nb.trainer import GRPOTrainer
    parts = make_random_glm_image("cuda", torch.bfloat16, layers=2, load_in_4bit=True)
    policy = GlmImagePolicy.from_components(parts, load_in_4bit=True, ar_lora=16, dit_lora=16, device="cuda")
    del parts
    assert policy.sampling_copy
    prompts = ["a lighthouse on a cliff at dusk, oil painting", "a bowl of ramen on a wooden table, photo"]
    trainer = GRPOTrainer(policy, RednessReward(), prompts, group_size=4, prompts_per_step=2, height=1024, width=1024,
                          num_inference_steps=10, output_dir=tmp_path / "run")
    grads = []
    real = trainer.optimizer.step
    def step_and_check(*a, **kw):   # the gradients each optimiser step applies
        grads.append({n: bool(torch.isfinite(p.grad).all()) for n, p in policy.named_parameters() if p.grad is not None})
        return real(*a, **kw)
    trainer.optimizer.step = step_and_check
    res = trainer.step()
    assert not res.skipped, res.skip_reason
    m = res.metrics
    assert grads and all(all(g.values()) for g in grads), [n for g in grads for n, ok in g.items() if not ok][:5]
    assert any("vision_language_encoder" in n for n in grads[0]) and any("transformer" in n for n in grads[0])
    assert 0 < m["ar/grad_norm"] < float("inf") and 0 < m["dit/grad_norm"] < float("inf"), m
    assert abs(m["ar/first_ratio_min"] - 1) < 1e-3 and abs(m["ar/first_ratio_max"] - 1) < 1e-3, m
    assert abs(m["dit/first_ratio_min"] - 1) < 1e-3 and abs(m["dit/first_ratio_max"] - 1) < 1e-3, m
    assert trainer.optimizer_steps == trainer.config.updates_per_batch == 2
    assert new_cudagraph_skips() == 0   # the decode step ran as CUDA graphs throughout (in this test)
    assert m["ar/rollout_k3_kl"] > 0 and 0 < m["ar/rollout_chi2_token"] < float("inf"), m   # the bf16 copy is another sampler
    print("mismatch:", {k: v for k, v in m.items() if k.startswith("ar/rollout_") or k.endswith(("_ppl", "sampler_gap"))})
    trainer.config.rollout_importance_sampling_mode = "token_truncate"   # its correction: weights made on the host, used here
    res = trainer.step()
    assert not res.skipped, res.skip_reason
    assert 0 < res.metrics["ar/is_weight_mean"] <= 2 and 0 <= res.metrics["ar/is_truncated_fraction"] < 1, res.metrics
    print("corrected:", {k: v for k, v in res.metrics.items() if k.startswith(("ar/is_", "ar/rollout_"))})
    trainer.close()
