"""Input validation: one helper per kind of argument, one clear error per mistake.

Every public function of ``localbook`` turns its inputs into tensors here, in the style of
scikit-learn's ``check_array``: array-likes become tensors on the reference tensor's device,
float inputs keep their dtype, integer inputs become the default float dtype, and every
mistake raises a ``TypeError``/``ValueError`` that names the argument.
"""

from __future__ import annotations

import functools
import math
import numbers
import warnings
from typing import List, Optional, Sequence

import numpy as np
import torch

from .chunks import chunk_rows, iter_chunks

__all__ = ["default_device"]


def default_device() -> torch.device:
    """The fastest device present: CUDA, else Apple MPS, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _float_dtype(t: torch.Tensor) -> torch.dtype:
    return t.dtype if t.is_floating_point() else torch.get_default_dtype()


HALF = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype to compute in: float32 for half precision (no solvers, eigen- or
    factorizations, and too little range for the moments), else ``dtype`` itself."""
    return torch.float32 if dtype in HALF else dtype


def float_dtype_of(value) -> Optional[torch.dtype]:
    """The floating dtype a strongly typed array brings to type promotion: that of a floating
    tensor or numpy array; ``None`` for integer and bool arrays, Python lists and numbers,
    which adopt their partners' dtype (as Python numbers do in PyTorch)."""
    if isinstance(value, torch.Tensor):
        return value.dtype if value.is_floating_point() else None
    return _NUMPY_FLOATS.get(value.dtype) if isinstance(value, np.ndarray) else None


_NUMPY_FLOATS = {
    np.dtype(f"float{b}"): getattr(torch, f"float{b}") for b in (16, 32, 64)
}


def promoted_dtype(*values) -> Optional[torch.dtype]:
    """PyTorch's type promotion (``torch.promote_types``) over the floating arrays among
    ``values``; ``None`` when there is none (integer-only inputs keep the default rule)."""
    dtypes = [d for d in map(float_dtype_of, values) if d is not None]
    return functools.reduce(torch.promote_types, dtypes) if dtypes else None


def _promote(value, dtype: torch.dtype):
    """``value`` in the floating ``dtype`` when it is a real numeric array; otherwise as is
    (strings, objects and complex values are left for :func:`as_tensor` to refuse)."""
    if isinstance(value, torch.Tensor):
        ok = not value.is_complex() and value.dtype != dtype
        return value.to(dtype) if ok else value
    if isinstance(value, (list, tuple, np.ndarray)):
        try:
            arr = np.asarray(value)
        except Exception:  # ragged: as_tensor names the argument
            return value
        if arr.dtype.kind in "biuf" and arr.size and arr.dtype != object:
            if isinstance(value, np.ndarray) and float_dtype_of(value) == dtype:
                return value
            return torch.as_tensor(arr).to(dtype)
    return value


def promote_floats(*values):
    """The float array arguments of a public function in one dtype: PyTorch's promotion of
    theirs (:func:`promoted_dtype`). Returns ``values``, converted.

    A float32 and a float64 argument both become float64, whichever comes first; integer,
    bool and list arguments take the floating partners' dtype instead of the default dtype
    (so an ``int`` tensor or a Python list never downcasts a float64 partner). Without a
    floating array among them nothing changes (:func:`as_tensor` turns integers into the
    default dtype). ``None`` (an absent optional argument) passes through. Call it first,
    ``x_query, x, y = promote_floats(x_query, x, y)``, then validate as usual.
    """
    dtype = promoted_dtype(*values)
    if dtype is None:
        return values
    return tuple(None if v is None else _promote(v, dtype) for v in values)


