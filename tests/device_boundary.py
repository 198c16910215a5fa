"""A CPU stand-in for the host/GPU boundary: finds code that would mix CPU and CUDA tensors, without a GPU.

On a CPU-only machine `policy.on_device(x)` and `to_host(x)` return `x` itself, so a tensor that would live on the GPU
and one that would live on the host are indistinguishable, and a mix of the two (which CUDA refuses) passes. Inside
`DeviceBoundary(policy)`:
- `on_device` and `to_host` return copies (as they do on a GPU) labelled "device" and "host";
- the policy's parameters and buffers are labelled "device";
- a factory (`torch.zeros`, `torch.tensor(data)`, ...) called by the package on a line that names no device makes a
  "host" tensor, as it would on a GPU machine;
- every ATen op propagates the labels of its tensor arguments to its outputs, and raises `DeviceMix` when a "device"
  tensor meets a "host" tensor of one or more dimensions, except in the ops CUDA accepts that way (copies between
  devices, indexing with host indices).
Tensors made by library code or with a named device, and tensors moved with an explicit `.to(device)`, carry no
label and mix with either side: on a CPU-only machine it cannot be told which device they were meant for. So the check fails where labelled tensors meet, which is where the boundary was crossed; what it cannot
label is left to `tests/test_gpu.py` on a GPU."""
import importlib
import linecache
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map_only
from torch.utils.weak import WeakIdKeyDictionary

import glm_grpo_nb.policy as policy_module

importlib.import_module("glm_grpo_nb.trainer")   # loads every module that moves tensors, so all are patched

aten = torch.ops.aten
PACKAGE = str(Path(policy_module.__file__).parent)
DISPATCH = tuple(str(Path(torch.__file__).parent / p) for p in ("_dynamo", "_compile.py", "utils/_python_dispatch.py"))
INDEXING = {aten.index.Tensor: (0,), aten.index_put_.default: (0, 2), aten.index_put.default: (0, 2),
            aten._index_put_impl_.default: (0, 2)}   # CUDA takes host indices: only these arguments must agree


class DeviceMix(RuntimeError):
    "A tensor that would be on the GPU met one that would be on the host."


class DeviceBoundary(TorchDispatchMode):
    def __init__(self, policy):
        super().__init__()
        self.policy, self.side, self.ops, self.made = policy, WeakIdKeyDictionary(), 0, 0

    def label(self, x, side):
        if isinstance(x, torch.Tensor): self.side[x] = side
        return x

    def __enter__(self):
        for t in list(self.policy.parameters()) + list(self.policy.buffers()): self.label(t, "device")
        on_device, to_host, boundary = policy_module.GlmImagePolicy.on_device, policy_module.to_host, self
        self._saved = on_device, to_host, [m for name, m in list(sys.modules.items())   # every module that imported it
                                           if name.startswith("glm_grpo_nb") and getattr(m, "to_host", None) is to_host]

        def on_device_copy(pol, x, dtype=None):
            y = on_device(pol, x, dtype)
            return None if y is None else boundary.label(y.clone(), "device")

        def to_host_copy(x):
            y = to_host(x)
            return None if y is None else boundary.label(y.clone(), "host")

        policy_module.GlmImagePolicy.on_device = on_device_copy
        for m in self._saved[2]: m.to_host = to_host_copy
        return super().__enter__()

    def __exit__(self, *exc):
        policy_module.GlmImagePolicy.on_device = self._saved[0]
        for m in self._saved[2]: m.to_host = self._saved[1]
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        checked = [args[i] for i in INDEXING[func] if i < len(args)] if func in INDEXING else (args, kwargs)
        tensors = [t for t in tree_flatten(checked)[0] if isinstance(t, torch.Tensor)]
        sides = {self.side.get(t) for t in tensors if t.dim() > 0} - {None}
        if sides == {"device", "host"} and func is not aten.copy_.default:   # copy_ crosses devices by design
            shapes = [(tuple(t.shape), self.side.get(t)) for t in tensors]
            raise DeviceMix(f"{func}: a tensor on the GPU meets one on the host: {shapes}")
        out = func(*args, **kwargs)
        if func is aten.copy_.default or (func is aten._to_copy.default and "device" in kwargs):
            return out   # the destination keeps its side; a move to a named device: unknown on a CPU-only machine
        side = next(iter(sides)) if len(sides) == 1 else None
        fresh = func is aten.lift_fresh.default or not any(isinstance(t, torch.Tensor) for t in tree_flatten((args, kwargs))[0])
        if fresh:   # a factory, or torch.tensor(data)
            side = self.made_by_us()
            self.made += side == "host"
        if side is not None: tree_map_only(torch.Tensor, lambda t: self.label(t, side), out)
        return out

    @staticmethod
    def made_by_us():
        "A factory called by the package itself without naming a device makes a host tensor, on a GPU machine too."
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename.startswith(DISPATCH): frame = frame.f_back
        if frame is None or not frame.f_code.co_filename.startswith(PACKAGE): return None   # e.g. autograd's engine
        line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
        return None if "device" in line else "host"
