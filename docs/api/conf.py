"""Sphinx configuration for interlock's API reference (``nox -s apidocs``).

Everything on the pages comes from the docstrings in ``src/``: the pages only say which
modules and classes to document, with ``:members:``, so a new public method shows up
without editing them. Build: ``sphinx-build -W --keep-going -b html docs/api
docs/api/_build/html``.
"""

from __future__ import annotations

from typing import Any

from sphinx.ext.napoleon.docstring import GoogleDocstring

import interlock

project = "interlock"
author = "interlock developers"
copyright = "interlock developers"
release = version = interlock.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
]

# Only these pages; _build is the (git-ignored) output.
exclude_patterns = ["_build"]
root_doc = "index"
templates_path: list[str] = []

# Google-style docstrings only.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_include_init_with_doc = False
napoleon_use_rtype = False

autodoc_default_options = {
    "members": True,
    "member-order": "bysource",
    "show-inheritance": True,
}
# Types stay in the signatures (merged into the docstrings' parameter lists they would
# repeat every parameter after a Raises: section); long signatures get one parameter a
# line.
autodoc_typehints = "signature"
python_maximum_signature_line_length = 88
autodoc_typehints_format = "short"
autodoc_inherit_docstrings = True
autodoc_preserve_defaults = True
# Optional packages the strategies import lazily: never imported to build the reference.
autodoc_mock_imports = ["deepspeed", "torch_xla", "transformer_engine"]

autosummary_generate = False

html_theme = "alabaster"
html_title = f"interlock {release} API reference"
html_theme_options = {"description": "Strategy API reference", "fixed_sidebar": True}


# napoleon reads the first line "text: more" of an attribute's or a property's docstring
# as "type: description" (Google style's inline type). interlock's types come from
# annotations, and its docstrings are prose that often has a colon there, so these are
# parsed as a method's docstring would be: sections (Raises:, ...) still work.
_ATTRIBUTE_KINDS = ("attribute", "data", "property")
_written: dict[tuple[str, str], list[str]] = {}


def _before_napoleon(app: Any, what: str, name: str, obj: object, options: Any,
                     lines: list[str]) -> None:
    if what in _ATTRIBUTE_KINDS:
        _written[what, name] = list(lines)


def _after_napoleon(app: Any, what: str, name: str, obj: object, options: Any,
                    lines: list[str]) -> None:
    written = _written.pop((what, name), None)
    if written is not None:
        lines[:] = GoogleDocstring(written, app.config, app, "method", name, obj,
                                   options).lines()


def setup(app: Any) -> None:
    # napoleon's own handler runs at the default priority, 500
    app.connect("autodoc-process-docstring", _before_napoleon, priority=400)
    app.connect("autodoc-process-docstring", _after_napoleon, priority=600)
