"""localbook.fashion_mnist: where the full data are found (explicit folder, system copy, cache,
download), how they are verified (published gzip md5 or decompressed SHA-256), and the IDX decoder.

No network: the URL opener is replaced, and the system folder is pointed at the test's own files
(the real Debian copy is used only by the last test, and only where it is installed).
"""

import gzip
import hashlib
import io
from pathlib import Path

import numpy as np
import pytest

import localbook as lb
from localbook import fashion_mnist as fm


@pytest.fixture(autouse=True)
def _no_system_copy_no_home(monkeypatch, tmp_path):
    """Each test starts with no system copy and an empty home, unless it sets one up."""
    monkeypatch.setattr(fm, "FASHION_MNIST_SYSTEM_DIRS", ())
    monkeypatch.delenv("LOCALBOOK_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


# --- download, verification, cache --------------------------------------------------------
def _idx_bytes(arr: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(
        int(s).to_bytes(4, "big") for s in arr.shape
    )
    return gzip.compress(header + arr.astype(np.uint8).tobytes())


class _FakeOpener:
    def __init__(self, payloads):
        self.payloads, self.calls = payloads, []

    def __call__(self, url, timeout=None):
        self.calls.append(url)
        name = url.rsplit("/", 1)[-1]
        if name not in self.payloads or "//down/" in url:
            raise OSError(f"no route to {url}")
        return io.BytesIO(self.payloads[name])


def _small_split(monkeypatch, tmp_path, n=5):
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (n, 28, 28)).astype(np.uint8)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    payloads = {
        "t10k-images-idx3-ubyte.gz": _idx_bytes(imgs),
        "t10k-labels-idx1-ubyte.gz": _idx_bytes(labels),
    }
    for (
        name,
        data,
    ) in payloads.items():  # the test's own files stand in for the official ones
        monkeypatch.setitem(fm.FASHION_MNIST_MD5, name, hashlib.md5(data).hexdigest())
    opener = _FakeOpener(payloads)
    monkeypatch.setattr(fm, "_urlopen", opener)
    return imgs, labels, opener


def test_download_verify_cache_and_decode(monkeypatch, tmp_path):
    imgs, labels, opener = _small_split(monkeypatch, tmp_path)
    X, y = fm.load_fashion_mnist("test", cache_dir=tmp_path)
    np.testing.assert_array_equal(X, imgs)
    np.testing.assert_array_equal(y, labels)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
    ]
    n_calls = len(opener.calls)
    fm.load_fashion_mnist("test", cache_dir=tmp_path)  # cached: no new download
    assert len(opener.calls) == n_calls


