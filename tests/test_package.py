"The exported package works from a plain script, outside any notebook."
import subprocess
import sys
import textwrap

from conftest import clean_env

SCRIPT = textwrap.dedent('''
    import torch
    from diffusers import GlmImagePipeline
    from glm_grpo_nb.loss import group_advantages, clipped_surrogate, kl_k3, gaussian_kl, aggregate
    from glm_grpo_nb.tiny import make_tiny_glm_image
    from glm_grpo_nb.hub import folder_digest

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
