# Two commands do all set-up on a fresh machine with Python 3.11:
#   make book   — create .venv, install everything, build the website into _build/html
#   make test   — same environment; unit/property tests, nbval over every chapter, strict build
SHELL := /bin/bash
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
JOBS   ?= 2
export PATH := $(abspath $(VENV))/bin:$(PATH)
# Widgets draw static small multiples in the build and in tests (see localbook/widgets.py).
export LOCALBOOK_STATIC := 1
export PYTHONHASHSEED := 0

.PHONY: book test lint unit nbval build-strict assignments bench clean install web-assets browser slow data
.PHONY: slow-offsite slow-site
.PHONY: tex pdf pdf-test

install: $(STAMP)

# Python writes the byte code of what it imports (.pyc, into .venv and the git-ignored
# __pycache__ folders) even where the environment sets PYTHONDONTWRITEBYTECODE, as the CI
# machine does: without it every pytest worker, chapter kernel and Sphinx run compiled torch,
# SciPy and Jupyter from source again (about 160 s of make test on 2 cores, measured
# 2026-12-03). Compiling only what is imported took as long in all as compileall over every
# installed file after pip (16,000 files, 37 s), and leaves the install shorter.
unexport PYTHONDONTWRITEBYTECODE
SITE_PACKAGES = $$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# the CPU build of torch first: a later unpinned request would otherwise pull CUDA wheels
	$(PY) -m pip install -q --no-compile torch==2.13.0
	# torch, the largest, is compiled on the second core while pip installs the rest
	site=$(SITE_PACKAGES); { $(PY) -m compileall -q $$site/torch >/dev/null 2>&1 & }; \
	  $(PY) -m pip install -q --no-compile -r requirements.txt; rc=$$?; wait; exit $$rc
	touch $@

# The JB1 execution cache does not notice changes to localbook/: key it on the package's hash.
define check_cache
	@h=$$(find localbook -type f \( -name '*.py' -o -path '*/data/*' \) | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16); \
	if [ "$$(cat _build/.localbook-hash 2>/dev/null)" != "$$h" ]; then \
	  echo "localbook changed ($$h): clearing the notebook execution cache"; rm -rf _build/.jupyter_cache; \
	fi; mkdir -p _build; echo $$h > _build/.localbook-hash
endef

# MathJax 3 and the ipywidgets renderer, served by the site itself (pinned in package.json and
# package-lock.json; node_modules/ and web_assets/ are git-ignored). See _config.yml.
WEB_ASSETS := web_assets/embed-amd.js
web-assets: $(WEB_ASSETS)

$(WEB_ASSETS): package.json package-lock.json
	@command -v npm >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm; }
	npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	rm -rf web_assets && mkdir -p web_assets/mathjax/output/chtml/fonts web_assets/mathjax/input/tex
	cp node_modules/mathjax/es5/tex-chtml.js web_assets/mathjax/
	cp -r node_modules/mathjax/es5/output/chtml/fonts/woff-v2 web_assets/mathjax/output/chtml/fonts/
	cp -r node_modules/mathjax/es5/input/tex/extensions web_assets/mathjax/input/tex/
	cp node_modules/requirejs/require.js web_assets/
	cp node_modules/@jupyter-widgets/html-manager/dist/embed-amd.js $@

# The full Fashion-MNIST from Debian's packages (dataset-fashion-mnist, 30 MB, official data
# recompressed), so chapters run offline; without apt-get, localbook's checked download serves.
FMNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
data:
	@test -f $(FMNIST) || ! command -v apt-get >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q dataset-fashion-mnist; }

# Headless Chromium from Debian's packages for the browser test (root, as in CI; idempotent).
browser:
	@command -v chromium >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }

book: $(STAMP) $(WEB_ASSETS) data
	$(check_cache)
	$(VENV)/bin/jupyter-book build --all . -W -n --keep-going
	@echo "Website built: open _build/html/index.html"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# one thread per worker: with two threads each, $(JOBS) workers oversubscribe the cores and
# OpenMP's spinning threads cost CPU time (4 min 55 s of CPU for the unit tests, 3 min 21 s
# with one); the tests of the threaded paths set their thread counts themselves
unit: $(STAMP) data
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(PY) -m pytest tests -m "not slow" -n $(JOBS) -q

# one thread per kernel: $(JOBS) kernels side by side must not oversubscribe the cores.
# Whole chapters to each worker, longest first (book/conftest.py; xdist's own reordering by
# number of cells is turned off).
# Each chapter that passes is stored with nbval's outputs in the build's execution cache
# (book/conftest.py), so `make book` after `make nbval` executes no chapter a second time.
nbval: $(STAMP) data
	$(check_cache)
	LOCALBOOK_NB_CACHE=_build/.jupyter_cache OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \
	  $(PY) -m pytest book --nbval-lax --nbval-current-env -n $(JOBS) --dist loadfile --no-loadscope-reorder -q