def test_checksum_failure_raises_and_leaves_no_partial_file(monkeypatch, tmp_path):
    imgs, labels, opener = _small_split(monkeypatch, tmp_path)
    # restore the published checksum: the fake file no longer matches it
    monkeypatch.setitem(
        fm.FASHION_MNIST_MD5,
        "t10k-images-idx3-ubyte.gz",
        "bef4ecab320f06d8554ea6380940ec79",
    )
    with pytest.raises(
        RuntimeError, match="checksum mismatch for t10k-images-idx3-ubyte.gz"
    ):
        fm.fetch_fashion_mnist_file("t10k-images-idx3-ubyte.gz", tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.faults
def test_corrupt_cache_is_replaced_and_network_errors_try_next_mirror(
    monkeypatch, tmp_path
):
    imgs, labels, opener = _small_split(monkeypatch, tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(b"garbage")
    with pytest.warns(
        RuntimeWarning, match="moved to t10k-labels-idx1-ubyte.gz.corrupt"
    ):
        path = fm.fetch_fashion_mnist_file(
            "t10k-labels-idx1-ubyte.gz",
            tmp_path,
            mirrors=("http://down/", "http://ok/x/"),
        )
    np.testing.assert_array_equal(fm.read_idx(path), labels)
    # the corrupt copy is kept for inspection, never deleted
    assert (tmp_path / "t10k-labels-idx1-ubyte.gz.corrupt").read_bytes() == b"garbage"
    opener.payloads.clear()
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(OSError, match="any mirror"):
        fm.fetch_fashion_mnist_file("t10k-labels-idx1-ubyte.gz", tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["t10k-labels-idx1-ubyte.gz.corrupt"]


@pytest.mark.faults
def test_a_corrupt_gzip_stream_is_a_clear_error_or_a_skipped_copy(
    monkeypatch, tmp_path
):
    imgs, labels, opener = _small_split(monkeypatch, tmp_path)
    name = "t10k-images-idx3-ubyte.gz"
    good = opener.payloads[name]
    damaged = good[:20] + bytes(b ^ 0x55 for b in good[20:60]) + good[60:]
    bad = tmp_path / "damaged.gz"
    bad.write_bytes(damaged)
    with pytest.raises(ValueError, match="not a valid gzip file"):
        fm.read_idx(bad)  # was a raw zlib.error
    monkeypatch.setitem(fm.FASHION_MNIST_SHA256, name, _sha256_content(good))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / name).write_bytes(damaged)
    with pytest.warns(RuntimeWarning, match="corrupt"):
        assert fm.find_fashion_mnist_file(name, mine) is None
    assert (mine / (name + ".corrupt")).exists() and not (mine / name).exists()


@pytest.mark.faults
def test_a_read_only_data_folder_with_a_corrupt_copy_falls_through_to_the_system_copy(
    monkeypatch, tmp_path
):
    imgs, labels, opener = _small_split(monkeypatch, tmp_path)
    name = "t10k-images-idx3-ubyte.gz"
    mine = tmp_path / "data" / "fashion-mnist"
    mine.mkdir(parents=True)
    (mine / name).write_bytes(b"garbage")
    system = tmp_path / "system"
    system.mkdir()
    (system / name).write_bytes(opener.payloads[name])
    monkeypatch.setattr(fm, "FASHION_MNIST_SYSTEM_DIRS", (system,))
    monkeypatch.setenv("LOCALBOOK_DATA", str(tmp_path / "data"))

    def read_only(src, dst):  # EROFS: tests run as root, where chmod does not bind
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(fm.os, "replace", read_only)
    with pytest.warns(RuntimeWarning, match="could not be moved aside"):
        found = fm.find_fashion_mnist_file(name)
    assert found == system / name
    assert (mine / name).read_bytes() == b"garbage"  # left as it was
    assert opener.calls == []


@pytest.mark.faults
def test_a_wrong_file_from_one_mirror_tries_the_next(monkeypatch, tmp_path):
    imgs, labels, opener = _small_split(monkeypatch, tmp_path)
    name = "t10k-labels-idx1-ubyte.gz"
    good = opener.payloads[name]

    def opener_wrong_first(url, timeout=None):
        opener.calls.append(url)
        return io.BytesIO(b"not the file" if "//first/" in url else good)

    monkeypatch.setattr(fm, "_urlopen", opener_wrong_first)
    path = fm.fetch_fashion_mnist_file(
        name, tmp_path, mirrors=("http://first/", "http://second/")
    )
    np.testing.assert_array_equal(fm.read_idx(path), labels)
    assert opener.calls == ["http://first/" + name, "http://second/" + name]
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


@pytest.mark.faults
def test_the_whole_download_has_a_deadline(monkeypatch, tmp_path):
    imgs, labels, opener = _small_split(monkeypatch, tmp_path)
    clock = iter(range(0, 10_000, 100))  # every reading of the clock: 100 s later
    monkeypatch.setattr(fm.time, "monotonic", lambda: next(clock))
    with pytest.raises(OSError, match="deadline"):
        fm.fetch_fashion_mnist_file(
            "t10k-labels-idx1-ubyte.gz",
            tmp_path,
            mirrors=("http://a/", "http://b/", "http://c/"),
            deadline=150.0,
        )
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="deadline"):
        fm.fetch_fashion_mnist_file("t10k-labels-idx1-ubyte.gz", tmp_path, deadline=0)


@pytest.mark.faults
def test_make_fashion_views_does_not_download_when_told(monkeypatch, tmp_path):
    opener = _FakeOpener({})
    monkeypatch.setattr(fm, "_urlopen", opener)
    with pytest.raises(FileNotFoundError, match="download=False"):
        lb.datasets.make_fashion_views(n_per_class=2, download=False)
    assert opener.calls == []


def test_no_download_when_not_allowed(monkeypatch, tmp_path):
    _small_split(monkeypatch, tmp_path)
    with pytest.raises(FileNotFoundError, match="download=False"):
        fm.load_fashion_mnist("train", cache_dir=tmp_path, download=False)
    with pytest.raises(ValueError, match="split"):
        fm.load_fashion_mnist("validation", cache_dir=tmp_path)


def test_read_idx_rejects_bad_files(tmp_path):
    bad = tmp_path / "bad.gz"
    bad.write_bytes(
        gzip.compress(b"\x00\x00\x0d\x01" + (3).to_bytes(4, "big") + b"abc")
    )
    with pytest.raises(ValueError, match="magic"):
        fm.read_idx(bad)
    short = tmp_path / "short.gz"
    short.write_bytes(
        gzip.compress(b"\x00\x00\x08\x01" + (5).to_bytes(4, "big") + b"abc")
    )
    with pytest.raises(ValueError, match="header announces"):
        fm.read_idx(short)


def _sha256_content(data: bytes) -> str:
    return hashlib.sha256(gzip.decompress(data)).hexdigest()


def test_system_copy_is_found_before_the_cache_and_never_downloaded(
    monkeypatch, tmp_path
):
    imgs, labels, opener = _small_split(monkeypatch, tmp_path)
    system = tmp_path / "system"
    system.mkdir()
    for name, data in opener.payloads.items():
        (system / name).write_bytes(data)
    monkeypatch.setattr(fm, "FASHION_MNIST_SYSTEM_DIRS", (system,))
    X, y = fm.load_fashion_mnist("test", download=False)
    np.testing.assert_array_equal(X, imgs)
    np.testing.assert_array_equal(y, labels)
    assert opener.calls == []
    assert (
        fm.find_fashion_mnist_file("t10k-images-idx3-ubyte.gz")
        == system / "t10k-images-idx3-ubyte.gz"
    )


def test_recompressed_copy_verifies_by_its_decompressed_content(monkeypatch, tmp_path):
    """Debian's gzip bytes differ from the official ones; the data (and so the SHA-256) agree."""
    imgs, labels, opener = _small_split(monkeypatch, tmp_path)
    name = "t10k-images-idx3-ubyte.gz"
    official = opener.payloads[name]
    recompressed = gzip.compress(
        gzip.decompress(official), compresslevel=1, mtime=12345
    )
    assert (
        recompressed != official
        and hashlib.md5(recompressed).hexdigest() != fm.FASHION_MNIST_MD5[name]
    )
    monkeypatch.setitem(fm.FASHION_MNIST_SHA256, name, _sha256_content(official))
    system = tmp_path / "system"
    system.mkdir()
    (system / name).write_bytes(recompressed)
    monkeypatch.setattr(fm, "FASHION_MNIST_SYSTEM_DIRS", (system,))
    np.testing.assert_array_equal(
        fm.read_idx(fm.fetch_fashion_mnist_file(name, download=False)), imgs
    )
    # one changed pixel: neither checksum matches, the system copy is skipped (and left alone)
    raw = bytearray(gzip.decompress(official))
    raw[-1] ^= 1
    (system / name).write_bytes(gzip.compress(bytes(raw)))
    assert fm.find_fashion_mnist_file(name) is None
    assert (system / name).exists()
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        fm.fetch_fashion_mnist_file(name, download=False)


def test_explicit_folder_and_environment_variable_come_first(monkeypatch, tmp_path):
    imgs, labels, opener = _small_split(monkeypatch, tmp_path)
    mine = tmp_path / "mine" / "fashion-mnist"
    mine.mkdir(parents=True)
    for name, data in opener.payloads.items():
        (mine / name).write_bytes(data)
    monkeypatch.setenv("LOCALBOOK_DATA", str(tmp_path / "mine"))
    X, _ = fm.load_fashion_mnist("test", download=False)
    np.testing.assert_array_equal(X, imgs)
    assert (
        fm.find_fashion_mnist_file("t10k-labels-idx1-ubyte.gz")
        == mine / "t10k-labels-idx1-ubyte.gz"
    )
    assert opener.calls == []


def test_the_user_cache_is_used_without_an_explicit_folder(monkeypatch, tmp_path):
    imgs, labels, opener = _small_split(monkeypatch, tmp_path)
    X, _ = fm.load_fashion_mnist(
        "test"
    )  # downloads into ~/.cache/localbook/fashion-mnist
    cache = Path(tmp_path / "home" / ".cache" / "localbook" / "fashion-mnist")
    assert sorted(p.name for p in cache.iterdir()) == sorted(opener.payloads)
    n_calls = len(opener.calls)
    X2, _ = fm.load_fashion_mnist("test", download=False)
    np.testing.assert_array_equal(X2, imgs)
    assert len(opener.calls) == n_calls


@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz").exists(),
    reason="Debian's dataset-fashion-mnist is not installed",
)
def test_the_real_system_copy_matches_the_shipped_subset(monkeypatch):
    monkeypatch.setattr(
        fm, "FASHION_MNIST_SYSTEM_DIRS", (Path("/usr/share/datasets/fashion-mnist"),)
    )
    X, y = fm.load_fashion_mnist("test", download=False)
    assert X.shape == (10000, 28, 28) and y.shape == (10000,)
    sub_x, sub_y = lb.datasets.load_fashion_mnist_subset()
    np.testing.assert_array_equal(X[:200], np.asarray(sub_x).reshape(200, 28, 28))
    np.testing.assert_array_equal(y[:200], np.asarray(sub_y))
    assert np.bincount(y, minlength=10).tolist() == [1000] * 10
