"Shared helper of the benchmark scripts in bench/ (run them from the repository root: python -m bench.NAME)."
import statistics
import time


def timed(fn, repeats=5):
    "Median wall time of `fn()` over `repeats` calls."
    out = []
    for _ in range(repeats):
        t = time.perf_counter(); fn(); out.append(time.perf_counter() - t)
    return statistics.median(out)


class KeptForBackward:
    "Context counting the bytes of the tensors autograd saves for backward inside it (`.bytes` afterwards)."
    def __init__(self): self.bytes = 0

    def __enter__(self):
        import torch
        def pack(t): self.bytes += t.numel() * t.element_size(); return t
        self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc): return self._hooks.__exit__(*exc)
