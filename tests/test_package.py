"The exported package works from a plain script, outside any notebook."
import os
import subprocess
import sys
import textwrap

from conftest import clean_env

SCRIPT = textwrap.dedent('''
    import torch
    from diffusers import GlmImagePipeline
    from glm_grpo_nb.loss import group_advantages, clipped_surrogate, kl_k3, gaussian_kl, aggregate
    from glm_grpo_nb.tiny import make_tiny_glm_image
    from glm_grpo_nb.run_files import folder_digest

    adv, m = group_advantages(torch.tensor([0., 1., 2., 2.]), group_size=2)
    assert adv[2] == 0 and adv[3] == 0 and m["zero_std_fraction"] == 0.5 and adv[0] < 0 < adv[1]
    lp = torch.zeros(4, 3, requires_grad=True)
    loss, metrics = clipped_surrogate(lp, lp.detach(), adv)
    loss.backward()
    assert metrics["clip_fraction"] == 0 and lp.grad is not None

    import sys
    path = make_tiny_glm_image(sys.argv[1], seed=3)
    assert folder_digest(path) == folder_digest(make_tiny_glm_image(sys.argv[1] + "_again", seed=3))
    pipe = GlmImagePipeline.from_pretrained(path)
    pipe.set_progress_bar_config(disable=True)
    img = pipe(["a dog", "a 'CAT'"], height=64, width=96, num_inference_steps=2,
               generator=torch.Generator().manual_seed(0)).images
    assert [i.size for i in img] == [(96, 64), (96, 64)], [i.size for i in img]
    print("OK")
''')


def test_plain_script_uses_the_package(tmp_path):
    script = tmp_path / "use_it.py"
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "tiny")], capture_output=True, text=True,
                       env=clean_env(), cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("OK")


def test_policy_has_all_its_methods_whichever_module_comes_first():
    "The stage modules add their methods to GlmImagePolicy; importing any one module first must bring all of them."
    methods = ["from_pretrained", "reference", "save_adapters", "sample_tokens", "token_logprobs", "rollout_from_tokens",
               "sample_latents", "latent_logprobs", "decode", "noised_velocity", "sampling_model", "sampling_cache",
               "clear_sampling_caches", "decode_tokens", "prompt_length"]
    def check(first):   # a fresh interpreter each: the order of imports is the point
        code = (f"import {first}\nfrom glm_grpo_nb.policy import GlmImagePolicy\n"
                f"missing = [m for m in {methods!r} if not hasattr(GlmImagePolicy, m)]\nassert not missing, missing")
        return first, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=300)
    from concurrent.futures import ThreadPoolExecutor
    firsts = ("glm_grpo_nb.policy", "glm_grpo_nb.sampling_copy", "glm_grpo_nb.tokens", "glm_grpo_nb.decode_loop",
              "glm_grpo_nb.flow", "glm_grpo_nb.nft", "glm_grpo_nb.trainer")
    with ThreadPoolExecutor(max(1, min(len(firsts), os.cpu_count() or 1))) as pool:   # independent: side by side
        for first, out in pool.map(check, firsts):
            assert out.returncode == 0, f"importing {first} first:\n{out.stderr[-2000:]}"


def test_package_import_stays_light():
    "The command line imports the package before anything else; that must not load torch."
    out = subprocess.run([sys.executable, "-c", "import sys, glm_grpo_nb.cli, glm_grpo_nb.config; print('torch' in sys.modules)"],
                         capture_output=True, text=True, env=clean_env(), timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


def test_every_module_imports_hub_before_upstream():
    "bitsandbytes prints its Hub-kernel notice when first imported: hub's filter must be in place before any upstream import."
    import re
    from conftest import ROOT
    late = []
    for f in sorted((ROOT / "glm_grpo_nb").glob("*.py")):
        lines = f.read_text().splitlines()
        up = next((i for i, l in enumerate(lines)
                   if re.match(r"(from|import) (transformers|diffusers|bitsandbytes|peft|accelerate)\b", l)), None)
        ours = next((i for i, l in enumerate(lines) if re.match(r"from (\.|glm_grpo_nb)", l)), None)
        if up is not None and (ours is None or ours > up): late.append(f.name)
    assert late == [], f"import glm_grpo_nb.hub (or a module that does) before upstream in {late}"
