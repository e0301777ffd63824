"""A griffe extension for the docs build: Sphinx cross-reference roles in docstrings as code spans.

The provider's docstrings are reST (``:param x:`` fields, which mkdocstrings' ``sphinx`` style reads) and
name other objects with roles such as ``:class:`MergeCommitTrigger``` or ``:func:`~pkg.mod.name```.
Markdown has no roles, so they would be shown verbatim; this turns each into an inline code span of the
name (the last dotted part for a ``~`` target), as Sphinx would display it.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|data|mod|exc|obj|const):`(~?)([^`]+)`")


def _plain(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


class SphinxRoles(griffe.Extension):
    """Rewrite the roles in every docstring griffe loads."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_plain, obj.docstring.value)
