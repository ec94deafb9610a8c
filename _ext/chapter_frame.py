"""The chapter frame: learning objectives, prerequisites and time at the head of a chapter, a
summary at its end (issue 29), read from the notebooks.

``read_frame(path)`` parses one chapter; ``reading_map(book)`` gives the chapter dependency graph
that the intro page draws (``draw_reading_map``, called by the Sphinx extension at build time).
Book tooling: nothing under ``localbook/`` imports this.
"""

import json
import re
from pathlib import Path

OPEN = "```{admonition} In this chapter"
ITEM = re.compile(r"^\s*(\d+)\.\s+(.*?)(?=^\s*\d+\.\s|^\s*\*\*|\Z)", re.M | re.S)
REF = re.compile(r"\{ref\}`(?:[^`<]*<)?([^`>]+)>?`")
DOC = re.compile(r"\{doc\}`(?:[^`<]*<)?([^`>]+)>?`")
LINK = re.compile(r"\{(?:prf:ref|ref|numref|doc|eq)\}`[^`]+`")
TIME = re.compile(r"\*\*Time:\*\*(.*)")
MINUTES = re.compile(r"(\d+(?:\.\d+)?)\s*(h|min)\b")


def _cells(path):
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    return [(c["cell_type"], "".join(c["source"])) for c in nb["cells"]]


def read_frame(path):
    """The frame of one chapter as a dict.

    Keys: ``objectives`` (list of texts), ``objective_refs`` (list of label lists, one per
    objective), ``builds_on`` (chapter stems), ``time`` (the text), ``minutes`` (the total the
    text states), ``summary`` (list of bullet texts), ``labels`` (every ``:label:`` and MyST
    target of the chapter), ``problems`` (what is missing or malformed, as sentences).
    """
    cells = _cells(path)
    problems = []
    labels = set()
    for _, text in cells:
        labels.update(re.findall(r"^:label:\s*(\S+)", text, re.M))
        labels.update(re.findall(r"^\(([\w-]+)\)=\s*$", text, re.M))
    head = cells[1][1] if len(cells) > 1 and cells[1][0] == "markdown" else ""
    if not head.startswith(OPEN):
        problems.append("cell 1 is not the 'In this chapter' admonition")
    elif not re.search(r"^:class:.*\bobjectives\b", head, re.M):
        problems.append("the admonition lacks ':class: tip objectives'")
    body = head.split("**Builds on:**")[0]
    objectives = [m.group(2).strip() for m in ITEM.finditer(body)]
    objective_refs = [REF.findall(o) for o in objectives]
    if not 3 <= len(objectives) <= 5:
        problems.append(f"{len(objectives)} objectives (3 to 5 wanted)")
    for text, refs in zip(objectives, objective_refs):
        if not refs:
            problems.append(f"objective without an exercise: {text[:60]!r}")
        for ref in refs:
            if ref not in labels:
                problems.append(f"objective names {ref!r}, not a label of this chapter")
    builds = re.search(r"\*\*Builds on:\*\*(.*?)(?=\n\s*\n|\*\*Time|\Z)", head, re.S)
    builds_on = DOC.findall(builds.group(1)) if builds else []
    if not builds:
        problems.append("no '**Builds on:**' line")
    time = TIME.search(head)
    minutes = 0.0
    if time:
        for value, unit in MINUTES.findall(time.group(1)):
            minutes += float(value) * (60 if unit == "h" else 1)
    if not minutes:
        problems.append("no '**Time:**' line with minutes or hours")
    summary = []
    titles = [text.split("\n", 1)[0].strip() for _, text in cells]
    if "## Summary" not in titles:
        problems.append("no '## Summary' cell")
    else:
        at = titles.index("## Summary")
        if "## Exercises" in titles and titles.index("## Exercises") != at + 1:
            problems.append("'## Summary' is not directly before '## Exercises'")
        summary = [
            b.strip() for b in re.findall(r"^- (.*(?:\n  .*)*)", cells[at][1], re.M)
        ]
        if not 3 <= len(summary) <= 7:
            problems.append(f"{len(summary)} summary bullets (3 to 7 wanted)")
        for bullet in summary:
            if not LINK.search(bullet):
                problems.append(f"summary bullet without a link: {bullet[:60]!r}")
    return {
        "objectives": objectives,
        "objective_refs": objective_refs,
        "builds_on": builds_on,
        "time": time.group(1).strip() if time else "",
        "minutes": minutes,
        "summary": summary,
        "labels": labels,
        "problems": problems,
    }


