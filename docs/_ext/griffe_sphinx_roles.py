"""Griffe extension for the docs build: render Sphinx roles in docstrings.

hwplug's docstrings use Sphinx cross-reference roles (``:class:`Platform```,
``:func:`~hwplug.resolve```) and reST literal-block markers (``::``).
mkdocstrings renders Markdown, so this extension rewrites each role into an
optional cross-reference (a link where the target is documented, plain code
elsewhere) and each trailing ``::`` into ``:``. Loaded by ``mkdocs.yml``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(
    r":(?:py:)?(?:func|class|meth|attr|data|mod|exc|obj|const):`(~?)([\w.]+)(\(\))?`"
)
_LITERAL_MARKER = re.compile(r"(?<=\S)::$", re.MULTILINE)


def _identifier(obj: griffe.Object, name: str) -> str:
    if "." in name:
        return name
    scope: griffe.Object | None = obj
    while scope is not None:
        if name in scope.members:
            return f"{scope.path}.{name}"
        scope = scope.parent
    return f"{obj.module.path}.{name}"


def _rewrite(obj: griffe.Object, text: str) -> str:
    def replace(match: re.Match[str]) -> str:
        tilde, name, call = match.group(1), match.group(2), match.group(3) or ""
        shown = (name.rsplit(".", 1)[-1] if tilde else name) + call
        target = _identifier(obj, name)
        return f'<autoref identifier="{target}" optional><code>{shown}</code></autoref>'

    return _LITERAL_MARKER.sub(":", _ROLE.sub(replace, text))


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles and ``::`` markers in every docstring."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _rewrite(obj, obj.docstring.value)
