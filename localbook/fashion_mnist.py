"""The full Fashion-MNIST (Xiao, Rasul & Vollgraf 2017), downloaded only when asked.

The book builds offline from the 200 shipped test images (:func:`localbook.datasets.load_fashion_mnist_subset`).
Where the full data set is wanted, :func:`load_fashion_mnist` fetches the official gzipped IDX
files (Zalando Research, MIT license), checks each against its published md5, caches it, and
decodes it. A download is written to a temporary file in the cache folder, verified, and only
then renamed to its final name: a failed or corrupt download leaves no partial file behind.
Nothing here touches the network at import time.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import urllib.request
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np

from ._validate import check_choice

__all__ = ["FASHION_MNIST_MD5", "FASHION_MNIST_MIRRORS", "fashion_mnist_dir", "fetch_fashion_mnist_file",
           "read_idx", "load_fashion_mnist"]

#: md5 checksums published by Zalando Research (github.com/zalandoresearch/fashion-mnist, README).
FASHION_MNIST_MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}

#: Official locations, tried in order (the project's download site, then its GitHub repository).
FASHION_MNIST_MIRRORS = (
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
)

_SPLITS = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
           "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}

# the URL opener; tests replace it (no network in tests)
_urlopen = urllib.request.urlopen


def fashion_mnist_dir(cache_dir=None) -> Path:
    """The cache folder: ``cache_dir``, else ``$LOCALBOOK_DATA/fashion-mnist``, else
    ``~/.cache/localbook/fashion-mnist``."""
    if cache_dir is not None:
        return Path(cache_dir)
    root = os.environ.get("LOCALBOOK_DATA")
    return Path(root) / "fashion-mnist" if root else Path.home() / ".cache" / "localbook" / "fashion-mnist"


def _md5_file(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_fashion_mnist_file(name: str, cache_dir=None, *, download: bool = True,
                             mirrors: Sequence[str] = FASHION_MNIST_MIRRORS, timeout: float = 60.0) -> Path:
    """Path of the verified, cached official file ``name`` (downloading it if needed and allowed).

    A cached file is re-verified against :data:`FASHION_MNIST_MD5`; a corrupt one is removed and
    fetched again. A download goes to a temporary file in the cache folder, is verified, and is
    renamed into place only when its md5 matches; otherwise the temporary file is deleted and a
    ``RuntimeError`` gives the expected and the received checksum. Network errors move on to the
    next mirror; when every mirror fails an ``OSError`` lists them.
    """
    name = check_choice(name, "name", list(FASHION_MNIST_MD5))
    expected = FASHION_MNIST_MD5[name]
    folder = fashion_mnist_dir(cache_dir)
    final = folder / name
    if final.exists():
        if _md5_file(final) == expected:
            return final
        final.unlink()  # corrupt cache: fetch again
    if not download:
        raise FileNotFoundError(f"{final} is not cached and download=False; call with download=True "
                                "(needs a network) or copy the official file there")
    folder.mkdir(parents=True, exist_ok=True)
    errors = []
    for base in mirrors:
        url = base + name
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=folder)
        try:
            h = hashlib.md5()
            with os.fdopen(fd, "wb") as out:
                with _urlopen(url, timeout=timeout) as response:
                    for block in iter(lambda: response.read(1 << 20), b""):
                        h.update(block)
                        out.write(block)
            got = h.hexdigest()
            if got != expected:
                raise RuntimeError(f"checksum mismatch for {name} from {url}: md5 {got}, expected {expected} "
                                   "(the published value); the download was discarded")
            os.replace(tmp, final)
            return final
        except OSError as exc:  # network trouble: try the next mirror
            errors.append(f"{url}: {exc}")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise OSError(f"could not download {name} from any mirror:\n  " + "\n  ".join(errors))


def read_idx(path) -> np.ndarray:
    """Decode a (gzipped) IDX file: unsigned-byte data with its big-endian shape header.

    Checks the magic number (``0x0000 08 ndim``) and that the payload has exactly the size the
    header announces; returns a ``uint8`` array of that shape.
    """
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path.name} is not an unsigned-byte IDX file (bad magic number {raw[:4].hex()})")
    ndim = raw[3]
    if ndim < 1 or len(raw) < 4 + 4 * ndim:
        raise ValueError(f"{path.name} has a truncated IDX header")
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    payload = raw[4 + 4 * ndim:]
    if len(payload) != int(np.prod(shape)):
        raise ValueError(f"{path.name}: header announces shape {shape} ({int(np.prod(shape))} bytes) "
                         f"but the file holds {len(payload)} bytes")
    return np.frombuffer(payload, dtype=np.uint8).reshape(shape).copy()


def load_fashion_mnist(split: str = "train", cache_dir=None, *, download: bool = True) -> Tuple[np.ndarray, np.ndarray]:
    """The full Fashion-MNIST ``split`` (``"train"``: 60,000 images, ``"test"``: 10,000).

    Downloads the official files only when they are not cached (and ``download`` is true),
    verifying their published md5. Returns ``images`` uint8 ``(n, 28, 28)`` and ``labels`` uint8
    ``(n,)``. Class names: :data:`localbook.datasets.FASHION_MNIST_CLASSES`.
    """
    split = check_choice(split, "split", list(_SPLITS))
    img_name, lab_name = _SPLITS[split]
    images = read_idx(fetch_fashion_mnist_file(img_name, cache_dir, download=download))
    labels = read_idx(fetch_fashion_mnist_file(lab_name, cache_dir, download=download))
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise ValueError(f"Fashion-MNIST {split}: images {images.shape} and labels {labels.shape} do not match")
    return images, labels
