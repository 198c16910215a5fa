"""A CPU stand-in for the host/GPU boundary: finds code that would mix CPU and CUDA tensors, without a GPU.

On a CPU-only machine `policy.on_device(x)` and `to_host(x)` return `x` itself, so a tensor that would live on the GPU
and one that would live on the host are indistinguishable, and a mix of the two (which CUDA refuses) passes. Inside
`DeviceBoundary(policy)`:
- the policy's device is `cpu:0`, a device that equals no plain "cpu": whatever is made on it is told apart;
- `on_device` and `to_host` return copies (as they do on a GPU) labelled "device" and "host";
- the policy's parameters and buffers are labelled "device";
- a factory (`torch.zeros`, `torch.tensor(data)`, `torch.randn`, ...) called by the package makes a "device" tensor when
  it names the policy's device, a "host" tensor when it names none (as it would on a GPU machine), and an unlabelled
  one when it names another device (e.g. `x.device`: on a CPU-only machine, which side `x` was meant for is not known);
- generators made by `policy.generators` are labelled by the device they were made for; a factory or an in-place
  sampler (`exponential_`, ...) that draws from a generator of the other side raises `DeviceMix`, as CUDA does;
- a move with `.to(device)`, `.cpu()` or `.cuda()` in the package outside `on_device` / `to_host` raises `DeviceMove`:
  every crossing has one place (the rewards module excepted: reward models choose their own device);
- every ATen op propagates the labels of its tensor arguments to its outputs, and raises `DeviceMix` when a "device"
  tensor meets a "host" tensor, except where CUDA accepts it: a 0-dim host tensor (a scalar to CUDA), copies between
  devices, indexing with host indices. A 0-dim *device* tensor meeting a host tensor is a mix.
What it cannot label (tensors made by library code, moved by a library) is left to `tests/test_gpu.py` on a GPU."""
import importlib
import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map_only
from torch.utils.weak import WeakIdKeyDictionary

import glm_grpo_nb.policy as policy_module

importlib.import_module("glm_grpo_nb.trainer")   # loads every module that moves tensors, so all are patched

aten = torch.ops.aten
PACKAGE = str(Path(policy_module.__file__).parent)
HERE = str(Path(__file__))
MACHINERY = (HERE, *(str(Path(torch.__file__).parent / p) for p in ("overrides.py", "utils/_python_dispatch.py")))
MARKED = torch.device("cpu", 0)   # the policy's device inside the boundary
INDEXING = {aten.index.Tensor: (0,), aten.index_put_.default: (0, 2), aten.index_put.default: (0, 2),
            aten._index_put_impl_.default: (0, 2)}   # CUDA takes host indices: only these arguments must agree
FACTORIES = {torch.zeros, torch.ones, torch.empty, torch.full, torch.randn, torch.rand, torch.randint, torch.randperm,
             torch.arange, torch.linspace, torch.eye, torch.tensor, torch.as_tensor, torch.normal}
MOVES = {torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda}
HELPERS = {"on_device", "to_host", "on_device_copy", "to_host_copy"}
OWN_DEVICES = {"rewards.py", "ocr.py", "model_rewards.py"}   # reward models live on a device of their own choosing and hand back host scores


class DeviceMix(RuntimeError):
    "A tensor that would be on the GPU met one that would be on the host."


class DeviceMove(RuntimeError):
    "The package moved a tensor between devices outside `policy.on_device` / `to_host`."


def _caller():
    "The frame that made the call (torch's own code calling torch is not the package's doing)."
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(MACHINERY): frame = frame.f_back
    return frame


def _names_device(args, kwargs) -> bool:
    "Whether a `.to(...)` call names a device (a device, a string that is not a dtype, or another tensor)."
    if "device" in kwargs: return True
    return any(isinstance(a, (torch.device, str, torch.Tensor)) for a in args[1:])