# End-to-end (after the build): student notebooks run, a chapter the Colab way, the site in Chromium.
# --dist load: test by test, so the chapter executions of test_assignments spread over workers
# Only the files that mark a test slow are collected: collecting all of tests/ costs each
# worker 15 s of imports, these files 7 s (test_pdf.py has its own target, pdf-test)
SLOW_FILES = $$(grep -l 'pytest.mark.slow' tests/test_*.py | grep -v test_pdf.py)
SLOW_TESTS = OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \
  $(PY) -m pytest $(SLOW_FILES) -q -n $(JOBS) --dist load
slow: $(STAMP) browser
	$(SLOW_TESTS) -m slow
# make test: the end-to-end tests that need no website run beside the (one-core) book build,
# those that read it (marker `site`) after it
slow-offsite: $(STAMP)
	$(SLOW_TESTS) -m "slow and not site"
slow-site: $(STAMP) browser
	$(SLOW_TESTS) -m "slow and site"

# The parts mostly in turn: side by side (unit beside nbval -> book -> slow under make -j2)
# they took 14 min 28 s on an idle 2-core machine, more than in turn: four single-threaded
# processes on two cores ran slower than two. Beside the parts that use both cores only what
# leaves a core idle: npm's install of the site's assets beside pip's (each mostly one core),
# the end-to-end tests that need no website beside the book build (Sphinx uses one core).
test:
	$(MAKE) --no-print-directory -j2 --output-sync=target install web-assets
	$(MAKE) --no-print-directory lint unit
	$(MAKE) --no-print-directory nbval
	$(MAKE) --no-print-directory -j2 --output-sync=target book slow-offsite
	$(MAKE) --no-print-directory slow-site

# The book as one PDF, _build/latex/localization-methods.pdf, also copied into the site (every
# page has a download button for it). TeX Live from Debian's packages where xelatex, latexmk,
# xindy (the index) or pdftotext is missing (root, as in CI; about 2.5 minutes; FreeFont for the
# text, DejaVu for code), then Sphinx's LaTeX builder through xelatex and latexmk. The chapters'
# outputs come from the execution cache that `make book` (or `make nbval`) fills: after them no
# chapter runs again.
PDF := _build/latex/localization-methods.pdf
tex:
	@{ command -v xelatex && command -v latexmk && command -v xindy && command -v pdftotext; } >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q texlive-xetex texlive-latex-extra texlive-fonts-recommended texlive-fonts-extra latexmk xindy fonts-freefont-otf fonts-dejavu-core poppler-utils; }

pdf: $(STAMP) data tex
	$(check_cache)
	rm -f $(PDF)
	LATEXOPTS='-interaction=nonstopmode -halt-on-error' \
	  $(VENV)/bin/jupyter-book build --all . --builder pdflatex -W -n --keep-going
	test -s $(PDF)
	mkdir -p _build/html && cp $(PDF) _build/html/
	@echo "PDF built: $(PDF)"

# every chapter heading in the PDF, the LaTeX log's missing glyphs and overfull boxes under
# their stated limits, as many figures as the website (run after `make book`)
pdf-test: pdf
	$(PY) -m pytest tests/test_pdf.py -m slow -q

# An nbgrader course in _build/assignments: source/NN_name/ (instructor) and release/NN_name/
# (student notebooks, by `nbgrader generate_assignment`); see book/teaching.md.
assignments: $(STAMP)
	$(PY) _ext/assignments.py book _build/assignments

# The website on GitHub Pages: `make publish` builds the site and the PDF its pages link to
# (`make book pdf`) and pushes _build/html to the gh-pages branch of REMOTE with ghp-import (a
# commit on the local gh-pages branch, then a forced push; .nojekyll so that Pages serves
# _static/ and _images/ as they are). `make publish-built` pushes an existing build without
# rebuilding. Either refuses a site whose pages link a PDF it lacks. Override REMOTE (a
# remote's name or any git URL or path), BRANCH and SITE: `make publish REMOTE=upstream`.
REMOTE ?= origin
BRANCH ?= gh-pages
SITE   ?= _build/html
.PHONY: publish publish-built
define push_site
	@test -f $(SITE)/index.html || { echo "no website at $(SITE): run make book first"; exit 1; }
	@grep -ro --include='*.html' 'href="[^"#?:]*\.pdf"' $(SITE) | sort -u | while IFS= read -r hit; do \
	  page=$${hit%%:href=*}; f=$${hit#*:href=\"}; f=$${f%\"}; \
	  test -f "$$(dirname "$$page")/$$f" || { echo "$$page links $$f, which is missing: run make pdf"; exit 1; }; \
	done
	$(VENV)/bin/ghp-import --no-jekyll --push --force --remote $(REMOTE) --branch $(BRANCH) \
	  --message "Publish the website built from $$(git rev-parse --short HEAD 2>/dev/null)" $(SITE)
	@echo "Published $(SITE) to $(BRANCH) of $(REMOTE)"
endef

publish: book pdf
	$(push_site)

publish-built:
	$(push_site)

# the CPU sections, both sides on 2 threads (the issue-18 targets are stated for 2 threads)
# benchmarks/requirements.txt: the benchmarks' optional references (KeOps); a section whose
# reference is missing says so, so a failed install does not stop the run
bench: $(STAMP)
	-$(PY) -m pip install -q -r benchmarks/requirements.txt
	$(PY) benchmarks/run_all.py --threads 2

clean:
	rm -rf _build
