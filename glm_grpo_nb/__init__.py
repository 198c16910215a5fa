__version__ = "0.1.0"

# `GlmImagePolicy` is defined in `policy`; its AR and DiT methods are added by the stage modules `sampling_copy`, `tokens`, `flow`, `nft`,
# which import `policy` (never the reverse). So that a policy always has all its methods, whichever module is imported
# first, the stage modules are imported right after `policy` finishes loading. The package itself stays light: the
# command line starts without torch.
import importlib as _importlib
import sys as _sys
from importlib.abc import Loader as _Loader, MetaPathFinder as _MetaPathFinder

_STAGES = ("sampling_copy", "tokens", "decode_loop", "flow", "nft")

class _ThenStages(_Loader):
    "Wraps the loader of `glm_grpo_nb.policy`: execute it, then import the stage modules."
    def __init__(self, loader): self.loader = loader
    def __getattr__(self, name): return getattr(self.loader, name)
    def create_module(self, spec): return self.loader.create_module(spec)
    def exec_module(self, module):
        self.loader.exec_module(module)
        for stage in _STAGES: _importlib.import_module(f"{__name__}.{stage}")

class _StageMethods(_MetaPathFinder):
    "Finds `glm_grpo_nb.policy` with the other finders and wraps its loader in `_ThenStages`."
    def find_spec(self, name, path=None, target=None):
        if name != f"{__name__}.policy": return None
        for finder in _sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"): continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                spec.loader = _ThenStages(spec.loader)
                return spec
        return None

if not any(isinstance(f, _StageMethods) for f in _sys.meta_path): _sys.meta_path.insert(0, _StageMethods())
