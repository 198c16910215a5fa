"Shared helper of the benchmark scripts in bench/ (run them from the repository root: python -m bench.NAME)."
import statistics
import time


def timed(fn, repeats=5):
    "Median wall time of `fn()` over `repeats` calls."
    out = []
    for _ in range(repeats):
        t = time.perf_counter(); fn(); out.append(time.perf_counter() - t)
    return statistics.median(out)
