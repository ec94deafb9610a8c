"""Publishing the website (``make publish``), end to end against local git repositories.

``make publish`` builds the site and the PDF its pages link to (``make book pdf``, the real
builds, ten minutes and more) and then runs the same recipe as ``make publish-built``:
``ghp-import`` commits the site to a ``gh-pages`` branch, adds ``.nojekyll`` and force-pushes
the branch to ``REMOTE``. The fast tests run that recipe, from the project's Makefile, on a
small site made here (an ``index.html``, one page per chapter of ``_toc.yml``, a ``_static/``
file and a PDF): from a scratch git repository, so the project's own repository gets no
``gh-pages`` branch, into a local bare repository, whose pushed tree they read back. A dry run
(``make -n publish``) checks that ``make publish`` builds the real site and the PDF first and
publishes ``_build/html``. The slow test publishes the real build (``_build/html``, after
``make book``) the same way and checks every chapter page, every PDF the pages link to, and
``.nojekyll``.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urljoin, urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"
BUILT = ROOT / "_build" / "html"
GHP = VENV / "bin" / "ghp-import"


def chapter_pages():
    """``book/NN_name.html`` of every chapter in ``_toc.yml``, in reading order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [
        c["file"] for part in toc.get("parts", []) for c in part.get("chapters", [])
    ]
    return [f"{f}.html" for f in files if re.match(r"book/\d\d_", f)]


def git(*args, cwd=None, check=True):
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="test",
        GIT_AUTHOR_EMAIL="test@example.invalid",
        GIT_COMMITTER_NAME="test",
        GIT_COMMITTER_EMAIL="test@example.invalid",
    )
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=check, capture_output=True, text=True
    )


def make(target, cwd, **variables):
    """Run a target of the project's Makefile with ``cwd`` as the working directory."""
    if not GHP.exists():
        pytest.fail(
            f"{GHP} is missing: `make install` (ghp-import is in requirements.txt)"
        )
    cmd = ["make", "-s", "-f", str(ROOT / "Makefile"), target, f"VENV={VENV}"]
    cmd += [f"{k}={v}" for k, v in variables.items()]
    env = dict(
        os.environ,
        GIT_COMMITTER_NAME="test",
        GIT_COMMITTER_EMAIL="test@example.invalid",
    )
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)


def pushed_tree(bare, branch="gh-pages"):
    out = git("--git-dir", str(bare), "ls-tree", "-r", "--name-only", branch).stdout
    return set(out.split())


def pushed_file(bare, path, branch="gh-pages"):
    return git("--git-dir", str(bare), "show", f"{branch}:{path}").stdout


def local_pdf_links(html, page):
    """The site paths of the PDFs a page links to (``page`` is its path in the site)."""
    base = "http://site/" + page
    out = []
    for href in re.findall(r'href="([^"#?]+\.pdf)"', html):
        url = urljoin(base, href)
        if urlparse(url).hostname == "site":
            out.append(urlparse(url).path.lstrip("/"))
    return out


@pytest.fixture
def fake_site(tmp_path):
    """A small site shaped like the real one: index, chapter pages, _static, a linked PDF."""
    site = tmp_path / "html"
    (site / "book").mkdir(parents=True)
    (site / "_static").mkdir()
    (site / "_static" / "localbook.css").write_text("pre { font-size: 0.8em; }\n")
    (site / "localization-methods.pdf").write_bytes(b"%PDF-1.5\n% fake\n%%EOF\n")
    links = "".join(f'<a href="{p}">{p}</a>' for p in chapter_pages())
    (site / "index.html").write_text(
        f'<html><body>{links}<a href="localization-methods.pdf">PDF</a></body></html>'
    )
    for page in chapter_pages():
        (site / page).write_text(
            f'<html><body>{page}<a href="../localization-methods.pdf">PDF</a></body></html>'
        )
    return site


@pytest.fixture
def repos(tmp_path):
    """A scratch working repository (make runs there) and an empty bare remote."""
    work, bare = tmp_path / "work", tmp_path / "remote.git"
    git("init", "-q", str(work))
    git("init", "-q", "--bare", str(bare))
    return work, bare


def check_published(bare, site):
    tree = pushed_tree(bare)
    assert ".nojekyll" in tree, "no .nojekyll: GitHub Pages would hide _static/"
    assert "index.html" in tree
    missing = [p for p in chapter_pages() if p not in tree]
    assert not missing, f"chapter pages not published: {missing}"
    assert pushed_file(bare, "index.html") == (site / "index.html").read_text()
    local = {p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()}
    assert local <= tree, f"not published: {sorted(local - tree)[:5]}"
    for page in ["index.html"] + chapter_pages():
        for pdf in local_pdf_links(pushed_file(bare, page), page):
            assert pdf in tree, f"{page} links {pdf}, which is not published"
    for pdf in site.glob("*.pdf"):
        assert pdf.name in tree
    return tree


