"""mkdocs hook: pages say <!-- her_mpi:settings --> or <!-- her_mpi:recipes --> where the package's own
list of settings (python -m her_mpi.train --list-keys) or recipes (--list-recipes) belongs, so the
docs never drift from the code."""

from __future__ import annotations


def on_page_markdown(markdown: str, page, config, files) -> str:
    if "<!-- her_mpi:settings -->" in markdown:
        markdown = markdown.replace("<!-- her_mpi:settings -->", settings_tables())
    if "<!-- her_mpi:recipes -->" in markdown:
        markdown = markdown.replace("<!-- her_mpi:recipes -->", recipes_table())
    return markdown


def cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def settings_tables() -> str:
    from her_mpi.config import SECTIONS, list_keys

    out = []
    for section in SECTIONS:
        rows = [line for line in list_keys(section, None).splitlines() if line.strip()]
        out.append(f"### `{section}`\n\n```text\n" + "\n".join(rows) + "\n```\n")
    return "\n".join(out)


def recipes_table() -> str:
    from her_mpi.train import list_recipes

    lines = ["| recipe | env | algorithm | what it is |", "| --- | --- | --- | --- |"]
    for line in list_recipes().splitlines():
        name, env, algo, *comment = line.split(maxsplit=3)
        lines.append(f"| `{name}` | {env} | {algo} | {cell(comment[0] if comment else '')} |")
    return "\n".join(lines)
