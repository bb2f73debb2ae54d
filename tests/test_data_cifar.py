"""bnlab.data CIFAR reader: format, checksums, restricted unpickling and error messages.

All files are tiny look-alikes written here in the exact "python version" format; nothing is
downloaded.
"""

import os
import pickle
import struct

import numpy as np
import pytest
import torch

from bnlab import data
from bnlab.data import cifar, cifar_download


@pytest.fixture(autouse=True)
def no_env_data_dir(monkeypatch):
    monkeypatch.delenv("BNLAB_DATA", raising=False)


def trusted_batches(directory, layout):
    """The raw (data, labels) of the files we wrote, read with the plain unpickler (our own
    files)."""
    out = {}
    for f in layout.train_files + layout.test_files:
        with open(directory / layout.folder / f, "rb") as fh:
            d = pickle.load(fh, encoding="bytes")
        out[f] = (d[b"data"], np.asarray(d[layout.label_key]))
    return out


def published(monkeypatch, paths):
    """Pretend the files just written are the official release: put their MD5s in the table."""
    for rel, path in paths.items():
        monkeypatch.setitem(cifar.PUBLISHED_MD5, rel, cifar.md5_of(path))


def py2_style_batch(images: np.ndarray, labels) -> bytes:
    """A batch pickled the way the official files are: Python 2 cPickle protocol 2, str keys as
    SHORT_BINSTRING, the array via numpy.core.multiarray._reconstruct with a BINSTRING payload."""
    n = images.shape[0]
    raw = images.tobytes()
    dtype = (b"cnumpy\ndtype\nq\x07U\x02u1K\x00K\x01\x87Rq\x08(K\x03U\x01|NNN"
             b"J\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb")
    return (
        b"\x80\x02}q\x00(U\x04dataq\x01cnumpy.core.multiarray\n_reconstruct\nq\x02cnumpy\nndarray\nq\x03"
        b"K\x00\x85U\x01b\x87Rq\x04(K\x01K" + bytes([n]) + b"M\x00\x0c\x86q\x05" + dtype
        + b"\x89T" + struct.pack("<I", len(raw)) + raw + b"tbU\x06labelsq\x09]q\x0a("
        + b"".join(b"K" + bytes([int(v)]) for v in labels) + b"eu."
    )


