"The project's metadata files agree with each other and with the package."
import configparser
try: import tomllib
except ImportError: import tomli as tomllib  # Python 3.10

from conftest import ROOT

NBDEV_KEYS = ["lib_path", "nbs_path", "doc_path", "recursive", "tst_flags", "put_version_in_init", "readme_nb",
              "clean_ids", "clear_all", "jupyter_hooks", "custom_sidebar", "branch"]


def settings():
    cfg = configparser.ConfigParser(delimiters=["="])
    cfg.read(ROOT / "settings.ini")
    return cfg["DEFAULT"]


def as_ini(v):
    return str(v) if not isinstance(v, bool) else ("True" if v else "False")


def test_nbdev_keys_agree_between_settings_and_pyproject():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["nbdev"]
    ini = settings()
    for k in NBDEV_KEYS:
        assert k in py, f"{k} missing from [tool.nbdev] in pyproject.toml"
        assert k in ini, f"{k} missing from settings.ini"
        assert as_ini(py[k]) == ini[k], f"{k}: pyproject.toml has {py[k]!r}, settings.ini has {ini[k]!r}"
    assert py["tst_flags"] == "notest slow gpu"


def test_version_matches_package():
    import glm_grpo_nb
    assert glm_grpo_nb.__version__ == settings()["version"]


def test_readme_mirrors_index_notebook():
    import json
    readme = (ROOT / "README.md").read_text()
    nb = json.loads((ROOT / "nbs" / "index.ipynb").read_text())
    for cell in nb["cells"]:
        src = "".join(cell["source"]).strip().replace("](images/", "](nbs/images/")  # README sits one folder up
        assert src in readme, f"README.md is missing this index.ipynb cell:\n{src[:200]}"


def test_readme_names_files_that_ship():
    "Every examples/ path the README names is in the repository, so its commands run as written on a clean clone."
    import re
    readme = (ROOT / "README.md").read_text()
    named = set(re.findall(r"examples/[\w./-]*[\w/]", readme))
    assert {"examples/t2i/prompts.txt", "examples/t2i/target_images", "examples/text_prompts.txt"} <= named, named
    missing = [p for p in named if not (ROOT / p).exists()]
    assert not missing, missing
    prompts = (ROOT / "examples/t2i/prompts.txt").read_text().splitlines()
    assert sorted(p.name for p in (ROOT / "examples/t2i/target_images").iterdir()) == [f"{i}.png" for i in range(len(prompts))]


def _package_imports() -> dict[str, set[str]]:
    "{module: the package's modules it imports}, read from every import statement, at the top or inside a function."
    import ast
    pkg = ROOT / "glm_grpo_nb"
    names = {f.stem for f in pkg.glob("*.py") if f.stem not in ("__init__", "_modidx")}
    graph = {}
    for name in names:
        edges = set()
        for node in ast.walk(ast.parse((pkg / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level == 1: target = mod.split(".")[0] if mod else None   # from .x import y / from . import x
                elif mod.startswith("glm_grpo_nb."): target = mod.split(".")[1]
                elif mod == "glm_grpo_nb": target = None
                else: continue
                targets = [target] if target else [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name.split(".")[1] for a in node.names if a.name.startswith("glm_grpo_nb.")]
            else: continue
            edges |= {t for t in targets if t in names}
        graph[name] = edges
    return graph


def test_no_import_circles():
    "Each module imports only modules beneath it: no module reaches itself through the package's imports (any depth)."
    graph = _package_imports()
    circles = []
    def reach(start):
        seen, todo = set(), [(m, [start, m]) for m in graph[start]]
        while todo:
            m, path = todo.pop()
            if m == start: circles.append(" -> ".join(path)); return
            if m in seen: continue
            seen.add(m)
            todo += [(n, path + [n]) for n in graph[m]]
    for name in sorted(graph): reach(name)
    assert not circles, "import circles:\n  " + "\n  ".join(circles)


def test_the_readme_maps_the_modules_bottom_to_top():
    "The README's map lists every module at its layer (one above the highest it imports), each after what it imports."
    import re
    graph, readme = _package_imports(), (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| (\d+) \| `glm_grpo_nb\.(\w+)` \|", readme[readme.index("## Modules"):], re.M)
    order, layer = [m for _, m in rows], {m: int(n) for n, m in rows}
    assert sorted(order) == sorted(graph), set(order) ^ set(graph)
    for i, m in enumerate(order): assert graph[m] <= set(order[:i]), f"{m} is listed before {graph[m] - set(order[:i])}"
    for m in graph: assert layer[m] == 1 + max((layer[n] for n in graph[m]), default=-1), m


def test_notebooks_in_reading_order():
    "Each notebook uses only notebooks numbered before it (its module's imports, inside functions too; a notebook "
    "without a module, its code's imports), so nbdev's sidebar reads from the bottom up."
    import ast
    import json
    import re
    graph, nb_of, loose = _package_imports(), {}, {}
    for p in sorted((ROOT / "nbs").glob("*.ipynb")):
        cells = json.loads(p.read_text())["cells"]
        m = re.search(r"#\|\s*default_exp\s+(\w+)", "".join(cells[0]["source"])) if cells else None
        if m: nb_of[m.group(1)] = p.name
        elif p.name != "index.ipynb":
            code = "\n".join(l for c in cells if c["cell_type"] == "code" for l in "".join(c["source"]).splitlines()
                             if not l.lstrip().startswith(("!", "%")))
            loose[p.name] = {n.module.split(".")[1] for n in ast.walk(ast.parse(code)) if isinstance(n, ast.ImportFrom)
                             and (n.module or "").startswith("glm_grpo_nb.")}
    assert set(nb_of) == set(graph), set(nb_of) ^ set(graph)
    late = [f"{nb_of[m]} uses {nb_of[d]}" for m, ds in graph.items() for d in ds if nb_of[d] >= nb_of[m]]
    late += [f"{nb} uses {nb_of[d]}" for nb, ds in loose.items() for d in ds if d in nb_of and nb_of[d] >= nb]
    assert not late, late
