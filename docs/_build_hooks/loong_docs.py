"""mkdocs build hook: the hook reference page, generated from ``loong_core.hookspecs``.

Each hook gets its signature and its full docstring. A hook without a docstring, or one that
``hooks.md`` (the overview) does not mention, fails the build, as does (with ``strict``) any
broken link.
"""

from __future__ import annotations

import inspect
import re

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

PAGE = "reference/hooks.md"


def hook_specs() -> list[tuple[str, object]]:
    """``(name, function)`` of every hookspec, in declaration order."""
    from loong_core import hookspecs

    specs = [(name, fn) for name, fn in vars(hookspecs).items()
             if inspect.isfunction(fn) and name.startswith("loong_")
             and hasattr(fn, f"{hookspecs.PROJECT_NAME}_spec")]
    return sorted(specs, key=lambda item: item[1].__code__.co_firstlineno)


_SECTIONS = ("Args:", "Arguments:", "Returns:", "Raises:", "Yields:", "Example:", "Examples:")


def to_markdown(doc: str) -> str:
    """A Google-style docstring as Markdown: reST roles and ``::`` blocks, and Args / Returns /
    Raises sections as bold headings with one list item per entry."""
    doc = re.sub(r":(?:class|func|mod|meth|attr):`~?([^`]+)`", r"`\1`", doc)
    doc = re.sub(r"``([^`]+)``", r"`\1`", doc)
    out, section, block = [], None, False
    for line in doc.splitlines():
        if line.rstrip().endswith("::"):
            out += [line.rstrip()[:-1], "", "```python"]
            block = True
            continue
        if block:
            if line.strip() and not line.startswith("    "):
                out += ["```", ""]
                block = False
            else:
                out.append(line[4:])
                continue
        if line.strip() in _SECTIONS:
            section = line.strip()
            out += ["", f"**{section[:-1]}**", ""]
        elif section and line.startswith("    ") and not line.startswith("        "):
            name, sep, rest = line.strip().partition(": ")
            out.append(f"- `{name}`: {rest}" if sep and " " not in name else f"- {line.strip()}")
        elif section and line.startswith("        "):
            out[-1] += " " + line.strip()
        else:
            section = None if not line.strip() else section
            out.append(line)
    if block:
        out.append("```")
    return "\n".join(out)


def render() -> str:
    """Markdown of the reference page (raises PluginError for an undocumented hook)."""
    from loong_core import hookspecs

    lines = ["# Hook reference", "",
             "Generated from `loong_core/src/loong_core/hookspecs.py` when the site is built; the "
             "[hooks overview](../hooks.md) explains how they fit together.", "",
             to_markdown(inspect.cleandoc(hookspecs.__doc__ or "")), ""]
    for name, fn in hook_specs():
        doc = inspect.getdoc(fn)
        if not doc:
            raise PluginError(f"hook {name} in loong_core/hookspecs.py has no docstring: document "
                              "when it is called, what it gets and what it returns.")
        signature = str(inspect.signature(fn)).replace("'", "")
        lines += [f"## `{name}`", "", "```python", f"def {name}{signature}", "```", "",
                  to_markdown(doc), ""]
    return "\n".join(lines)


def on_files(files, config):
    """Add the generated page; check that the overview mentions every hook."""
    overview = (config["docs_dir"] + "/hooks.md")
    text = open(overview, encoding="utf-8").read()
    missing = [name for name, _ in hook_specs() if name not in text]
    if missing:
        raise PluginError(f"docs/hooks.md does not mention {', '.join(missing)}: add each hook to "
                          "the overview.")
    files.append(File.generated(config, PAGE, content=render()))
    return files
