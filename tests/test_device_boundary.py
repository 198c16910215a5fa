"""Every tensor crosses between host and GPU through `policy.on_device` / `to_host`: checked on the CPU with
`device_boundary.DeviceBoundary`, which labels both sides and fails where they would meet on a GPU."""
import pytest
import torch
from PIL import Image

from device_boundary import DeviceBoundary, DeviceMix, DeviceMove


def _package_function(source: str, name: str):
    "A function compiled as if it were package code (the boundary looks at the caller's file)."
    import glm_grpo_nb.policy as policy_module
    namespace = {"torch": torch, "policy_module": policy_module}
    exec(compile(source, policy_module.__file__, "exec"), namespace)
    return namespace[name]


made_here = _package_function("def made_here(device):\n    return torch.zeros(4, 1, device=device)", "made_here")
draw = _package_function("def draw(gens, device):\n    return torch.randn(3, generator=gens[0], device=device)", "draw")
moved_by_hand = _package_function("def moved_by_hand(x):\n    return x.cpu()", "moved_by_hand")


@pytest.fixture(scope="module")
def policy(tiny_path):
    from glm_grpo_nb.policy import GlmImagePolicy
    return GlmImagePolicy.from_pretrained(tiny_path, load_in_4bit=True, ar_lora=4, dit_lora=4, sampling_copy=True,
                                          verbose=False)


def test_the_check_finds_a_mix_and_allows_what_cuda_allows(policy):
    import glm_grpo_nb.policy as policy_module
    with DeviceBoundary(policy):
        logp = policy.on_device(torch.randn(4, 10)).log_softmax(-1)
        index = policy_module.to_host(torch.zeros(4, 1, dtype=torch.long))
        with pytest.raises(DeviceMix, match="gather"):
            logp.gather(-1, index)                    # the first GPU step's crash: a CUDA gather with a CPU index
        with pytest.raises(DeviceMix):
            policy.ar.lm_head(policy_module.to_host(torch.randn(3, policy.ar.lm_head.in_features)))   # host input
        from glm_grpo_nb.loss import group_advantages
        advantages, _ = group_advantages([1.0, 2.0, 3.0, 4.0], 2)   # made from a list in the package: on the host
        with pytest.raises(DeviceMix, match="mul"):
            logp[:, 0] * advantages
        logp[index[:, 0]]                             # indexing with host indices: CUDA accepts it
        logp.copy_(policy_module.to_host(logp))       # copies cross devices by design
        logp * policy_module.to_host(torch.tensor(2.0))   # a 0-d host tensor is a scalar to CUDA
        with pytest.raises(DeviceMix):                # ... but a 0-d GPU tensor is not a scalar to a host tensor
            policy.on_device(torch.tensor(2.0)) * index.float()
        with pytest.raises(DeviceMix, match="sub"):   # a factory that names the policy's device makes a GPU tensor
            made_here(policy.device) - index.float()
        with pytest.raises(DeviceMix, match="generator"):   # noise drawn with a host generator onto the GPU
            draw(policy_module.generators([0]), policy.device)
        draw(policy_module.generators([0], policy.device), policy.device)   # a generator made for the GPU: fine
        with pytest.raises(DeviceMove, match="cpu"):  # moves by hand, outside on_device / to_host
            moved_by_hand(logp)
    assert policy.on_device(torch.ones(2)) is not None   # the policy is itself again after the block
    assert policy.device.index is None


def test_a_training_run_keeps_to_the_boundary(policy, tmp_path):
    from glm_grpo_nb.rewards import RednessReward
    from glm_grpo_nb.trainer import GRPOTrainer
    kw = dict(group_size=2, prompts_per_step=2, num_inference_steps=3, sde_window=[0, 1], micro_batch_size=3, kl_coef=0.1)
    prompts = ["a red square", "a 'HI' sign on a wall"]
    source = tmp_path / "source.png"
    Image.new("RGB", (64, 64), "navy").save(source)
    i2i = [{"prompt": "make it red", "source": str(source)}, {"prompt": "add a 'HI' sign", "source": str(source)}]
    runs = [(prompts, dict(output_dir=tmp_path / "joint")),
            (prompts, dict(mode="decoupled", output_dir=tmp_path / "decoupled")),
            (i2i, dict(output_dir=tmp_path / "i2i")),
            (prompts, dict(dit_objective="nft", nft_timesteps=2, output_dir=tmp_path / "nft")),
            (i2i, dict(dit_objective="nft", nft_timesteps=2, mode="decoupled", output_dir=tmp_path / "nft_i2i")),
            (prompts, dict(guidance_scale=1.0, kl_type="velocity", output_dir=tmp_path / "velocity_kl"))]
    with DeviceBoundary(policy) as boundary:
        for data, more in runs:
            trainer = GRPOTrainer(policy, RednessReward(), data, **kw, **more)
            result = trainer.step()
            assert not result.skipped and len(result.images) == 4
            assert set(trainer.evaluate(data, seed=0)) >= {"eval/reward"}
            trainer.save()   # NFT: the old adapter is written from the device
            trainer.close()
    assert boundary.ops > 10_000   # the check saw the whole step: sampling, decoding, both updates
    assert boundary.made > 100     # and the host tensors the package makes itself