def as_tensor(
    value,
    name: str,
    *,
    like: Optional[torch.Tensor] = None,
    ndim: Optional[Sequence[int]] = None,
    allow_empty: bool = False,
    finite: bool = True,
) -> torch.Tensor:
    """Turn ``value`` into a floating tensor (on ``like``'s device/dtype when given) and check it.

    Raises ``TypeError`` for things that are not numeric arrays and ``ValueError`` for a wrong
    rank, an empty array or non-finite entries.
    """
    if isinstance(value, torch.Tensor):
        t = value
    else:
        if isinstance(value, (str, bytes)) or value is None:
            raise TypeError(
                f"{name} must be an array-like of numbers, got {type(value).__name__}"
            )
        try:
            arr = np.asarray(value)
        except Exception as exc:  # ragged lists and the like
            raise TypeError(f"{name} must be an array-like of numbers: {exc}") from None
        if arr.dtype == object or not (
            np.issubdtype(arr.dtype, np.number) or arr.dtype == bool
        ):
            raise TypeError(
                f"{name} must be an array-like of numbers, got dtype {arr.dtype}"
            )
        t = torch.as_tensor(arr)
    if t.is_complex():
        raise TypeError(f"{name} must be real-valued, got a complex tensor")
    if like is not None:
        t = t.to(
            device=like.device,
            dtype=like.dtype if like.is_floating_point() else _float_dtype(t),
        )
    elif not t.is_floating_point():
        t = t.to(torch.get_default_dtype())
    if ndim is not None and t.ndim not in tuple(ndim):
        raise ValueError(
            f"{name} must have {' or '.join(map(str, ndim))} dimension(s), got shape {tuple(t.shape)}"
        )
    if not allow_empty and t.numel() == 0:
        raise ValueError(
            f"{name} is empty (shape {tuple(t.shape)}); at least one value is needed"
        )
    if finite:
        check_finite(t, name)
    return t


def check_finite(t: torch.Tensor, name: str) -> torch.Tensor:
    """Reject NaN/inf entries of a tensor with a ``ValueError`` naming ``name`` and their count.

    A finite sum proves every entry finite (NaN and ±inf propagate): one cheap reduction settles
    the common case without a full-size boolean temporary. Only a non-finite sum (a bad entry, or
    a sum that overflowed) is followed by an exact count, in row chunks under the memory budget
    of :func:`localbook.chunks.chunk_rows`. Returns ``t``.
    """
    if not t.numel() or math.isfinite(t.detach().sum().item()):
        return t
    with torch.no_grad():
        t2 = t.reshape(t.shape[0], -1) if t.ndim > 1 else t.reshape(-1, 1)
        rows = chunk_rows(
            t2.shape[0], t2.shape[1], 1, t2.element_size(), None, t2.device
        )
        bad = sum(
            int((~torch.isfinite(t2[sl])).sum())
            for sl in iter_chunks(t2.shape[0], rows)
        )
    if bad:
        raise ValueError(f"{name} contains {bad} NaN or infinite value(s)")
    return t


def warn_empty(
    n_empty: int,
    n_total: Optional[int],
    why: str,
    *,
    what: str = "queries",
    result: str = "their estimates are NaN",
    hint: str = "",
    stacklevel: int = 2,
) -> None:
    """The one warning for empty neighbourhoods: "``n_empty`` of ``n_total`` ``what`` ``why``;
    ``result``" (without "of ``n_total``" when it is None). Does nothing when ``n_empty`` is 0.
    ``stacklevel`` is the one the caller would give :func:`warnings.warn` (2: its caller)."""
    if n_empty:
        count = f"{n_empty}" if n_total is None else f"{n_empty} of {n_total}"
        msg = f"{count} {what} {why}; {result}"
        warnings.warn(
            msg + (f" ({hint})" if hint else ""), UserWarning, stacklevel=stacklevel + 1
        )


