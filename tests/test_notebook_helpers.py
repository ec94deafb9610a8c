"""lb.glue: run-dependent numbers reach the prose as plain Python values myst-nb can format."""

import numpy as np
import torch
from myst_nb.core.variables import format_plain_text

import localbook as lb


def test_glue_turns_numpy_and_torch_scalars_into_formattable_numbers(capsys):
    for value, expected in [
        (np.float64(0.123456), "0.123"),
        (torch.tensor(2.5), "2.500"),
        (np.float32(1.0), "1.000"),
        (0.25, "0.250"),
    ]:
        plain = lb.glue("x", value)
        assert type(plain) in (int, float)
        assert format_plain_text(repr(plain), ".3f") == expected
    assert lb.glue("n", np.int64(7)) == 7 and type(lb.glue("n", np.int64(7))) is int
    assert lb.glue("s", "text") == "text"


def test_glue_keeps_arrays_as_they_are():
    a = np.arange(3.0)
    assert lb.glue("a", a) is a
