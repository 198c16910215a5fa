"""Preference pairs at a real dataset's size: a Hugging Face dataset's images stay on disk (memory-mapped Arrow), read
one at a time when checked and per batch when trained on, so the memory PairDataset holds does not grow with the
images' bytes (Pick-a-Pic v2 is hundreds of GB)."""
import io
import json
import subprocess
import sys

import numpy as np

from conftest import clean_env

MEASURE = """
import json, sys
def anon():   # the process's own memory: heap and anonymous maps, not the memory-mapped dataset files
    for line in open('/proc/self/status'):
        if line.startswith('RssAnon:'): return int(line.split()[1]) * 1024
import datasets
from glm_grpo_nb.pair_data import PairDataset
data = datasets.load_from_disk(sys.argv[1])
before = anon()
pairs = PairDataset(data, check_images=True)   # every pair checked now (over 1,000 pairs that waits for each read otherwise): each image opened once
held = anon() - before
last = pairs.pair(len(pairs) - 1)
print(json.dumps({"held": held, "pairs": len(pairs), "ties": pairs.ties_dropped, "flipped": pairs.flipped,
                  "last": [last["prompt"], last["chosen"].size, last["rejected"].size]}))
"""


def test_pairs_hold_no_image_bytes(tmp_path):
    import datasets
    rng = np.random.default_rng(0)
    def png():   # noise does not compress: about 12 KB each
        from PIL import Image
        buf = io.BytesIO(); Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buf, format="PNG")
        return buf.getvalue()
    n = 3000
    rows = {"caption": [f"pair {i}" for i in range(n)], "jpg_0": [png() for _ in range(n)], "jpg_1": [png() for _ in range(n)],
            "label_0": [[1.0, 0.0, 0.5][i % 3] for i in range(n)]}
    image_bytes = sum(map(len, rows["jpg_0"])) + sum(map(len, rows["jpg_1"]))
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "pairs"))
    del rows
    r = subprocess.run([sys.executable, "-c", MEASURE, str(tmp_path / "pairs")], capture_output=True, text=True,
                       env=clean_env(), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert (out["pairs"], out["ties"], out["flipped"]) == (2000, 1000, 1000), out
    assert out["last"] == ["pair 2998", [64, 64], [64, 64]], out   # pair 2999 is a tie: the last pair is row 2998
    # the pairs' own memory: prompts and references, a small share of the images' bytes (held in memory, it was twice them)
    assert out["held"] < 0.2 * image_bytes, (out["held"], image_bytes)
