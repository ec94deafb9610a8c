"""The full Fashion-MNIST (Xiao, Rasul & Vollgraf 2017): found on disk, downloaded only when asked.

:func:`load_fashion_mnist` looks for the official IDX files in this order:

1. an explicit ``cache_dir`` (or ``$LOCALBOOK_DATA/fashion-mnist``);
2. the system copy, ``/usr/share/datasets/fashion-mnist`` (Debian's ``dataset-fashion-mnist``,
   which ``make book`` / ``make test`` install where ``apt-get`` exists);
3. the user cache ``~/.cache/localbook/fashion-mnist``;
4. only if ``download=True``: the official download, into the folder of step 1 or 3.

Every file is verified before it is used. Debian recompresses the files, so their gzip bytes differ
from Zalando's while the data are the same; a file is therefore accepted when its gzip md5 is the
published one (:data:`FASHION_MNIST_MD5`) *or* the SHA-256 of its decompressed bytes is
:data:`FASHION_MNIST_SHA256` (computed from the decompressed official data). A download is written
to a temporary file, verified, and only then renamed: a failed or corrupt download leaves nothing.
Nothing here touches the network at import time. The book's offline fallback is the 200 shipped
test images (:func:`localbook.datasets.load_fashion_mnist_subset`), equal to test images 0-199.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import time
import urllib.request
import warnings
import zlib
from pathlib import Path
from typing import Sequence, Tuple

import numpy as np

from ._validate import check_choice, check_positive_float

__all__ = [
    "FASHION_MNIST_MD5",
    "FASHION_MNIST_SHA256",
    "FASHION_MNIST_MIRRORS",
    "FASHION_MNIST_SYSTEM_DIRS",
    "fashion_mnist_dir",
    "find_fashion_mnist_file",
    "fetch_fashion_mnist_file",
    "read_idx",
    "load_fashion_mnist",
]

#: md5 checksums published by Zalando Research (github.com/zalandoresearch/fashion-mnist, README).
FASHION_MNIST_MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}

#: SHA-256 of the *decompressed* official files (the IDX bytes), so that a recompressed copy with
#: the same content (Debian's) verifies too. Computed from the decompressed data; the shipped 200
#: test images equal test images 0-199 of it byte for byte.
FASHION_MNIST_SHA256 = {
    "train-images-idx3-ubyte.gz": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    "train-labels-idx1-ubyte.gz": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    "t10k-images-idx3-ubyte.gz": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    "t10k-labels-idx1-ubyte.gz": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
}

#: Read-only system copies, searched after an explicit folder (Debian: ``dataset-fashion-mnist``).
FASHION_MNIST_SYSTEM_DIRS = (Path("/usr/share/datasets/fashion-mnist"),)

#: Official locations, tried in order (the project's download site, then its GitHub repository).
FASHION_MNIST_MIRRORS = (
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
)

_SPLITS = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}

# the URL opener; tests replace it (no network in tests)
_urlopen = urllib.request.urlopen


def fashion_mnist_dir(cache_dir=None) -> Path:
    """The cache folder: ``cache_dir``, else ``$LOCALBOOK_DATA/fashion-mnist``, else
    ``~/.cache/localbook/fashion-mnist``."""
    if cache_dir is not None:
        return Path(cache_dir)
    root = os.environ.get("LOCALBOOK_DATA")
    return (
        Path(root) / "fashion-mnist"
        if root
        else Path.home() / ".cache" / "localbook" / "fashion-mnist"
    )


def _md5_file(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _content_sha256(path: Path) -> str:
    """SHA-256 of the decompressed bytes (of the raw bytes when the file is not gzipped)."""
    h = hashlib.sha256()
    with open(path, "rb") as raw:
        gzipped = raw.read(2) == b"\x1f\x8b"
    opener = gzip.open if gzipped else open
    try:
        with opener(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except (OSError, EOFError, zlib.error):  # a truncated or corrupt gzip stream
        return ""
    return h.hexdigest()


def _verified(path: Path, name: str) -> bool:
    """True when ``path`` holds the official ``name``: published gzip md5 or content SHA-256."""
    if _md5_file(path) == FASHION_MNIST_MD5[name]:
        return True
    expected = FASHION_MNIST_SHA256.get(name)
    return expected is not None and _content_sha256(path) == expected


def _move_aside(path: Path) -> None:
    """Keep a corrupt copy for inspection, out of the way: ``name.corrupt`` (one warning).

    A read-only folder cannot be changed: the copy is skipped, and the warning says so."""
    aside = path.with_name(path.name + ".corrupt")
    try:
        os.replace(path, aside)
    except OSError as exc:
        warnings.warn(
            f"{path} is corrupt (its checksum matches no official file) and could not be "
            f"moved aside ({exc.strerror or exc}); it is skipped",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    warnings.warn(
        f"{path} is corrupt (its checksum matches no official file); it was moved to "
        f"{aside.name} and the next source is tried",
        RuntimeWarning,
        stacklevel=3,
    )


def find_fashion_mnist_file(name: str, cache_dir=None):
    """The first verified copy of ``name`` on disk, or ``None`` (search order: module docstring).

    A corrupt copy in a writable folder is renamed ``name.corrupt`` with a warning (never
    deleted); in a read-only folder, or the system copy, it is skipped (with a warning outside
    the system folder). Either way the next folder is tried.
    """
    name = check_choice(name, "name", list(FASHION_MNIST_MD5))
    explicit = cache_dir is not None or bool(os.environ.get("LOCALBOOK_DATA"))
    user_cache = Path.home() / ".cache" / "localbook" / "fashion-mnist"
    folders = ([fashion_mnist_dir(cache_dir)] if explicit else []) + list(
        FASHION_MNIST_SYSTEM_DIRS
    )
    folders += [] if explicit else [user_cache]
    for folder in folders:
        path = Path(folder) / name
        try:
            if not path.is_file():
                continue
            if _verified(path, name):
                return path
        except OSError as exc:  # unreadable: say so, and try the next folder
            warnings.warn(
                f"{path} cannot be read ({exc}); it is skipped",
                RuntimeWarning,
                stacklevel=2,
            )
            continue
        if Path(folder) not in map(Path, FASHION_MNIST_SYSTEM_DIRS):
            _move_aside(path)
    return None


def fetch_fashion_mnist_file(
    name: str,
    cache_dir=None,
    *,
    download: bool = True,
    mirrors: Sequence[str] = FASHION_MNIST_MIRRORS,
    timeout: float = 60.0,
    deadline: float = 900.0,
) -> Path:
    """Path of a verified official file ``name``: found on disk, else downloaded (if allowed).

    Copies on disk are searched as :func:`find_fashion_mnist_file` does and verified (published
    gzip md5 or decompressed SHA-256); a corrupt one is moved aside and the next source tried.
    A download goes to a temporary file in the cache folder, is verified, and is renamed into
    place only when it verifies; otherwise the temporary file is deleted and the next mirror is
    tried. ``timeout`` (seconds) bounds each network operation, ``deadline`` (seconds) the whole
    download over every mirror. When no mirror delivers, a ``RuntimeError`` gives the checksums
    received (if any mirror served a wrong file), else an ``OSError`` lists the mirrors' errors.
    """
    name = check_choice(name, "name", list(FASHION_MNIST_MD5))
    expected = FASHION_MNIST_MD5[name]
    found = find_fashion_mnist_file(name, cache_dir)
    if found is not None:
        return found
    folder = fashion_mnist_dir(cache_dir)
    final = folder / name
    if not download:
        searched = [str(folder)] + [str(d) for d in FASHION_MNIST_SYSTEM_DIRS]
        raise FileNotFoundError(
            f"{name} was not found (searched {', '.join(searched)}) and download=False; install "
            "Debian's dataset-fashion-mnist, copy the official file there, or call with download=True"
        )
    deadline = check_positive_float(deadline, "deadline")
    folder.mkdir(parents=True, exist_ok=True)
    errors, mismatches = [], []
    stop_at = time.monotonic() + deadline
    for base in mirrors:
        url = base + name
        if time.monotonic() > stop_at:
            errors.append(f"{url}: not tried, the {deadline:g} s deadline had passed")
            continue
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=folder)
        try:
            h = hashlib.md5()
            with os.fdopen(fd, "wb") as out:
                with _urlopen(url, timeout=timeout) as response:
                    for block in iter(lambda: response.read(1 << 20), b""):
                        h.update(block)
                        out.write(block)
                        if time.monotonic() > stop_at:
                            raise TimeoutError(f"the {deadline:g} s deadline passed")
            got = h.hexdigest()
            if got != expected and _content_sha256(
                Path(tmp)
            ) != FASHION_MNIST_SHA256.get(name):
                mismatches.append(f"{url}: md5 {got}")
                continue
            os.replace(tmp, final)
            return final
        except OSError as exc:  # network trouble (TimeoutError included): next mirror
            errors.append(f"{url}: {exc}")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    if mismatches:
        raise RuntimeError(
            f"checksum mismatch for {name}: expected md5 {expected} (the published value), "
            "received "
            + "; ".join(mismatches)
            + " (every download was discarded)"
            + ("; other mirrors failed: " + "; ".join(errors) if errors else "")
        )
    raise OSError(
        f"could not download {name} from any mirror:\n  " + "\n  ".join(errors)
    )


def read_idx(path) -> np.ndarray:
    """Decode a (gzipped) IDX file: unsigned-byte data with its big-endian shape header.

    Checks the magic number (``0x0000 08 ndim``) and that the payload has exactly the size the
    header announces; returns a ``uint8`` array of that shape.
    """
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise ValueError(f"{path.name} is not a valid gzip file ({exc})") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(
            f"{path.name} is not an unsigned-byte IDX file (bad magic number {raw[:4].hex()})"
        )
    ndim = raw[3]
    if ndim < 1 or len(raw) < 4 + 4 * ndim:
        raise ValueError(f"{path.name} has a truncated IDX header")
    shape = tuple(
        int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)
    )
    payload = raw[4 + 4 * ndim :]
    if len(payload) != int(np.prod(shape)):
        raise ValueError(
            f"{path.name}: header announces shape {shape} ({int(np.prod(shape))} bytes) "
            f"but the file holds {len(payload)} bytes"
        )
    return np.frombuffer(payload, dtype=np.uint8).reshape(shape).copy()


def load_fashion_mnist(
    split: str = "train", cache_dir=None, *, download: bool = True
) -> Tuple[np.ndarray, np.ndarray]:
    """The full Fashion-MNIST ``split`` (``"train"``: 60,000 images, ``"test"``: 10,000).

    Uses a verified copy on disk (explicit folder, the system copy, the user cache) and downloads
    the official files only when none is found and ``download`` is true. Returns ``images`` uint8 ``(n, 28, 28)`` and ``labels`` uint8
    ``(n,)``. Class names: :data:`localbook.datasets.FASHION_MNIST_CLASSES`.
    """
    split = check_choice(split, "split", list(_SPLITS))
    img_name, lab_name = _SPLITS[split]
    images = read_idx(fetch_fashion_mnist_file(img_name, cache_dir, download=download))
    labels = read_idx(fetch_fashion_mnist_file(lab_name, cache_dir, download=download))
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"Fashion-MNIST {split}: images {images.shape} and labels {labels.shape} do not match"
        )
    return images, labels