def chapter_stems(root):
    """``[(number, stem)]`` of the numbered parts of ``_toc.yml``, in order."""
    import yaml

    toc = yaml.safe_load((Path(root) / "_toc.yml").read_text(encoding="utf-8"))
    stems = [
        Path(ch["file"]).name
        for part in toc["parts"]
        if part.get("numbered")
        for ch in part["chapters"]
    ]
    return list(enumerate(stems, start=1))


def reading_map(root):
    """``(nodes, edges)``: nodes ``[(number, stem, title)]``, edges ``[(from_stem, to_stem)]``
    from each chapter's **Builds on:** line (an edge points from the prerequisite)."""
    nodes, edges = [], []
    for number, stem in chapter_stems(root):
        path = Path(root) / "book" / f"{stem}.ipynb"
        cells = _cells(path)
        title = cells[0][1].split("\n", 1)[0].lstrip("# ").strip()
        nodes.append((number, stem, title))
        edges.extend((Path(dep).name, stem) for dep in read_frame(path)["builds_on"])
    return nodes, edges


def _levels(nodes, edges):
    """Layer of each chapter: the longest chain of prerequisites below it."""
    level = {}
    for _, stem, _ in nodes:  # _toc order is a topological order (checked by the test)
        deps = [a for a, b in edges if b == stem]
        level[stem] = 1 + max((level.get(a, 0) for a in deps), default=-1)
    return level


def transitive_reduction(edges):
    """The edges not implied by a longer path (``a -> c`` goes when ``a -> b -> c`` exists)."""
    succ = {}
    for a, b in edges:
        succ.setdefault(a, set()).add(b)

    def reach(a, seen):
        for b in succ.get(a, ()):
            if b not in seen:
                seen.add(b)
                reach(b, seen)
        return seen

    return [
        (a, c)
        for a, c in edges
        if not any(c in reach(b, {b}) for b in succ[a] if b != c)
    ]


def draw_reading_map(root, out_stem):
    """Draw the reading map into ``out_stem``.svg and .png (matplotlib, no network); the arrows
    drawn are the transitive reduction of the Builds on edges (returned in full)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes, edges = reading_map(root)
    level = _levels(nodes, edges)
    rows = {}
    for number, stem, _ in nodes:
        rows.setdefault(level[stem], []).append(stem)
    pos = {}
    width = max(len(r) for r in rows.values())
    drawn = transitive_reduction(edges)
    for lev in sorted(rows):
        stems = rows[lev]
        if lev:  # under their parents (barycentre order): fewer crossing arrows

            def centre(stem):
                xs = [pos[a][0] for a, b in drawn if b == stem and a in pos]
                return sum(xs) / len(xs) if xs else width / 2

            stems = sorted(stems, key=centre)
        for k, stem in enumerate(stems):
            pos[stem] = ((k + 0.5) * width / len(stems), -lev)
    fig, ax = plt.subplots(figsize=(9, 1.3 * (len(rows) + 0.6)))
    for a, b in drawn:
        (x0, y0), (x1, y1) = pos[a], pos[b]
        ax.annotate(
            "",
            xy=(x1, y1 + 0.22),
            xytext=(x0, y0 - 0.22),
            arrowprops=dict(
                arrowstyle="->", color="0.45", lw=1.0, shrinkA=0, shrinkB=0
            ),
        )
    for number, stem, title in nodes:
        x, y = pos[stem]
        words, line, lines = title.split(), "", []
        for w in words:  # wrap the title at ~22 characters
            if line and len(line) + len(w) > 22:
                lines.append(line)
                line = w
            else:
                line = f"{line} {w}".strip()
        lines.append(line)
        ax.text(
            x,
            y,
            f"{number}. " + "\n".join(lines),
            ha="center",
            va="center",
            fontsize=8,
            bbox=dict(boxstyle="round,pad=0.35", fc="#eef3fb", ec="#4a6fa5"),
        )
    ax.set_xlim(-0.1, width + 0.1)
    ax.set_ylim(-max(rows) - 0.6, 0.6)
    ax.axis("off")
    ax.set_title(
        "Reading map: an arrow points from a chapter to one that builds on it\n"
        "(an arrow implied by a longer path is not drawn)",
        fontsize=9,
    )
    fig.tight_layout()
    Path(out_stem).parent.mkdir(parents=True, exist_ok=True)
    for ext in ("svg", "png"):
        fig.savefig(f"{out_stem}.{ext}", dpi=150)
    plt.close(fig)
    return nodes, edges