class _Calls(TorchFunctionMode):
    "The Python-level view: which device a factory names, which generator it draws from, and moves made by hand."
    def __init__(self, boundary): super().__init__(); self.b = boundary

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        frame = _caller()
        ours = frame is not None and frame.f_code.co_filename.startswith(PACKAGE)
        if ours and func in MOVES and (func is not torch.Tensor.to or _names_device(args, kwargs)) \
                and frame.f_code.co_name not in HELPERS and Path(frame.f_code.co_filename).name not in OWN_DEVICES:
            raise DeviceMove(f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} ({frame.f_code.co_name}) moves a "
                             f"tensor with {func.__name__}; cross with policy.on_device / to_host")
        gen = self.b.generator_side.get(kwargs.get("generator")) if kwargs.get("generator") is not None else None
        if gen is not None and func not in FACTORIES and args and isinstance(args[0], torch.Tensor):
            side = self.b.side.get(args[0])   # an in-place sampler: the tensor and its generator must agree
            if side is not None and side != gen:
                raise DeviceMix(f"{func.__name__}: a {side} tensor drawn with a {gen} generator")
        out = func(*args, **kwargs)
        if ours and func in FACTORIES:
            named = kwargs.get("device")
            side = ("device" if named is not None and torch.device(named) == MARKED else
                    "host" if named is None else None)
            if gen is not None and side is not None and side != gen:
                raise DeviceMix(f"{func.__name__}: a {side} tensor drawn with a {gen} generator")
            side = side or gen
            if side is not None: tree_map_only(torch.Tensor, lambda t: self.b.label(t, side), out)
            self.b.made += side == "host"
        return out


class DeviceBoundary(TorchDispatchMode):
    def __init__(self, policy):
        super().__init__()
        self.policy, self.side, self.ops, self.made = policy, WeakIdKeyDictionary(), 0, 0
        self.generator_side = {}

    def label(self, x, side):
        if isinstance(x, torch.Tensor): self.side[x] = side
        return x

    def __enter__(self):
        for t in list(self.policy.parameters()) + list(self.policy.buffers()): self.label(t, "device")
        cls = policy_module.GlmImagePolicy
        on_device, to_host, generators, device, boundary = cls.on_device, policy_module.to_host, policy_module.generators, cls.device, self
        using = lambda f: [m for name, m in list(sys.modules.items())   # every module that imported it
                           if name.startswith("glm_grpo_nb") and getattr(m, f.__name__, None) is f]
        self._saved = on_device, to_host, generators, device, using(to_host), using(generators)

        def on_device_copy(pol, x, dtype=None):
            y = on_device(pol, x, dtype)
            return None if y is None else boundary.label(y.clone(), "device")

        def to_host_copy(x):
            y = to_host(x)
            return None if y is None else boundary.label(y.clone(), "host")

        def labelled_generators(seeds, device="cpu"):
            gens = generators(seeds, device)
            for g in gens: boundary.generator_side[g] = "device" if torch.device(device) == MARKED else "host"
            return gens

        cls.on_device, cls.device = on_device_copy, property(lambda pol: MARKED)
        for m in self._saved[4]: m.to_host = to_host_copy
        for m in self._saved[5]: m.generators = labelled_generators
        self._calls = _Calls(self)
        super().__enter__()
        self._calls.__enter__()
        return self

    def __exit__(self, *exc):
        self._calls.__exit__(*exc)
        cls = policy_module.GlmImagePolicy
        cls.on_device, cls.device = self._saved[0], self._saved[3]
        for m in self._saved[4]: m.to_host = self._saved[1]
        for m in self._saved[5]: m.generators = self._saved[2]
        self.generator_side.clear()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        checked = [args[i] for i in INDEXING[func] if i < len(args)] if func in INDEXING else (args, kwargs)
        tensors = [t for t in tree_flatten(checked)[0] if isinstance(t, torch.Tensor)]
        # a 0-dim host tensor is a scalar to CUDA; a 0-dim GPU tensor is not a scalar to a host op
        sides = {self.side.get(t) for t in tensors if t.dim() > 0 or self.side.get(t) == "device"} - {None}
        if sides == {"device", "host"} and func is not aten.copy_.default:   # copy_ crosses devices by design
            shapes = [(tuple(t.shape), self.side.get(t)) for t in tensors]
            raise DeviceMix(f"{func}: a tensor on the GPU meets one on the host: {shapes}")
        out = func(*args, **kwargs)
        if func is aten.copy_.default or (func is aten._to_copy.default and "device" in kwargs):
            return out   # the destination keeps its side; a move: labelled by the helper that made it
        side = next(iter(sides)) if len(sides) == 1 else None
        if side is not None: tree_map_only(torch.Tensor, lambda t: self.label(t, side), out)
        return out
