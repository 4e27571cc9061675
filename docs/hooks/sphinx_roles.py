"""A griffe extension of the documentation build (the ``extensions`` of mkdocs.yml's mkdocstrings
handler): the Sphinx roles of gmc's docstrings become cross-references of the site.

A role (``:class:``, ``:func:``, ``:meth:``, ``:attr:``, ``:data:``, ``:mod:``, ``:exc:``,
``:obj:``, with or without the ``py:`` domain) whose target the site documents becomes an autorefs
link to it, ``[`Foo`][gmc.x.Foo]``, which ``mkdocs build --strict`` checks; any other target (a
private helper, an object without a docstring, the standard library) becomes a code span, since a
link to it would have nowhere to go. The target is looked up as Sphinx does: within the object
whose docstring holds the role, then its class, its module and the module's packages, then as a
full path; a name found nowhere links to the one documented object whose path ends with it, where
there is one. ``~`` shows the target's last component, ``!`` never links, ``title <target>``
shows the title. Code spans and fenced blocks are kept as they are, so a role quoted in double
backticks stays text.

The site documents what the ``::: identifier`` lines of its pages render (``shown``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from griffe import Alias, AliasResolutionError, CyclicAliasError, Extension, GriffeLoader, Module, Object

DOCS = Path(__file__).resolve().parents[1]
"""The site's pages: the ``::: identifier`` lines of the Markdown files below it."""

ROLES = ("class", "func", "meth", "attr", "data", "mod", "exc", "obj")

TOKEN_RE = re.compile(
    r"(?P<fence>^[ \t]*(?P<marks>`{3,}|~{3,}).*?(?:^[ \t]*(?P=marks)[ \t]*$|\Z))"
    rf"|(?P<role>:(?:py:)?(?:{'|'.join(ROLES)}):`(?P<target>[^`]+)`)"
    r"|(?P<code>(?P<ticks>`+).+?(?<!`)(?P=ticks)(?!`))",
    re.S | re.M,
)
"""A fenced block, a role, or a code span, whichever starts first: a role inside a code span or a
block is part of it and kept."""


def rewrite(text: str, link: Callable[[str], str | None]) -> str:
    """``text`` with every role replaced by Markdown: ``[`title`][identifier]`` where
    ``link(target)`` gives an identifier for the role's target (as written, less ``~``, ``!``, a
    title and a trailing ``()``), a code span of the title where it gives None."""

    def replace(match: re.Match) -> str:
        if not match["role"]:
            return match[0]
        written = match["target"].strip()
        explicit = re.fullmatch(r"(?P<title>.+?)\s*<(?P<target>[^<>]+)>", written, re.S)
        if explicit:
            title, target = explicit["title"], explicit["target"].strip().lstrip("~")
        else:
            target = written.lstrip("!~")
            title = target.rsplit(".", 1)[-1] if written.startswith("~") else target.lstrip(".")
        identifier = None if written.startswith("!") else link(target.removesuffix("()"))
        return f"[`{title}`][{identifier}]" if identifier else f"`{title}`"

    return TOKEN_RE.sub(replace, text)


def rendered_identifiers(docs: Path) -> set[str]:
    """The identifiers of the ``::: identifier`` lines of the pages under ``docs`` (not following
    a linked folder)."""
    found = set()
    for root, dirs, files in os.walk(docs):
        dirs[:] = [d for d in dirs if not (Path(root) / d).is_symlink()]
        for name in files:
            if name.endswith(".md"):
                found |= set(re.findall(r"^::: *([\w.]+) *$", (Path(root) / name).read_text(), re.M))
    return found


def canonical(obj: Object | Alias) -> Object:
    """The object itself, or the one an alias imports (raises where it cannot be followed)."""
    return obj.final_target if isinstance(obj, Alias) else obj


def shown(root: Object, paths: set[str]) -> None:
    """Adds to ``paths`` the paths of ``root`` and of every member its ``:::`` rendering shows (by
    mkdocs.yml's options): not a module, a name without a leading underscore, not imported unless
    the module exports it, a docstring of its own or a member's; a shown alias adds what it
    imports."""
    if root.path in paths:
        return
    paths.add(root.path)
    for member in root.members.values():
        if member.name.startswith("_") or (member.is_imported and not member.is_public):
            continue
        try:
            if not member.is_module and member.has_docstrings:
                shown(canonical(member), paths)
        except (AliasResolutionError, CyclicAliasError):
            continue


def find(target: str, scope: Object, loader: GriffeLoader, documented: set[str]) -> str | None:
    """The path of the documented object ``target`` names from ``scope``'s docstring, None where
    it names none. Looked up within ``scope``, its parents outward, then as a full path (an alias
    stands for what it imports); a name found nowhere is the one documented path that ends with
    it, where there is one."""
    name = target.lstrip(".")
    prefixes = []
    while scope is not None:
        prefixes.append(scope.path + ".")
        scope = scope.parent
    for prefix in [*prefixes, ""]:
        try:
            path = canonical(loader.modules_collection[prefix + name]).path
        except (KeyError, AliasResolutionError, CyclicAliasError):
            continue
        return path if path in documented else None
    endings = [path for path in documented if path.endswith("." + name)]
    return endings[0] if len(endings) == 1 else None


class SphinxRoles(Extension):
    """Rewrites the roles of every docstring of a package once the package is loaded: the objects
    its roles may name are known then (of the pages' objects, those of this package and of any
    loaded before it)."""

    def on_package(self, *, pkg: Module, loader: GriffeLoader, **kwargs) -> None:
        documented: set[str] = set()
        for identifier in rendered_identifiers(DOCS):
            try:
                shown(canonical(loader.modules_collection[identifier]), documented)
            except (KeyError, AliasResolutionError, CyclicAliasError):
                continue

        def visit(obj: Object) -> None:
            if obj.docstring is not None:
                obj.docstring.value = rewrite(obj.docstring.value, lambda target: find(target, obj, loader, documented))
            for member in obj.members.values():
                if not isinstance(member, Alias):
                    visit(member)

        visit(pkg)
