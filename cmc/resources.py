"""Package data (grammar, templates, schema) and the one Jinja environment.

Installed, the data ships as packages cmc.grammar, cmc.templates, cmc.schema (pyproject maps
them to the repo's grammar/, templates/, schema/); from a source tree on PYTHONPATH those
packages do not exist, so the repo folders are read directly.
"""

from __future__ import annotations

import importlib.resources
from functools import lru_cache
from pathlib import Path

import jinja2

_REPO_DIRS = {"cmc.grammar": "grammar", "cmc.templates": "templates", "cmc.schema": "schema"}


def read_text(package: str, name: str) -> str:
    try:
        return importlib.resources.files(package).joinpath(name).read_text("utf-8")
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):
        repo = Path(__file__).resolve().parent.parent / _REPO_DIRS[package] / name
        return repo.read_text("utf-8")


@lru_cache(maxsize=1)
def jinja_env() -> jinja2.Environment:
    """StrictUndefined: a template that names a missing value fails the build, never emits ''."""
    return jinja2.Environment(
        loader=jinja2.FunctionLoader(lambda name: read_text("cmc.templates", name)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
