"""localbook — the library of the open textbook *Localization Methods*.

Most learning machines are local means: weight your neighbours with a localization kernel,
then average. Submodules, one idea each:

``kernels`` (localization kernels, the chunked pairwise engine, ``knn_search``), ``local_mean``
(Nadaraya–Watson, local linear, KNN, LOO-CV), ``datasets`` (every synthetic generator and the
shipped data), ``plotting`` (every shared figure), ``widgets``, and the modules of the later
chapters (density, denoising, attention and language models, entmax, sparse graphs,
memorization and feature maps, ...). ``_validate`` holds the argument checks every module uses.
"""

from ._validate import default_device
from .kernels import *  # noqa: F401,F403
from .local_mean import *  # noqa: F401,F403
from . import datasets, plotting, widgets  # noqa: F401

# --- chapter modules: one line each, `from .module import *` -------------------------------
from .denoise import *  # noqa: F401,F403
from . import check  # noqa: F401  (self-checks for the exercises: lb.check.ch01, ...)
from .notebook import glue  # noqa: F401  (run-dependent numbers in the prose)
from .density import *  # noqa: F401,F403
from .modes import *  # noqa: F401,F403
from .medoids import *  # noqa: F401,F403
from .attention import *  # noqa: F401,F403
from .transformer import *  # noqa: F401,F403
from .token_graph import *  # noqa: F401,F403
from .language import *  # noqa: F401,F403
from .memorization import *  # noqa: F401,F403
from .features import *  # noqa: F401,F403
from .entmax import *  # noqa: F401,F403
from .entmax_losses import *  # noqa: F401,F403
from .embedding import *  # noqa: F401,F403
from .triplets import *  # noqa: F401,F403
from .fashion_mnist import *  # noqa: F401,F403
from .metrics import *  # noqa: F401,F403
from .sagl import *  # noqa: F401,F403
from .sagl_graphs import *  # noqa: F401,F403
from .sagl_fit import *  # noqa: F401,F403
from . import sagl_study  # noqa: F401,E402  (the study of chapter 9, as code)
from .local_decisions import *  # noqa: F401,F403
from .metric import *  # noqa: F401,F403
# (end of chapter modules)

# generators and figures that live in the namespaces but are called as lb.X by the chapters
from .datasets import add_noise_border, spurious_gaussian_data, spurious_split  # noqa: F401,E402
from .datasets import make_digits_views, make_fashion_views, make_multiview_subspaces  # noqa: E402
from .datasets import block_mask, holdout_mask, missing_at_random_mask  # noqa: E402
from .plotting import draw_attention_graph  # noqa: F401,E402


# Modules built on scikit-learn classes load on first use (scikit-learn costs ~1-3 s of import
# time nobody else pays for): the estimators and the imputer (chapter 12). Their public names
# are read from the literal ``__all__ = [...]`` of each module's source without importing it
# (a regular expression, not a parse of the whole file: tests/test_datasets.py checks it).
def _public_names(module: str):
    import ast
    import re
    from pathlib import Path

    src = (Path(__file__).parent / f"{module}.py").read_text(encoding="utf-8")
    found = re.search(r"^__all__ = (\[[^\]]*\])", src, flags=re.M)
    return ast.literal_eval(found.group(1)) if found else []


_LAZY = {
    name: module
    for module in ("estimators", "impute")
    for name in _public_names(module)
}


def __getattr__(name):
    if name in _LAZY or name in ("estimators", "impute"):
        import importlib

        module = importlib.import_module(f".{_LAZY.get(name, name)}", __name__)
        value = module if name in ("estimators", "impute") else getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def _all_names():
    """The public API, read from the import lines of this file: every ``from .m import *``
    module's ``__all__``, the names imported one by one (``from .m import a, b``), the
    namespaces (``from . import m``), and the lazy names and modules."""
    import importlib
    import re
    from pathlib import Path

    src = Path(__file__).read_text(encoding="utf-8")
    names = set(_LAZY) | {"estimators", "impute"}
    for module, imported in re.findall(
        r"^from \.(\w*) import ([\w, *]+)", src, flags=re.M
    ):
        if imported.strip() == "*":
            names |= set(importlib.import_module(f".{module}", __name__).__all__)
        else:
            names |= {n.strip() for n in imported.split(",") if n.strip()}
    return sorted(n for n in names if not n.startswith("_"))


__all__ = _all_names()


__version__ = "0.1.0"
