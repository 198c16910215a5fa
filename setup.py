"Package metadata comes from settings.ini, which nbdev 2 reads too; requirements are checked with packaging."
from configparser import ConfigParser
from pathlib import Path

import setuptools
from packaging.requirements import Requirement

here = Path(__file__).parent
config = ConfigParser(delimiters=["="])
config.read(here / "settings.ini", encoding="utf-8")
cfg = config["DEFAULT"]

def reqs(key):
    "Parse a space-separated requirement list, failing early on a malformed entry."
    out = cfg.get(key, "").split()
    for r in out: Requirement(r)
    return out

licenses = {"apache2": ("Apache Software License 2.0", "OSI Approved :: Apache Software License")}
statuses = ["1 - Planning", "2 - Pre-Alpha", "3 - Alpha", "4 - Beta", "5 - Production/Stable", "6 - Mature", "7 - Inactive"]
py_versions = "3.10 3.11 3.12 3.13".split()
lic = licenses[cfg["license"]]
min_python = cfg["min_python"]

setuptools.setup(
    name=cfg["lib_name"],
    version=cfg["version"],
    description=cfg["description"],
    long_description=(here / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    author=cfg["author"],
    author_email=cfg["author_email"],
    license=lic[0],
    url=cfg["git_url"],
    keywords=cfg["keywords"],
    classifiers=[
        "Development Status :: " + statuses[int(cfg["status"])],
        "Intended Audience :: " + cfg["audience"].title(),
        "License :: " + lic[1],
        "Natural Language :: " + cfg["language"].title(),
    ] + [f"Programming Language :: Python :: {v}" for v in py_versions[py_versions.index(min_python):]],
    packages=setuptools.find_packages(include=[cfg["lib_path"], cfg["lib_path"] + ".*"]),
    include_package_data=True,
    package_data={cfg["lib_path"]: ["assets/*"]},
    python_requires=">=" + min_python,
    install_requires=reqs("requirements"),
    extras_require={"dev": reqs("dev_requirements"), "datasets": reqs("datasets_requirements"),
                    "ocr": reqs("ocr_requirements"), "trackers": reqs("trackers_requirements"),
                    "geneval": reqs("geneval_requirements")},
    entry_points={
        "console_scripts": cfg["console_scripts"].split(),
        "nbdev": [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"],
    },
    zip_safe=False,
)