def test_publish_built_pushes_the_site(fake_site, repos):
    work, bare = repos
    r = make("publish-built", work, SITE=fake_site, REMOTE=bare)
    assert r.returncode == 0, r.stdout + r.stderr
    tree = check_published(bare, fake_site)
    assert "_static/localbook.css" in tree
    assert "localization-methods.pdf" in tree
    # ghp-import commits to the gh-pages branch of the repository make ran in
    assert git("rev-parse", "--verify", "gh-pages", cwd=work).returncode == 0


def test_publish_again_replaces_the_site(fake_site, repos):
    """A second publication replaces the pages (a removed page disappears) on top of the first."""
    work, bare = repos
    assert make("publish-built", work, SITE=fake_site, REMOTE=bare).returncode == 0
    gone = fake_site / chapter_pages()[-1]
    gone.unlink()
    (fake_site / "index.html").write_text("<html><body>second</body></html>")
    r = make("publish-built", work, SITE=fake_site, REMOTE=bare)
    assert r.returncode == 0, r.stdout + r.stderr
    tree = pushed_tree(bare)
    assert chapter_pages()[-1] not in tree
    assert pushed_file(bare, "index.html") == "<html><body>second</body></html>"
    n = git("--git-dir", str(bare), "rev-list", "--count", "gh-pages").stdout
    assert int(n) == 2


def test_branch_and_remote_are_overridable(fake_site, repos):
    work, bare = repos
    git("remote", "add", "pages", str(bare), cwd=work)
    r = make("publish-built", work, SITE=fake_site, REMOTE="pages", BRANCH="site")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "index.html" in pushed_tree(bare, "site")
    assert (
        git(
            "--git-dir", str(bare), "rev-parse", "--verify", "gh-pages", check=False
        ).returncode
        != 0
    )


def test_publish_built_refuses_a_missing_site(tmp_path, repos):
    work, bare = repos
    r = make("publish-built", work, SITE=tmp_path / "nothing", REMOTE=bare)
    assert r.returncode != 0
    assert "make book" in r.stdout + r.stderr
    assert git("--git-dir", str(bare), "branch", "--list").stdout.strip() == ""


def test_publish_built_refuses_a_missing_pdf(fake_site, repos):
    """Every page links the book's PDF: a site without it is not published."""
    work, bare = repos
    (fake_site / "localization-methods.pdf").unlink()
    r = make("publish-built", work, SITE=fake_site, REMOTE=bare)
    assert r.returncode != 0
    assert "make pdf" in r.stdout + r.stderr
    assert git("--git-dir", str(bare), "branch", "--list").stdout.strip() == ""


def test_publish_builds_the_real_site_first():
    """``make publish`` = the strict book build and the PDF, then the push of ``_build/html``."""
    r = subprocess.run(
        ["make", "-n", "publish"], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    build = next(i for i, l in enumerate(lines) if "jupyter-book build" in l)
    pdf = next(i for i, l in enumerate(lines) if "--builder pdflatex" in l)
    push = next(i for i, l in enumerate(lines) if "ghp-import" in l)
    assert build < push and pdf < push
    assert "--no-jekyll" in lines[push] and "--push" in lines[push]
    assert "--remote origin --branch gh-pages" in lines[push]
    assert "_build/html" in r.stdout.split("ghp-import", 1)[1]


def missing_pdfs(site):
    """``(page, link)`` for every PDF a page of ``site`` links that is not in ``site``."""
    out = []
    for page in site.rglob("*.html"):
        rel = page.relative_to(site).as_posix()
        for pdf in local_pdf_links(
            page.read_text(encoding="utf-8", errors="replace"), rel
        ):
            if not (site / pdf).is_file():
                out.append((rel, pdf))
    return out


@pytest.mark.slow
@pytest.mark.site
def test_publish_the_real_build(repos):
    """The site `make book` built, published as `make publish` does (run after `make book`).

    Every page links the book's PDF, which `make pdf` adds to the site; `make test` runs before
    `make pdf` (`.ci/run`), so without the PDF this checks that publishing is refused and skips
    the rest: run it again after `make pdf` for the whole check."""
    if not (BUILT / "index.html").exists():
        pytest.fail(f"no built site at {BUILT}: run `make book` first")
    work, bare = repos
    r = make("publish-built", work, SITE=BUILT, REMOTE=bare)
    missing = missing_pdfs(BUILT)
    if missing:
        assert r.returncode != 0 and "make pdf" in r.stdout + r.stderr, r.stdout
        assert git("--git-dir", str(bare), "branch", "--list").stdout.strip() == ""
        pytest.skip(
            f"{missing[0][0]} links {missing[0][1]}, not built yet: publishing is refused "
            "(as it should be); run `make pdf`, then this test, for the whole check"
        )
    assert r.returncode == 0, r.stdout + r.stderr
    check_published(bare, BUILT)


def test_ghp_import_is_a_requirement():
    reqs = (ROOT / "requirements.txt").read_text()
    assert re.search(r"^ghp-import==", reqs, re.M)
    assert shutil.which("git")
