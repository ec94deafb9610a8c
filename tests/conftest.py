import os

import pytest
import torch
from hypothesis import settings

# Property tests draw the same examples on every run (CI must not be flaky); set
# HYPOTHESIS_PROFILE=explore to search with fresh random examples while developing.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

os.environ.setdefault("LOCALBOOK_STATIC", "1")
import matplotlib

matplotlib.use(
    "Agg"
)  # in this process only: notebook kernels keep their inline backend

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request):
    """Every device test runs on the CPU, and again on CUDA when one is present."""
    return torch.device(request.param)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
