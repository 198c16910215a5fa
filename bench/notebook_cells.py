"""Run notebooks' code cells in order, each notebook in one namespace from its own folder, as nbdev's test runner
does with `--flags gpu`: the `#| gpu` cells run, the `notest` and `slow` ones and `#| eval: false` do not. For a machine
with CUDA that has the package's dependencies but not nbdev (a bare GPU machine); where nbdev is installed,
`GLM_GRPO_DEVICE=cpu nbdev-test --flags gpu NOTEBOOK` is the same check. The device used where none is given
is pinned to the CPU ($GLM_GRPO_DEVICE, unless set otherwise): the notebooks' checks are the CPU's, float32 and exact,
and their `#| gpu` cells name CUDA themselves.

Run from the repository root:
python -m bench.notebook_cells nbs/05a_tiny.ipynb [nbs/01a_tokens.ipynb ...]
One line per `#| gpu` cell (passed or the error), a notebook stops at its first failing cell; exit status 1 if any
cell failed."""
import json
import os
import sys
import time
import traceback
from pathlib import Path

SKIPPED_FLAGS = {"notest", "slow"}


def directives(source: str) -> dict:
    "A cell's `#| name value` lines, as {name: value}."
    out = {}
    for line in source.splitlines():
        if line.startswith("#|"):
            name, _, value = line[2:].strip().partition(" ")
            out[name.rstrip(":")] = value.strip()
    return out


def runs(d: dict) -> bool:
    return not (SKIPPED_FLAGS & set(d)) and d.get("eval", "true").lower() != "false"


def run_notebook(path: Path) -> int:
    "Run `path`'s cells; the number of `#| gpu` cells that failed (0 or 1: a failure stops the notebook)."
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    here, ns = Path.cwd(), {"__name__": "__main__"}
    os.chdir(path.parent)
    try:
        for i, cell in enumerate(cells):
            src = "".join(cell["source"])
            d = directives(src)
            if not runs(d): continue
            src = "\n".join("# " + l if l.lstrip().startswith(("%", "!")) else l for l in src.splitlines())
            start = time.perf_counter()
            try: exec(compile(src, f"{path.name}[{i}]", "exec"), ns)
            except Exception:
                print(f"{path.name} cell {i}{' (gpu)' if 'gpu' in d else ''}: FAILED\n{traceback.format_exc(limit=6)}", flush=True)
                return 1
            if "gpu" in d: print(f"{path.name} cell {i} (gpu): passed in {time.perf_counter() - start:.1f} s", flush=True)
    finally: os.chdir(here)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GLM_GRPO_DEVICE", "cpu")
    paths = [Path(p).resolve() for p in sys.argv[1:]]
    missing = [str(p) for p in paths if not p.is_file()]
    if not paths or missing: sys.exit(f"bench.notebook_cells: give notebook paths that exist (missing: {missing}).")
    failed = sum(run_notebook(p) for p in paths)
    sys.exit(1 if failed else 0)
