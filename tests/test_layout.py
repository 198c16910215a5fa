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