# ----------------------------------------------------------------------------- reading the format


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_tiny_folder_loads_with_the_right_layout(tmp_path, name):
    cifar.write_cifar_like(tmp_path, name, n_per_file=4, seed=1)
    layout = cifar.LAYOUTS[name]
    ds = data.load(name, data_dir=tmp_path, verify=False)
    n_train = 4 * len(layout.train_files)
    assert ds.x_train.shape == (n_train, 3, 32, 32) and ds.x_train.dtype == torch.float32
    assert ds.x_test.shape == (4, 3, 32, 32)
    assert ds.y_train.dtype == torch.int64 and ds.num_outputs == layout.num_classes
    assert ds.input_shape == (3, 32, 32) and ds.task == "classification"
    assert ds.meta["classes"][:2] == ["class_0", "class_1"] \
        and len(ds.meta["classes"]) == layout.num_classes

    raw = trusted_batches(tmp_path, layout)
    images = np.concatenate([raw[f][0] for f in layout.train_files])
    labels = np.concatenate([raw[f][1] for f in layout.train_files])
    assert torch.equal(ds.y_train, torch.from_numpy(labels))  # fine labels for CIFAR-100
    assert torch.equal(ds.y_test, torch.from_numpy(raw[layout.test_files[0]][1]))
    # Row layout: 1024 red, 1024 green, 1024 blue values, each plane row-major 32x32.
    mean = torch.tensor(ds.meta["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(ds.meta["std"]).view(1, 3, 1, 1)
    pixels = (ds.x_train * std + mean).round()
    assert float(pixels[1, 2, 0, 5]) == images[1, 2048 + 5]
    assert float(pixels[3, 1, 7, 0]) == images[3, 1024 + 7 * 32]
    assert torch.equal(pixels.to(torch.uint8), torch.from_numpy(images).view(-1, 3, 32, 32))


def test_normalization_uses_per_channel_training_statistics(tmp_path):
    cifar.write_cifar_like(tmp_path, "cifar10", n_per_file=6, seed=2)
    ds = data.load("cifar10", data_dir=tmp_path, verify=False)
    raw = trusted_batches(tmp_path, cifar.LAYOUTS["cifar10"])
    images = np.concatenate([raw[f"data_batch_{i}"][0] for i in range(1, 6)]).reshape(-1, 3, 32, 32)
    for c in range(3):
        assert ds.meta["mean"][c] == pytest.approx(images[:, c].mean(), rel=1e-12)
        assert ds.meta["std"][c] == pytest.approx(images[:, c].std(), rel=1e-12)
    per_channel = ds.x_train.double().transpose(0, 1).reshape(3, -1)
    assert torch.allclose(per_channel.mean(1), torch.zeros(3, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(per_channel.std(1, unbiased=False),
                          torch.ones(3, dtype=torch.float64), atol=1e-5)
    plain = data.load("cifar10", data_dir=tmp_path, verify=False, normalize=False)
    assert float(plain.x_train.min()) >= 0 and float(plain.x_train.max()) <= 1


def test_archive_gives_the_same_tensors_as_the_folder(tmp_path):
    cifar.write_cifar_like(tmp_path / "a", "cifar10", archive=True, folder=False, seed=4)
    cifar.write_cifar_like(tmp_path / "f", "cifar10", archive=False, folder=True, seed=4)
    a = data.load("cifar10", data_dir=tmp_path / "a", verify=False)
    f = data.load("cifar10", data_dir=tmp_path / "f", verify=False)
    assert a.meta["path"].endswith("cifar-10-python.tar.gz") \
        and f.meta["path"].endswith("cifar-10-batches-py")
    for field in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(a, field), getattr(f, field))
    # data_dir may also name the folder or the archive itself.
    direct = data.load("cifar10", data_dir=tmp_path / "a" / "cifar-10-python.tar.gz", verify=False)
    inside = data.load("cifar10", data_dir=tmp_path / "f" / "cifar-10-batches-py", verify=False)
    assert torch.equal(direct.x_train, a.x_train) and torch.equal(inside.x_train, a.x_train)


def test_python2_pickles_of_the_official_files_are_read(tmp_path):
    paths = cifar.write_cifar_like(tmp_path, "cifar10", n_per_file=3, seed=5)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(3, 3072), dtype=np.uint8)
    labels = [7, 0, 9]
    paths["cifar-10-batches-py/data_batch_1"].write_bytes(py2_style_batch(images, labels))
    ds = data.load("cifar10", data_dir=tmp_path, verify=False, normalize=False)
    assert ds.y_train[:3].tolist() == labels
    assert torch.equal((ds.x_train[:3] * 255).round().to(torch.uint8),
                       torch.from_numpy(images).view(3, 3, 32, 32))


def test_env_variable_is_used_when_no_data_dir_is_given(tmp_path, monkeypatch):
    cifar.write_cifar_like(tmp_path, "cifar10", n_per_file=2)
    monkeypatch.setenv("BNLAB_DATA", str(tmp_path))
    assert data.load("cifar10", verify=False).n_train == 10


def test_n_train_and_n_test_keep_the_first_images(tmp_path):
    cifar.write_cifar_like(tmp_path, "cifar10", n_per_file=4)
    full = data.load("cifar10", data_dir=tmp_path, verify=False)
    part = data.load("cifar10", data_dir=tmp_path, verify=False, n_train=6, n_test=0)
    assert torch.equal(part.x_train, full.x_train[:6]) and part.x_test is None
    assert part.meta["mean"] == full.meta["mean"]
    with pytest.raises(ValueError, match="n_train"):
        data.load("cifar10", data_dir=tmp_path, verify=False, n_train=21)


# ----------------------------------------------------------------------------- checksums


def test_unofficial_files_fail_verification_with_a_helpful_message(tmp_path):
    cifar.write_cifar_like(tmp_path, "cifar10")
    with pytest.raises(data.ChecksumError) as info:
        data.load("cifar10", data_dir=tmp_path)
    message = str(info.value)
    assert "data_batch_1" in message and "c99cafc152244af753f735de768cd75f" in message
    assert "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz" in message
    assert "--no-verify" in message and "--download" in message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("archive", [False, True])
def test_published_checksums_pass_and_a_corrupted_byte_fails(tmp_path, monkeypatch, archive):
    paths = cifar.write_cifar_like(tmp_path, "cifar100", archive=archive,
                                   folder=not archive, seed=3)
    published(monkeypatch, paths)
    ds = data.load("cifar100", data_dir=tmp_path)  # verify=True by default
    assert ds.meta["verified"] and ds.n_train == 4

    target = paths["cifar-100-python.tar.gz" if archive else "cifar-100-python/train"]
    blob = bytearray(target.read_bytes())
    blob[len(blob) // 2] ^= 0x01
    target.write_bytes(bytes(blob))
    with pytest.raises(data.ChecksumError, match=r"checksum mismatch for .*" + target.name):
        data.load("cifar100", data_dir=tmp_path)


def test_verification_happens_before_unpickling(tmp_path, monkeypatch):
    paths = cifar.write_cifar_like(tmp_path, "cifar10")
    published(monkeypatch, paths)
    evil = pickle.dumps(Exploit(str(tmp_path / "pwned")), protocol=2)
    paths["cifar-10-batches-py/data_batch_2"].write_bytes(evil)
    loads = []
    real_loads = cifar.restricted_loads

    def recording_loads(blob, *, source):
        loads.append(source)
        return real_loads(blob, source=source)

    monkeypatch.setattr(cifar, "restricted_loads", recording_loads)
    with pytest.raises(data.ChecksumError, match="data_batch_2"):
        data.load("cifar10", data_dir=tmp_path)
    assert any("data_batch_1" in s for s in loads)  # the recorder works
    assert not any("data_batch_2" in s for s in loads)


def test_truncated_file_without_verification_gives_a_clear_error(tmp_path):
    paths = cifar.write_cifar_like(tmp_path, "cifar10")
    target = paths["cifar-10-batches-py/test_batch"]
    target.write_bytes(target.read_bytes()[:500])
    with pytest.raises(data.DataError, match=r"could not read .*test_batch.*corrupt or truncated"):
        data.load("cifar10", data_dir=tmp_path, verify=False)


def test_truncated_archive_gives_a_clear_error(tmp_path):
    paths = cifar.write_cifar_like(tmp_path, "cifar10", archive=True, folder=False)
    target = paths["cifar-10-python.tar.gz"]
    target.write_bytes(target.read_bytes()[:300])
    with pytest.raises(data.DataError, match="corrupt"):
        data.load("cifar10", data_dir=tmp_path, verify=False)


def test_wrong_content_is_rejected_after_unpickling(tmp_path):
    paths = cifar.write_cifar_like(tmp_path, "cifar10")
    bad = {b"data": np.zeros((2, 3072), dtype=np.float32), b"labels": [0, 1]}
    paths["cifar-10-batches-py/data_batch_1"].write_bytes(pickle.dumps(bad, protocol=2))
    with pytest.raises(data.DataError, match="uint8"):
        data.load("cifar10", data_dir=tmp_path, verify=False)
    bad = {b"data": np.zeros((2, 3072), dtype=np.uint8), b"labels": [0, 10]}
    paths["cifar-10-batches-py/data_batch_1"].write_bytes(pickle.dumps(bad, protocol=2))
    with pytest.raises(data.DataError, match=r"\[0, 10\)"):
        data.load("cifar10", data_dir=tmp_path, verify=False)


# ----------------------------------------------------------------------------- restricted unpickler


class Exploit:
    """Unpickling this would run a shell command creating ``marker``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class EvalExploit:
    def __reduce__(self):
        return (eval, ("__import__('os').getcwd()",))


def test_malicious_pickle_is_refused_even_without_verification(tmp_path):
    paths = cifar.write_cifar_like(tmp_path, "cifar10")
    marker = tmp_path / "pwned"
    paths["cifar-10-batches-py/data_batch_3"].write_bytes(
        pickle.dumps({b"data": Exploit(marker)}, protocol=2))
    with pytest.raises(data.UnsafePickleError) as info:
        data.load("cifar10", data_dir=tmp_path, verify=False)
    assert "system" in str(info.value) and "data_batch_3" in str(info.value)
    assert isinstance(info.value, pickle.UnpicklingError)
    assert not marker.exists()
    # The same bytes really are an exploit for the plain unpickler (the test can fail).
    pickle.loads(pickle.dumps(Exploit(marker)))
    assert marker.exists()


@pytest.mark.parametrize("payload", [EvalExploit(), print, {1, 2}, bytearray(b"x"), object()])
def test_restricted_unpickler_admits_no_other_globals(payload):
    blob = pickle.dumps(payload, protocol=2)
    with pytest.raises(data.UnsafePickleError, match="refusing"):
        cifar.restricted_loads(blob)


def test_restricted_unpickler_reads_arrays_and_plain_containers():
    value = {b"data": np.arange(12, dtype=np.uint8).reshape(2, 6), b"labels": [1, 2], b"name": b"x",
             "s": np.int64(3)}
    # protocol 5 (numpy._core.numeric._frombuffer) is not the format: refused
    for protocol in (2, 3, 4):
        got = cifar.restricted_loads(pickle.dumps(value, protocol=protocol))
        assert np.array_equal(got[b"data"], value[b"data"]) and got[b"labels"] == [1, 2] \
            and got["s"] == 3


# ----------------------------------------------------------------------------- not found / download


def test_missing_dataset_says_where_it_looked_and_how_to_get_it(tmp_path):
    with pytest.raises(data.DataNotFoundError) as info:
        data.load("cifar100", data_dir=tmp_path)
    message = str(info.value)
    assert str(tmp_path / "cifar-100-python") in message \
        and str(tmp_path / "cifar-100-python.tar.gz") in message
    assert "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz" in message \
        and "--download" in message
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, ValueError)


def test_incomplete_folder_names_the_missing_file(tmp_path):
    paths = cifar.write_cifar_like(tmp_path, "cifar10")
    paths["cifar-10-batches-py/data_batch_3"].unlink()
    with pytest.raises(data.DataNotFoundError, match="lacks data_batch_3"):
        data.load("cifar10", data_dir=tmp_path, verify=False)


def test_download_fetches_verifies_and_renames(tmp_path, monkeypatch):
    source = tmp_path / "mirror"
    paths = cifar.write_cifar_like(source, "cifar10", archive=True, folder=False, seed=8)
    published(monkeypatch, paths)
    urls = []

    def fake_fetch(url, out, timeout):  # stands in for the network
        urls.append(url)
        out.write(paths["cifar-10-python.tar.gz"].read_bytes())

    monkeypatch.setattr(cifar_download, "_fetch", fake_fetch)
    target = tmp_path / "store"
    ds = data.load("cifar10", data_dir=target, download=True)
    assert urls == ["https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"]
    assert (target / "cifar-10-python.tar.gz").is_file() and ds.n_train == 20
    assert sorted(p.name for p in target.iterdir()) == ["cifar-10-python.tar.gz"]  # no leftovers
    data.load("cifar10", data_dir=target, download=True)
    assert len(urls) == 1  # present files are not fetched again

    # A download that does not match the checksum is discarded, not left under the real name.
    monkeypatch.setitem(cifar.PUBLISHED_MD5, "cifar-10-python.tar.gz", "0" * 32)
    fresh = tmp_path / "fresh"
    with pytest.raises(data.ChecksumError):
        data.load("cifar10", data_dir=fresh, download=True)
    assert list(fresh.iterdir()) == []
