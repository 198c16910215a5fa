"""GenEval's rules (`glm_grpo_nb.geneval`) against the official scorer's code itself.

The official files are not part of this project and are never downloaded by it: check out djghosh13/geneval yourself
and point at its `evaluation/` folder. `evaluate_images.py` imports mmdet, open_clip and clip_benchmark at its top, so
its functions are taken from its source as written (`relative_position`, `evaluate`, `evaluate_image`, `compute_iou`,
read with `ast`, unmodified) and run with its own defaults (thresholds 0.3 / 0.9, 16 objects, no NMS, position margin
0.1); only what needs the models is given: `inference_detector` answers the detections of each case in mmdet's format
(per class an N x 5 array of boxes and scores), and `color_classification` answers the colours both sides are given.
`summary_scores.py` is run as a command (it needs pandas) on the results file this package writes.

Each case is one image of one prompt of the metadata file: random detections of the prompt's classes and others
(0-5 per class, scores spread over the thresholds' edges, boxes placed so that relations hold, fail and sit near
their margins) and random colours biased towards the asked ones. Compared per image: the verdict, the reason (with
the relations of one phrase compared as a set: the official code joins a Python set, whose order varies), and the
boxes kept; then the whole summary as summary_scores.py prints it against `format_geneval`.

Run from the repository root:
    python -m bench.official_geneval --official PATH/geneval/evaluation --metadata PATH/evaluation_metadata.jsonl
"""
import argparse
import ast
import json
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from glm_grpo_nb.geneval import COLORS, GENEVAL_CLASSES, judge, read_geneval
from glm_grpo_nb.geneval_results import format_geneval, geneval_result, geneval_scores


def official_functions(script: Path, classnames: list[str], answers: dict) -> dict:
    "evaluate_images.py's functions, from its source, in a namespace holding its defaults and the two stand-ins."
    tree = ast.parse(script.read_text())
    keep = {"relative_position", "evaluate", "evaluate_image", "compute_iou"}
    module = ast.Module(body=[n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in keep], type_ignores=[])
    ns = {"np": np, "json": json, "Image": Image, "ImageOps": ImageOps, "COLORS": list(COLORS), "classnames": classnames,
          "THRESHOLD": 0.3, "COUNTING_THRESHOLD": 0.9, "MAX_OBJECTS": 16, "NMS_THRESHOLD": 1.0, "POSITION_THRESHOLD": 0.1,
          "object_detector": None,
          "inference_detector": lambda detector, filepath: answers["mmdet"][filepath],
          "color_classification": lambda image, bboxes, classname: [answers["colors"][tuple(np.round(b[:4], 4))]
                                                                     for b, _ in bboxes]}
    exec(compile(module, str(script), "exec"), ns)
    assert keep <= set(ns), keep - set(ns)
    return ns


def random_case(rng: random.Random, metadata: dict, size: int = 512):
    "Detections for one image of `metadata`: its classes and a distractor, random counts, scores, boxes and colours."
    classes = [c["class"] for c in metadata["include"]] + [c["class"] for c in metadata.get("exclude") or []]
    classes += [rng.choice(GENEVAL_CLASSES)]
    wanted = {c["class"]: c.get("color") for c in metadata["include"]}
    dets, colors = [], {}
    for cls in dict.fromkeys(classes):
        base = (rng.uniform(60, size - 60), rng.uniform(60, size - 60))
        for _ in range(rng.choice([0, 1, 1, 1, 2, 2, 3, 4, 5])):
            score = rng.choice([rng.uniform(0, 1), rng.uniform(0.28, 0.32), rng.uniform(0.88, 0.92), 0.3, 0.9, rng.uniform(0.9, 1)])
            w, h = rng.uniform(8, 120), rng.uniform(8, 120)
            cx, cy = (base[0] + rng.gauss(0, 80), base[1] + rng.gauss(0, 80)) if rng.random() < 0.7 else \
                     (rng.uniform(0, size), rng.uniform(0, size))
            box = tuple(round(float(v), 4) for v in (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2))
            colors[box] = wanted.get(cls) if wanted.get(cls) and rng.random() < 0.6 else rng.choice(COLORS)
            dets.append({"label": cls, "score": float(np.float32(score)), "box": box, "mask": None})
    return dets, colors


