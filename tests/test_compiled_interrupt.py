"""Ctrl-C during a long compiled kernel sum: the C loops run in pieces of bounded work
(``compiled.PIECE_WORK``), and a signal lands between two pieces instead of after the call."""

import os
import signal
import threading

import pytest
import torch

from localbook import compiled

pytestmark = [
    pytest.mark.faults,
    pytest.mark.skipif(
        compiled.library() is None, reason="no C compiler: the compiled engine is off"
    ),
]


class _Counting:
    """The compiled library, counting the calls of each entry point."""

    def __init__(self, lib):
        self._lib, self.calls = lib, {}

    def __getattr__(self, name):
        fn = getattr(self._lib, name)
        if not name.endswith(("sums", "sums_threads")):
            return fn

        def counted(*args):
            self.calls[name] = self.calls.get(name, 0) + 1
            return fn(*args)

        return counted


def _points(m, n, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, d, generator=g, dtype=torch.float64), torch.randn(
        n, d, generator=g, dtype=torch.float64
    )


@pytest.mark.parametrize("kernel", ["gaussian", "epanechnikov"])
def test_pieces_give_the_same_sums(monkeypatch, kernel):
    a, b = _points(300, 500, 2)
    v = torch.randn(500, 2, dtype=torch.float64)
    whole = compiled.kernel_sums(a, b, v, kernel, -700.0)
    lib = _Counting(compiled.library())
    monkeypatch.setattr(
        compiled, "PIECE_WORK", 500 * 5 * 7
    )  # 7 rows a piece: 43 pieces
    pieces = compiled.kernel_sums(a, b, v, kernel, -700.0, lib=lib)
    assert sum(lib.calls.values()) >= 43
    torch.testing.assert_close(pieces, whole, rtol=0, atol=0)
    start = torch.zeros(300, 1, dtype=torch.int64)
    count = torch.full((300, 1), 500, dtype=torch.int64)
    runs = compiled.run_sums(a, b, v, kernel, -700.0, start, count, lib=lib)
    torch.testing.assert_close(runs, whole, rtol=1e-12, atol=1e-12)


def test_a_small_call_is_one_piece():
    a, b = _points(200, 300, 1)
    lib = _Counting(compiled.library())
    compiled.kernel_sums(a, b, None, "gaussian", -700.0, lib=lib)
    assert sum(lib.calls.values()) <= max(1, torch.get_num_threads())


def test_ctrl_c_lands_between_pieces():
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be set from the main thread")

    class Interrupted(Exception):
        pass

    def handler(signum, frame):
        raise Interrupted

    a, b = _points(40_000, 40_000, 2)
    lib = _Counting(compiled.library())
    total = len(list(compiled._pieces(40_000, 40_000 * 3)))
    assert total > 10
    old = signal.signal(signal.SIGINT, handler)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    try:
        timer.start()
        with pytest.raises(Interrupted):
            compiled.kernel_sums(a, b, None, "gaussian", -700.0, lib=lib)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, old)
    # a single call would have run to the end before the handler could run
    assert sum(lib.calls.values()) < total
