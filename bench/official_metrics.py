"""Our text-benchmark metrics (`glm_grpo_nb.benchmarks`) against the benchmarks' official evaluation code itself.

The official files are not part of this project and are never downloaded by it: check them out yourself and point at
them.
- CVTG-2K: `unified_metrics_eval.py` (NJU-PCALab/TextCrafter `TextCrafter_Eval/`, or the unmodified copy in
  zlab-princeton/i1 `benchmark_eval/cvtg-2k/`); it needs `pip install Levenshtein` besides torch, numpy, pillow, tqdm.
  Its `UnifiedMetricsEvaluator` runs as is, with PaddleOCR's answer given for each image (the same readings go to ours),
  over random prompt sets in the benchmark's layout (CVTG/ and CVTG-Style/, 2-5 regions): punctuation, repeats, case,
  double quotes (not targets), region order, typos, extra words, empty readings, CJK, accents, texts with no letters.
  Compared: the overall word accuracy and NED, the counts, and every (subset, regions) figure.
- LongText-Bench: X-Omni-Team/X-Omni `textbench/summary_scores.py`, run as a command on a results file, and the reading's
  clean-up (`clean_and_remove_hallucinations`) taken from `textbench/evaluate_text_reward.py` without importing the rest.
  English and Chinese. Compared: the summed text accuracy and the printed score.

Run from the repository root:
    python -m bench.official_metrics --cvtg PATH/unified_metrics_eval.py --longtext PATH/textbench [--sets 200]
"""
import argparse
import ast
import contextlib
import importlib.util
import io
import json
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from glm_grpo_nb.benchmarks import benchmark_metrics, read_cvtg2k

VOCAB = ["OPEN", "open", "Sale", "SALE", "3:15", "24/7", "vs.", "t-shirts", "café", "CAFE", "Ünïcödé", "北京", "欢迎",
         "!!!", "...", "Grand", "Opening", "NO", "no", "A", "a", "x", "Coffee", "Drive", "EVExpo2023.com", "50%",
         "Hello,", "world!", "don't", "O'Neil", "中央公园", "2公里", "-", "MORNING", "read", "READ"]


class GivenOCR:
    "Stands in for PaddleOCR: `.ocr(path, cls=True)` answers the lines given for that image, in PaddleOCR's format."
    def __init__(self): self.lines = {}
    def ocr(self, path, cls=True):
        lines = self.lines[path]
        return [[[[[0, 0]] * 4, (l, 0.9)] for l in lines]] if lines else [None]


def reading(rng, words):
    "A plausible OCR reading of `words`: some dropped, mistyped, lower-cased, shuffled, an extra word, split in lines."
    def typo(w):
        i = rng.randrange(len(w))
        return rng.choice([w[:i] + w[i + 1:], w[:i] + rng.choice("xyzé中") + w[i + 1:], w[:i] + w[i] + w[i:]])
    out = []
    for w in words:
        r = rng.random()
        if r >= 0.15: out.append(typo(w) if r < 0.35 else (w.lower() if r < 0.5 else w))
    if rng.random() < 0.3: rng.shuffle(out)
    if rng.random() < 0.3: out.append(rng.choice(VOCAB))
    if rng.random() < 0.1: out = []
    lines, cur = [], []
    for w in out:
        cur.append(w)
        if rng.random() < 0.4: lines.append(" ".join(cur)); cur = []
    return lines + ([" ".join(cur)] if cur else [])


def cvtg_set(rng, prompts_dir: Path, images_dir: Path, per_area: int) -> GivenOCR:
    ocr = GivenOCR()
    for subset in ("CVTG", "CVTG-Style"):
        for area in (2, 3, 4, 5):
            rows = []
            for i in range(per_area):
                texts = [" ".join(rng.choice(VOCAB) for _ in range(rng.randint(1, 3))) for _ in range(area)]
                if rng.random() < 0.1: texts[0] = texts[1]
                prompt = " and ".join(f"a thing with '{t}'" for t in texts)
                if rng.random() < 0.1: prompt = prompt.replace("'", '"', 2)
                rows.append({"index": i, "prompt": prompt, "carrier_list": ["c"] * area, "sentence_list": []})
                d = images_dir / subset / str(area); d.mkdir(parents=True, exist_ok=True)
                (d / f"{i}.png").touch()
                ocr.lines[str(d / f"{i}.png")] = reading(rng, " ".join(texts).split())
            (prompts_dir / subset).mkdir(parents=True, exist_ok=True)
            (prompts_dir / subset / f"{area}.json").write_text(json.dumps({"data_list": rows}))
    return ocr