def check_points(
    x, name: str = "x", *, like: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Points as an ``(n, d)`` tensor; a 1-D input means ``d = 1``."""
    t = as_tensor(x, name, like=like, ndim=(1, 2))
    if t.ndim == 1:
        t = t[:, None]
    if t.shape[0] == 0 or t.shape[1] == 0:
        raise ValueError(
            f"{name} is empty (shape {tuple(t.shape)}); at least one point is needed"
        )
    return t


def check_query(
    x_query, x: torch.Tensor, name: str = "x_query", data_name: str = "x"
) -> torch.Tensor:
    """Query points matching the dimension of the data ``x`` (``(m, d)``); ``data_name`` is
    the data's argument name in the message."""
    q = check_points(x_query, name, like=x)
    if q.shape[1] != x.shape[1]:
        raise ValueError(
            f"{name} has {q.shape[1]} feature(s) per point but {data_name} has "
            f"{x.shape[1]}; they must match"
        )
    return q


def check_targets(
    y, n: int, *, like: torch.Tensor, name: str = "y", data_name: str = "x"
):
    """Targets as ``(n, k)``; returns ``(y2d, squeeze)`` where ``squeeze`` says ``y`` was 1-D."""
    t = as_tensor(y, name, like=like, ndim=(1, 2))
    if t.shape[0] != n:
        raise ValueError(
            f"{name} has {t.shape[0]} rows but {data_name} has {n} points; they must match"
        )
    if t.ndim == 1:
        return t[:, None], True
    return t, False


def check_bandwidth(
    bandwidth, d: int, *, like: torch.Tensor, name: str = "bandwidth"
) -> torch.Tensor:
    """A positive finite bandwidth: a float or a ``(d,)`` vector, returned as a ``(d,)`` tensor."""
    if isinstance(bandwidth, bool):
        raise TypeError(
            f"{name} must be a positive number or a ({d},) array, got a bool"
        )
    if isinstance(bandwidth, numbers.Real):
        if not math.isfinite(bandwidth) or bandwidth <= 0:
            raise ValueError(f"{name} must be positive and finite, got {bandwidth}")
        return torch.full((d,), float(bandwidth), dtype=like.dtype, device=like.device)
    h = as_tensor(bandwidth, name, like=like, ndim=(0, 1), finite=False)
    if h.ndim == 0:
        h = h.expand(d).clone()
    if h.shape[0] != d:
        raise ValueError(
            f"{name} must be a scalar or have one value per dimension ({d}), got shape {tuple(h.shape)}"
        )
    if not bool(torch.isfinite(h).all()) or bool((h <= 0).any()):
        raise ValueError(f"{name} must be positive and finite, got {h.tolist()}")
    return h


def check_bool(value, name: str) -> bool:
    """A flag: ``True`` or ``False`` only (``0``, ``1`` and ``"yes"`` are refused, not guessed)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_positive_int(
    value, name: str, *, minimum: int = 1, maximum: Optional[int] = None
) -> int:
    """An integer ``minimum ≤ value (≤ maximum)``."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral,)):
        if (
            isinstance(value, torch.Tensor)
            and value.numel() == 1
            and not value.is_floating_point()
        ):
            value = int(value)
        else:
            raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        rng = (
            f"between {minimum} and {maximum}"
            if maximum is not None
            else f"at least {minimum}"
        )
        raise ValueError(f"{name} must be {rng}, got {value}")
    return value


def check_positive_float(value, name: str, *, allow_zero: bool = False) -> float:
    """A finite float ``> 0`` (or ``≥ 0`` with ``allow_zero``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = float(value)
        else:
            raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(
            f"{name} must be {'non-negative' if allow_zero else 'positive'} and finite, got {value}"
        )
    return value


def check_fraction(
    value,
    name: str,
    *,
    allow_zero: bool = False,
    allow_one: bool = False,
    meaning: str = "",
) -> float:
    """A number in the unit interval: ``(0, 1)``; ``allow_zero``/``allow_one`` close either end.

    ``meaning`` (e.g. ``" (the spurious fraction d_y/d)"``) is added to the error message.
    """
    value = check_positive_float(value, name, allow_zero=allow_zero)
    if value > 1 or (value == 1 and not allow_one):
        interval = f"{'[' if allow_zero else '('}0, 1{']' if allow_one else ')'}"
        raise ValueError(f"{name} must be in {interval}{meaning}, got {value}")
    return value


def check_positive_ints(values, name: str) -> list:
    """A non-empty sequence of positive integers (sizes, one per view or layer), as a list."""
    if isinstance(values, (numbers.Integral, str, bytes)) or not hasattr(
        values, "__len__"
    ):
        raise TypeError(
            f"{name} must be a sequence of positive integers, got {type(values).__name__}"
        )
    if len(values) == 0:
        raise ValueError(f"{name} must be a non-empty sequence of positive integers")
    return [check_positive_int(v, name) for v in values]


def check_image_shape(image_shape, n_features: Optional[int] = None) -> tuple:
    """``(H, W)`` of flattened images, positive integers; with ``n_features``, ``H·W`` must match it."""
    if image_shape is None:
        raise ValueError(
            "image_shape is needed for the pixel layer: pass (height, width) of the flattened images"
        )
    try:
        hw = tuple(image_shape)
    except TypeError:
        raise TypeError(
            f"image_shape must be a (height, width) pair, got {type(image_shape).__name__}"
        ) from None
    if len(hw) != 2:
        raise ValueError(
            f"image_shape must be a (height, width) pair, got {image_shape!r}"
        )
    H = check_positive_int(hw[0], "image_shape[0]")
    W = check_positive_int(hw[1], "image_shape[1]")
    if n_features is not None and H * W != n_features:
        raise ValueError(
            f"image_shape {H}×{W} = {H * W} pixels does not match X's {n_features} features"
        )
    return H, W


def check_missing_data(
    X, name: str = "X", like: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """An ``(n, d)`` float tensor where NaN marks a missing value; infinities are rejected."""
    t = as_tensor(X, name, like=like, ndim=(2,), finite=False)
    if t.shape[0] == 0 or t.shape[1] == 0:
        raise ValueError(
            f"{name} is empty (shape {tuple(t.shape)}); at least one sample and one feature are needed"
        )
    if bool(torch.isinf(t).any()):
        raise ValueError(
            f"{name} contains {int(torch.isinf(t).sum())} infinite value(s); only NaN may mark a missing value"
        )
    return t


def check_index(i, n: int, name: str = "i") -> int:
    """An index into ``n`` items; negative indices count from the end as in Python."""
    i = check_positive_int(i, name, minimum=-n, maximum=n - 1)
    return i % n


def check_indices(
    value,
    name: str,
    n: Optional[int] = None,
    *,
    device=None,
    ndim: Optional[Sequence[int]] = None,
    what: str = "indices",
) -> torch.Tensor:
    """Integer indices (class ids, token ids, triplets, groups) as a long tensor on ``device``.

    Any integer dtype is accepted (int64/32/16/8, uint8) and cast to long after the checks;
    floats (even whole ones), bools, complex values and strings raise a ``TypeError``. With
    ``n``, every index must lie in ``[0, n)`` (a ``ValueError`` says which values do not).
    """
    if not isinstance(value, torch.Tensor):
        if isinstance(value, (str, bytes)) or value is None:
            raise TypeError(
                f"{name} must be an array of integer {what}, got {type(value).__name__}"
            )
        try:  # [] is float64 in numpy; strings and ragged lists fail here
            arr = np.asarray(value)
            value = torch.as_tensor(arr.astype(np.int64) if arr.size == 0 else arr)
        except Exception as exc:
            raise TypeError(
                f"{name} must be an array of integer {what}: {exc}"
            ) from None
    t = value
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(
            f"{name} must be an array of integer {what}, got dtype {t.dtype}"
        )
    if ndim is not None and t.ndim not in tuple(ndim):
        raise ValueError(
            f"{name} must have {' or '.join(map(str, ndim))} dimension(s), got shape "
            f"{tuple(t.shape)}"
        )
    t = t.to(device=device if device is not None else t.device, dtype=torch.long)
    if n is not None and t.numel():
        lo, hi = torch.aminmax(t)
        if int(lo) < 0 or int(hi) >= n:
            raise ValueError(
                f"{name} holds {what} outside [0, {n - 1}] (from {int(lo)} to {int(hi)})"
            )
    return t


def check_views(
    views, name: str = "views", like: Optional[torch.Tensor] = None
) -> List[torch.Tensor]:
    """A non-empty list of ``(n, d_v)`` arrays describing the same ``n >= 2`` samples, in one
    dtype: ``like``'s, or PyTorch's promotion of the views' (:func:`promoted_dtype`)."""
    if isinstance(views, (torch.Tensor, np.ndarray, str)) or not isinstance(
        views, (list, tuple)
    ):
        raise TypeError(
            f"{name} must be a list of (n, d_v) arrays, one per view, got {type(views).__name__}"
        )
    if len(views) == 0:
        raise ValueError(f"{name} is empty; at least one view is needed")
    dtype = like.dtype if like is not None else promoted_dtype(*views)
    out = []
    for v, x in enumerate(views):
        t = as_tensor(
            x if dtype is None else _promote(x, dtype),
            f"{name}[{v}]",
            like=like if like is not None else (out[0] if out else None),
            ndim=(2,),
        )
        if t.shape[1] == 0:
            raise ValueError(f"{name}[{v}] has no feature (shape {tuple(t.shape)})")
        if out and t.shape[0] != out[0].shape[0]:
            raise ValueError(
                f"{name}[{v}] has {t.shape[0]} rows but {name}[0] has {out[0].shape[0]}; "
                "every view must describe the same samples"
            )
        out.append(t)
    if out[0].shape[0] < 2:
        raise ValueError(
            f"{name} must hold at least 2 samples to build a graph, got {out[0].shape[0]}"
        )
    return out


def check_alpha(alpha, name: str = "alpha", *, negative: bool = False):
    """The α of the Tsallis entropy and the entmax family: a finite float ``> 0`` (α = 1 is
    softmax / Shannon; with ``negative``, any finite α but 0, where the entropy is undefined),
    or a real tensor of them (kept as a tensor: it may be learnable or hold one α per row; a
    one-element tensor without a gradient becomes a float)."""
    rule = (
        "finite and nonzero (the Tsallis entropy is undefined at α = 0)"
        if negative
        else "positive and finite (α > 0)"
    )
    if isinstance(alpha, torch.Tensor):
        if alpha.is_complex() or alpha.dtype == torch.bool:
            raise TypeError(
                f"{name} must be a real number or tensor, got dtype {alpha.dtype}"
            )
        if alpha.numel() == 1 and not alpha.requires_grad:
            alpha = float(alpha)
        else:
            with torch.no_grad():
                low = (alpha == 0) if negative else (alpha <= 0)
                bad = bool((~torch.isfinite(alpha) | low).any())
            if bad:
                raise ValueError(f"{name} must be {rule} everywhere")
            return alpha
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise TypeError(
            f"{name} must be a real number or a tensor, got {type(alpha).__name__}"
        )
    alpha = float(alpha)
    if not math.isfinite(alpha) or alpha == 0 or (alpha < 0 and not negative):
        raise ValueError(f"{name} must be {rule}; α = 1 is softmax; got {alpha}")
    return alpha


def check_choice(value, name: str, choices: Sequence[str]) -> str:
    """One of a fixed set of strings."""
    if not isinstance(value, str):
        raise TypeError(
            f"{name} must be one of {list(choices)}, got {type(value).__name__}"
        )
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; expected one of {list(choices)}")
    return value


def check_labels(
    labels, n: int, *, device=None, name: str = "labels", data_name: str = "x"
):
    """Class labels for ``n`` points: returns ``(classes, codes)``.

    ``classes`` holds the sorted distinct labels (a tensor for numeric labels, a numpy array for
    strings or other objects); ``codes (n,)`` is a long tensor on ``device`` with
    ``classes[codes] == labels``. Float labels must be whole numbers (class ids).
    """
    if isinstance(labels, torch.Tensor):
        if labels.is_floating_point() and not bool((labels == labels.round()).all()):
            raise TypeError(
                f"{name} must be integers or strings (class labels), got non-integer floats"
            )
        if labels.is_complex():
            raise TypeError(
                f"{name} must be integers or strings (class labels), got complex values"
            )
        arr = labels.detach().cpu().numpy()
    else:
        if isinstance(labels, (str, bytes)) or labels is None:
            raise TypeError(
                f"{name} must be an array of class labels, got {type(labels).__name__}"
            )
        arr = np.asarray(labels)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(
            f"{name} must have shape ({n},) to match the {n} points of {data_name}, got "
            f"{tuple(arr.shape)}"
        )
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise TypeError(
                f"{name} must be integers or strings (class labels), got non-integer floats"
            )
        arr = arr.astype(np.int64)
    elif arr.dtype.kind == "c":
        raise TypeError(
            f"{name} must be integers or strings (class labels), got complex values"
        )
    classes, codes = np.unique(arr, return_inverse=True)
    codes = torch.as_tensor(codes.reshape(-1), dtype=torch.long, device=device)
    if classes.dtype.kind in "iub":
        classes = torch.as_tensor(classes.astype(np.int64), device=device)
    return classes, codes


def check_scores(z, dim):
    """Scores ``z`` for the entmax family along ``dim``: ``(z, dim, zmax, dead)``.

    ``zmax`` holds the keepdim row maxima; ``dead`` marks (keepdim) the rows whose entries are all
    ``-inf``, or is ``None`` when there are none.
    """
    z = as_tensor(z, "z", finite=False)
    if z.ndim == 0:
        raise ValueError("z must have at least one dimension, got a 0-d tensor")
    dim = check_index(dim, z.ndim, "dim")
    if z.shape[dim] == 0:
        raise ValueError(f"z is empty along dim={dim} (shape {tuple(z.shape)})")
    zmax = z.detach().amax(dim=dim, keepdim=True)
    dead = None
    if zmax.numel():
        dead_rows = zmax == -math.inf
        bad = torch.stack(
            [torch.isnan(zmax).any(), (zmax == math.inf).any(), dead_rows.any()]
        )
        nan, pinf, anydead = bad.tolist()
        if nan:
            raise ValueError("z contains NaN values")
        if pinf:
            raise ValueError(
                "z contains +inf values (only -inf, for masked entries, is allowed)"
            )
        if anydead:
            dead = dead_rows
            zmax = zmax.masked_fill(dead, 0.0)
    return z, dim, zmax, dead
