"""The model card's loading snippet runs as written: taken from the card's own text, in a process that never imports
glm_grpo_nb, on a tiny run's adapters, it makes an image of the size the adapters were trained at."""
import re
import subprocess
import sys

from PIL import Image

from conftest import clean_env

from glm_grpo_nb.card import model_card
from glm_grpo_nb.policy import GlmImagePolicy
from glm_grpo_nb.rewards import RednessReward
from glm_grpo_nb.trainer import GRPOTrainer

PROMPTS = ["a red square", "a blue circle"]


def snippet(card: str) -> str:
    "The card's Python block under '## Use'."
    use = card[card.index("## Use"):]
    return re.search(r"```python\n(.*?)```", use, re.S).group(1)


def test_the_cards_snippet_runs_as_written(tiny_path, tmp_path):
    policy = GlmImagePolicy.from_pretrained(tiny_path, ar_lora=4, dit_lora=4, verbose=False)
    trainer = GRPOTrainer(policy, RednessReward(), PROMPTS, group_size=2, prompts_per_step=2, height=64, width=96,
                          num_inference_steps=4, output_dir=tmp_path / "run")
    trainer.fit(1, progress=False)
    adapters = trainer.save_adapters(tmp_path / "adapters")
    trainer.close()
    card = (adapters / "README.md").read_text()
    assert "# GLM-Image adapters trained with GRPO" in card
    code = snippet(card).replace("ADAPTERS", str(adapters))   # the card: "`ADAPTERS` is this folder"
    out = tmp_path / "snippet.png"
    code += (f"\nimage.save({str(out)!r})\nimport sys\n"
             "assert not [m for m in sys.modules if m.startswith('glm_grpo_nb')], 'the snippet must not need glm_grpo_nb'\n")
    r = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    with Image.open(out) as im: assert im.size == (96, 64), im.size   # the run's width x height


def test_online_dpo_cards_say_so(tiny_path):
    "A GRPO-trainer run whose halves train with DPO on its groups' best and worst samples is called what it is."
    policy = GlmImagePolicy.from_pretrained(tiny_path, ar_lora=4, dit_lora=4, verbose=False)
    for objectives, title in ((dict(ar_objective="dpo", dit_objective="dpo"), "trained with online DPO"),
                              (dict(ar_objective="dpo"), "trained with GRPO and online DPO"),
                              (dict(ar_objective="dpo", train_dit=False), "trained with online DPO")):
        t = GRPOTrainer(policy, RednessReward(), PROMPTS, group_size=2, prompts_per_step=2, height=64, width=64, **objectives)
        card = model_card(t)
        assert f"# GLM-Image adapters {title}\n" in card, (objectives, card[:600])
        assert ("a preference pair" in card) == ("dpo" in objectives.values())
        t.close()
