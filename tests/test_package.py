"""The package's top-level namespace: no chapter module shadows another's public name."""

import importlib
import re
from pathlib import Path

import localbook

INIT = Path(localbook.__file__).with_name("__init__.py")


def test_no_two_star_exported_modules_share_a_public_name():
    """``from .a import *`` then ``from .b import *`` silently replaces ``a.name`` by
    ``b.name`` at the top level (sagl.attention_graph once hid attention.attention_graph)."""
    modules = re.findall(r"^from \.(\w+) import \*", INIT.read_text(), flags=re.M)
    owner = {}
    for mod in modules:
        for name in importlib.import_module(f"localbook.{mod}").__all__:
            obj = getattr(importlib.import_module(f"localbook.{mod}"), name)
            first = owner.setdefault(name, (mod, obj))
            # a re-export of the same object (impute re-exports impute_layers) is fine
            assert first[1] is obj, f"{name} is exported by both {first[0]} and {mod}"
    for name, (mod, obj) in owner.items():
        assert getattr(localbook, name) is obj, f"localbook.{name} is not {mod}.{name}"
