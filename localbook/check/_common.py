"""The machinery every self-check shares: fresh cases, running the student's function, hints.

A self-check calls the student's function on a few random cases, compares each answer with a
reference computed by ``localbook`` (or by brute force), and prints either one success line or
the first failing case with a short, specific hint. It never prints solution code.

Two modes:

* **friendly** (a student's notebook, Jupyter or Colab): a wrong answer prints the hint and the
  check returns ``False``; a stub that still raises ``NotImplementedError`` prints
  "not implemented yet" and returns ``False``. Nothing raises, so the notebook keeps running.
* **strict** (the book build and the test suite): a wrong answer raises ``AssertionError`` with
  the same hint, and a stub's ``NotImplementedError`` propagates, so a broken solution fails the
  build instead of printing a message nobody reads.

Strict mode is on when the environment variable ``LOCALBOOK_CHECK_STRICT`` is true, or when it is
unset and ``LOCALBOOK_STATIC`` (set by ``make book`` / ``make test``) is true.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch

_TRUE = {"1", "true", "yes", "on"}
_calls = itertools.count()

#: base of the per-call seeds: call ``c`` of a process uses ``BASE_SEED + c`` (reproducible, varied)
BASE_SEED = 20260


def strict_mode() -> bool:
    """True when a failed check must raise (book build, CI); see the module docstring."""
    flag = os.environ.get("LOCALBOOK_CHECK_STRICT")
    if flag is not None and flag.strip() != "":
        return flag.strip().lower() in _TRUE
    return os.environ.get("LOCALBOOK_STATIC", "").strip().lower() in _TRUE


def new_generator(seed: Optional[int] = None) -> torch.Generator:
    """A private generator (the global RNG is left alone): a fresh seed per call unless given."""
    g = torch.Generator()
    g.manual_seed(BASE_SEED + next(_calls) if seed is None else int(seed))
    return g


class Mismatch(Exception):
    """A case failed: ``message`` says what was expected and what came back, ``hint`` why."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint


@dataclass
class Case:
    """One random test case: the arguments passed to the student's function and a description."""

    args: tuple
    describe: str
    extra: Dict[str, Any] = field(default_factory=dict)


def fmt(v: float) -> str:
    return f"{v:.6g}"


def fmt_vec(t: torch.Tensor, k: int = 4) -> str:
    vals = ", ".join(fmt(float(v)) for v in t.flatten()[:k])
    return f"[{vals}{', …' if t.numel() > k else ''}]"


def _clone(a):
    return a.clone() if isinstance(a, torch.Tensor) else a


def as_scalar(got, what: str = "your function") -> float:
    """The student's scalar answer as a float, or a :class:`Mismatch` saying what came back."""
    if isinstance(got, bool) or got is None:
        raise Mismatch(f"{what} returned {got!r}", "return a number (a Python float)")
    if isinstance(got, torch.Tensor):
        if got.ndim != 0:
            raise Mismatch(
                f"{what} returned a tensor of shape {tuple(got.shape)}; a scalar was expected",
                "return a float: `float(t)` or `t.item()` turns a one-element tensor into one",
            )
        return float(got)
    try:
        import numpy as np

        if isinstance(got, np.ndarray) and got.ndim != 0:
            raise Mismatch(
                f"{what} returned an array of shape {got.shape}; a scalar was expected",
                "return a float, not an array",
            )
    except ImportError:  # pragma: no cover
        pass
    try:
        return float(got)
    except (TypeError, ValueError):
        raise Mismatch(
            f"{what} returned a {type(got).__name__}; a number was expected",
            "return a float",
        ) from None


def as_answer(
    got,
    shape: tuple,
    like: torch.Tensor,
    what: str = "your function",
    shape_hint: str = "",
    reshape_hint: str = "",
) -> torch.Tensor:
    """The student's answer as a tensor of ``shape`` like ``like``, or a :class:`Mismatch`.

    ``shape_hint`` is the hint for a wrong shape, ``reshape_hint`` the one for a wrong shape
    with the right number of entries.
    """
    shape = tuple(shape)
    if got is None:
        raise Mismatch(
            f"{what} returned None", "did you forget the `return` statement?"
        )
    if not isinstance(got, torch.Tensor):
        try:
            got = torch.as_tensor(got)
        except Exception:
            raise Mismatch(
                f"{what} returned a {type(got).__name__}; a tensor of shape {shape} was expected",
                "return a torch tensor",
            ) from None
    if tuple(got.shape) != shape:
        hint = reshape_hint if got.numel() == math.prod(shape) else shape_hint
        raise Mismatch(f"shape {tuple(got.shape)} returned, {shape} expected", hint)
    if got.is_complex() or not (
        got.is_floating_point() or got.dtype in (torch.int32, torch.int64)
    ):
        raise Mismatch(
            f"{what} returned dtype {got.dtype}", "return real floating-point values"
        )
    return got.detach().to(dtype=like.dtype, device="cpu")


def as_vector(
    got, n: int, like: torch.Tensor, what: str = "your function"
) -> torch.Tensor:
    """The student's ``(n,)`` answer as a tensor like ``like``, or a :class:`Mismatch`."""
    return as_answer(
        got,
        (n,),
        like,
        what,
        "return a 1-D tensor with one entry per data point",
        "you have the right number of entries: flatten it (e.g. "
        f"`.reshape({n})` or `.squeeze()`)",
    )


def close(
    a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-6, atol: float = 1e-8
) -> bool:
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    return bool(torch.isfinite(a).all()) and bool(
        torch.allclose(a, b, rtol=rtol, atol=atol)
    )


def run_check(
    name: str,
    fn: Callable,
    cases: List[Case],
    judge: Callable[[Case, Any], None],
    summary: str,
) -> bool:
    """Call ``fn`` on every case and let ``judge(case, answer)`` raise :class:`Mismatch` on a wrong answer.

    Prints one line on success, or the failing case with its hint; returns True/False (strict mode
    raises instead of returning False, see the module docstring).
    """
    if not callable(fn):
        return _fail(
            name,
            f"expected your function itself, got a {type(fn).__name__}",
            "pass the function without calling it: check(my_function), not check(my_function(...))",
        )
    fname = getattr(fn, "__name__", "your function")
    for i, case in enumerate(cases, 1):
        where = f"case {i} of {len(cases)} ({case.describe})"
        try:
            got = fn(*[_clone(a) for a in case.args])
        except NotImplementedError:
            if strict_mode():
                raise
            print(
                f"… {name}: `{fname}` is not implemented yet — replace `raise NotImplementedError` "
                "with your code, then run this check again."
            )
            return False
        except (
            Exception
        ) as exc:  # the student's code crashed: say where, not how to fix it
            return _fail(
                name,
                f"{where}: `{fname}` raised {type(exc).__name__}: {exc}",
                "run it on a small example of your own to find the line that fails",
            )
        try:
            judge(case, got)
        except Mismatch as m:
            return _fail(name, f"{where}: {m.message}", m.hint)
    print(f"✓ {name}: correct on all {len(cases)} random cases ({summary}).")
    return True


def _fail(name: str, message: str, hint: str) -> bool:
    text = f"✗ {name}: {message}" + (f"\n  hint: {hint}" if hint else "")
    if strict_mode():
        raise AssertionError(text)
    print(text)
    return False


def isclose(a: float, b: float, rtol: float = 1e-6, atol: float = 1e-9) -> bool:
    return math.isfinite(a) and math.isclose(a, b, rel_tol=rtol, abs_tol=atol)
