"""Self-checks: call one on your own answer to an exercise and get a verdict with a hint.

Each chapter with code exercises has a submodule named by its chapter number
(``check.ch01``, ``check.ch02``, …, ``check.ch12``) whose
functions take *your* function, run it on fresh random cases against ``localbook``'s reference
implementation (or a brute-force computation), and print either a success line or the first
failing case (expected vs got) with a short hint. They return ``True``/``False`` and never show
solution code. In the book build and the test suite (``LOCALBOOK_STATIC`` or
``LOCALBOOK_CHECK_STRICT`` set) a failed check raises ``AssertionError`` instead, so a broken
solution fails the build; see :mod:`localbook.check._common`.
"""

from . import ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch10, ch11, ch12  # noqa: F401
from ._common import strict_mode  # noqa: F401

__all__ = [
    "ch01",
    "ch02",
    "ch03",
    "ch04",
    "ch05",
    "ch06",
    "ch07",
    "ch08",
    "ch10",
    "ch11",
    "ch12",
    "strict_mode",
]