def compare_cvtg(script: Path, sets: int, rng) -> tuple[int, float]:
    spec = importlib.util.spec_from_file_location("unified_metrics_eval", script)
    official = importlib.util.module_from_spec(spec); spec.loader.exec_module(official)
    images, worst = 0, 0.0
    for _ in range(sets):
        root, result = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
        ocr = cvtg_set(rng, root, result, rng.randint(1, 6))
        ev = object.__new__(official.UnifiedMetricsEvaluator)   # its models are not loaded: PaddleOCR's answer is given
        ev.device, ev.models = "cpu", {"ocr": ocr}
        ev.paddleocr_available, ev.clip_available, ev.t2v_available, ev.openclip_available = True, False, False, False
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            off = ev.evaluate_full_dataset(str(root), str(result), str(result / "out.json"))
        records = read_cvtg2k(root)
        reads = [ocr.lines[str(result / r["subset"] / str(r["regions"]) / f"{r['index']}.png")] for r in records]
        ours, o = benchmark_metrics("cvtg-2k", records, reads), off["overall_results"]
        assert (o["total_words"], o["correct_words"]) == (ours["total_words"], ours["correct_words"]), (o, ours)
        diffs = [o["word_accuracy"] - ours["word_accuracy"], o["ned"] - ours["ned"]]
        for a in off["area_results"]:
            mine = [i for i, r in enumerate(records) if (r["subset"], r["regions"]) == (a["benchmark_type"], a["area"])]
            m = benchmark_metrics("cvtg-2k", [records[i] for i in mine], [reads[i] for i in mine])
            diffs += [a["word_accuracy"] - m["word_accuracy"], a["ned"] - m["ned"]]
        worst = max(worst, *map(abs, diffs))
        images += len(records)
        shutil.rmtree(root); shutil.rmtree(result)
    return images, worst


def compare_longtext(textbench: Path, sets: int, rng) -> tuple[int, float]:
    src = (textbench / "evaluate_text_reward.py").read_text()
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "clean_and_remove_hallucinations")
    ns = {}; exec(compile(ast.Module([fn], []), "evaluate_text_reward.py", "exec"), ns)
    clean = ns["clean_and_remove_hallucinations"]
    images, worst = 0, 0.0
    for mode in ("en", "zh"):
        for _ in range(sets):
            d = Path(tempfile.mkdtemp()); rows, records, reads = [], [], []
            for _ in range(rng.randint(1, 12)):
                texts = [" ".join(rng.choice(VOCAB) for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 4))]
                lines = reading(rng, " ".join(texts).split()) + (["No text recognized."] if rng.random() < 0.1 else [])
                rows.append({"ocr_results": clean("\n".join(lines)), "ocr_gt": texts})
                records.append({"prompt": "", "text": texts}); reads.append(lines)
            (d / "r.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
            p = subprocess.run([sys.executable, str(textbench / "summary_scores.py"), str(d / "r.jsonl"), "--mode", mode],
                               capture_output=True, text=True)
            if p.returncode:   # the official script divides by zero when a record keeps none of its characters
                assert "ZeroDivisionError" in p.stderr, p.stderr; shutil.rmtree(d); continue
            per = [json.loads(l) for l in (d / "results.jsonl").read_text().splitlines()]
            theirs = sum(r["match_word_count"] for r in per) / sum(r["gt_word_count"] for r in per)
            ours = benchmark_metrics("longtext", records, reads, language=mode)["text_accuracy"]
            printed = float((d / "scores.txt").read_text().split(":")[1])
            assert abs(printed - round(ours, 4)) < 1e-9, (printed, ours)
            worst, images = max(worst, abs(theirs - ours)), images + len(records)
            shutil.rmtree(d)
    return images, worst


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cvtg", type=Path, required=True, help="path to CVTG-2K's unified_metrics_eval.py")
    ap.add_argument("--longtext", type=Path, required=True, help="path to X-Omni's textbench/ folder")
    ap.add_argument("--sets", type=int, default=200, help="random benchmark sets per check")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    n, worst = compare_cvtg(a.cvtg, a.sets, rng)
    print(f"CVTG-2K: {n} images in {a.sets} benchmark sets, word accuracy and NED (overall and per subset and region "
          f"count) differ by at most {worst:.2g} from unified_metrics_eval.py")
    n, worst = compare_longtext(a.longtext, a.sets, rng)
    print(f"LongText-Bench: {n} images (English and Chinese), text accuracy differs by at most {worst:.2g} from summary_scores.py")