def mmdet_result(dets: list[dict]) -> list[np.ndarray]:
    "The detections as mmdet answers a bbox-only model: per class (GenEval's order) an N x 5 array (x1, y1, x2, y2, score)."
    per = [[] for _ in GENEVAL_CLASSES]
    for d in dets: per[GENEVAL_CLASSES.index(d["label"])].append([*d["box"], d["score"]])
    return [np.array(p, np.float32).reshape(-1, 5) for p in per]


def same_reason(ours: str, theirs: str) -> bool:
    "Equal reasons, the relations of a 'found A and B target' phrase compared as a set."
    norm = lambda s: re.sub(r"found (.*?) target", lambda m: "found " + " and ".join(sorted(m.group(1).split(" and "))) + " target", s)
    return norm(ours) == norm(theirs)


def compare(official: Path, metadata_file: Path, images_per_prompt: int, seed: int) -> dict:
    rng = random.Random(seed)
    records = read_geneval(metadata_file)
    classnames = (official / "object_names.txt").read_text().split("\n")
    classnames = [c.strip() for c in classnames if c.strip()]
    assert tuple(classnames) == GENEVAL_CLASSES, "object_names.txt and GENEVAL_CLASSES differ"
    answers = {"mmdet": {}, "colors": {}}
    fns = official_functions(official / "evaluate_images.py", classnames, answers)
    work = Path(tempfile.mkdtemp())
    blank = work / "blank.png"
    Image.new("RGB", (512, 512)).save(blank)
    ours_results, theirs_results, differ, verdicts = [], [], [], {"correct": 0, "strict": 0}
    for i, meta in enumerate(records):
        for k in range(images_per_prompt):
            dets, colors = random_case(rng, meta)
            name = str(work / f"{i:05d}_{k}.png")
            if not Path(name).exists(): Path(name).symlink_to(blank)
            answers["mmdet"][name], answers["colors"] = mmdet_result(dets), {
                tuple(np.round(np.float32(b), 4)): c for b, c in colors.items()}
            theirs = fns["evaluate_image"](name, meta)
            # ours sees the float32 boxes mmdet would hold, and the same colours
            ours_dets = [{**d, "box": tuple(float(v) for v in np.float32(d["box"]))} for d in dets]
            v = judge(meta, ours_dets, lambda label, found: [answers["colors"][tuple(np.round(np.float32(d["box"]), 4))]
                                                             for d in found])
            ours = geneval_result(name, meta, v)
            their_boxes = {c: [[round(x, 3) for x in b] for b in bs] for c, bs in json.loads(theirs["details"]).items()}
            our_boxes = {c: [[round(x, 3) for x in b] for b in bs] for c, bs in v.details.items()}
            if ours["correct"] != theirs["correct"] or not same_reason(ours["reason"], theirs["reason"]) or our_boxes != their_boxes:
                differ.append((name, meta["prompt"], ours["correct"], theirs["correct"], ours["reason"], theirs["reason"]))
            verdicts["correct"] += v.correct; verdicts["strict"] += v.strict
            ours_results.append(ours); theirs_results.append(theirs)
    results = work / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in ours_results))
    printed = subprocess.run([sys.executable, str(official / "summary_scores.py"), str(results)], capture_output=True,
                             text=True, check=True).stdout.strip()
    ours_printed = format_geneval(geneval_scores(ours_results)).strip()
    return {"images": len(ours_results), "prompts": len(records), "differ": differ, "correct": verdicts["correct"],
            "strict": verdicts["strict"], "summary_equal": printed == ours_printed, "official_summary": printed,
            "our_summary": ours_printed}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--official", type=Path, required=True, help="djghosh13/geneval's evaluation/ folder")
    ap.add_argument("--metadata", type=Path, required=True, help="GenEval's evaluation_metadata.jsonl")
    ap.add_argument("--images-per-prompt", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    r = compare(a.official, a.metadata, a.images_per_prompt, a.seed)
    print(f"GenEval: {r['images']} images of {r['prompts']} prompts, {r['correct']} correct, {r['strict']} strict; "
          f"{len(r['differ'])} verdicts, reasons or kept boxes differ from evaluate_images.py")
    for d in r["differ"][:10]: print("  differs:", d)
    print(f"summary_scores.py's output {'equals' if r['summary_equal'] else 'DIFFERS from'} format_geneval's:")
    print(r["official_summary"])
    if not r["summary_equal"]: print("--- ours ---\n" + r["our_summary"])
    sys.exit(1 if r["differ"] or not r["summary_equal"] else 0)
