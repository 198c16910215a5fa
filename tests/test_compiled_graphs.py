"""The graphs a run compiles, counted on the CPU with dynamo backends that only count (the GPU's inductor compiles the
same captured graphs): training's decode step survives an evaluation of another batch size at another temperature,
and a flow_grpo step's DiT blocks compile once for the run, their checkpoint recompute included."""
import warnings

import torch
from transformers import CompileConfig

PROMPTS = ["a red square", "a blue circle on a 'GO' sign", "a green field at noon", "a 'HELLO THERE' poster"]
EVAL = ["a red door", "a 'STOP' sign", "a bowl of cherries", "a red balloon in the sky"]


class Counting:
    "A dynamo backend that records each captured graph's inputs and runs the graph as captured."
    def __init__(self): self.graphs = []
    def __call__(self, gm, example_inputs):
        self.graphs.append([n.meta["grapharg"] for n in gm.graph.nodes if n.op == "placeholder"])
        return gm.forward
    def __hash__(self): return id(self)   # a key of the compiled step's cache


def test_a_run_compiles_its_graphs_once(tiny_path):
    from glm_grpo_nb.policy import GlmImagePolicy
    from glm_grpo_nb.rewards import RednessReward
    from glm_grpo_nb.trainer import GRPOTrainer
    torch._dynamo.reset()
    decode, dit = Counting(), Counting()
    policy = GlmImagePolicy.from_pretrained(tiny_path, ar_lora=4, dit_lora=4, sampling_copy=True, verbose=False)
    policy.sampling_compile = CompileConfig(backend=decode, fullgraph=True, dynamic=False)
    policy.sampling_compile._compile_all_devices = True   # compiled on the CPU as on CUDA
    policy.dit_compile = dict(backend=dit)
    trainer = GRPOTrainer(policy, RednessReward(), PROMPTS, eval_prompts=EVAL, group_size=4, prompts_per_step=2,
                          height=64, width=64, num_inference_steps=4, seed=0)
    assert policy.row_bucket == 8 and policy.prompt_bucket == policy.prompt_length(PROMPTS + EVAL, 64, 64)
    counts = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for what in ("step", "evaluate", "step", "step"):
            if what == "step": assert not trainer.step().skipped
            else:   # 4 rows after training's 8, at another temperature
                trainer.config = trainer.config.replace(temperature=0.8)
                assert "eval/reward" in trainer.evaluate()
                trainer.config = trainer.config.replace(temperature=1.0)
            counts.append((what, len(decode.graphs), len(dit.graphs)))
    # the decode step: captured at the first step, replayed by the evaluation and every later step
    assert [d for _, d, _ in counts] == [1, 1, 1, 1], counts
    for inputs in decode.graphs:   # no host number among its inputs (on CUDA: no CPU scalar to skip CUDA graphs for)
        assert all(a.is_tensor and not a.pass_arg_as_tensor for a in inputs), [a.source.name for a in inputs if a.pass_arg_as_tensor]
    # the DiT's blocks: what the first step and the evaluation's batch compiled serves every later step (other prompts,
    # other glyph lengths, the update's forward and its recompute in the backward alike)
    after_first, after_eval = counts[0][2], counts[1][2]
    assert after_first > 0 and counts[2][2] == counts[3][2] == after_eval, counts
    assert not policy.transformer.training   # the DiT never left eval mode
    trainer.close()
