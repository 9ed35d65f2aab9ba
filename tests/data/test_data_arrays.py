from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from advtrain.data import arrays as arrays_module
from advtrain.data import load_splits, make_input


def _images(n, shape=(5, 4, 3), dtype=np.uint8):
    # Row i starts with i, so every row is unique and identifiable.
    x = np.random.default_rng(1).integers(0, 256, (n, *shape)).astype(dtype)
    x.reshape(n, -1)[:, 0] = np.arange(n) % 256
    x.reshape(n, -1)[:, 1] = np.arange(n) // 256
    return x


def _row_ids(images):
    flat = np.asarray(images).reshape(len(images), -1).astype(np.int64)
    return (flat[:, 0] + 256 * flat[:, 1]).astype(int)


def _save_dir(path, n_train=40, n_test=10, classes=4):
    path.mkdir(exist_ok=True)
    x, xt = _images(n_train), _images(n_test)
    y = np.arange(n_train) % classes
    yt = np.arange(n_test) % classes
    for name, a in (
        ("x_train", x),
        ("y_train", y),
        ("x_test", xt),
        ("y_test", yt),
    ):
        np.save(path / f"{name}.npy", a)
    return x, y, xt, yt


def _read(ds):
    images, labels = zip(*ds.as_numpy_iterator(), strict=True)
    return np.stack(images), np.array(labels)


def test_directory_layout_streams_exact_values(tmp_path, monkeypatch):
    x, y, xt, yt = _save_dir(tmp_path / "d")
    # Small chunks: the generator reads several slices per epoch.
    monkeypatch.setattr(arrays_module, "_CHUNK_BYTES", 7 * x[0].nbytes)
    splits = load_splits("arrays", path=str(tmp_path / "d"))
    assert splits.image_shape == (5, 4, 3) and splits.num_classes == 4
    assert (splits.train_size, splits.test_size) == (40, 10)
    images, labels = _read(splits.test)
    np.testing.assert_array_equal(images, xt)  # test keeps file order
    np.testing.assert_array_equal(labels, yt)
    epoch1, labels1 = _read(splits.train)
    epoch2, _ = _read(splits.train)
    ids1, ids2 = _row_ids(epoch1), _row_ids(epoch2)
    assert sorted(ids1) == list(range(40))
    assert list(ids1) != list(ids2)  # a fresh order every epoch
    np.testing.assert_array_equal(epoch1, x[ids1])
    np.testing.assert_array_equal(labels1, y[ids1])
    assert tf.data.experimental.cardinality(splits.train).numpy() == 40


def test_prefix_layout_splits_test_and_validation(tmp_path):
    x = _images(50, shape=(6, 6), dtype=np.float32) / 255.0
    y = np.arange(50) % 5
    np.save(tmp_path / "set_x.npy", x)
    np.save(tmp_path / "set_y.npy", y.reshape(-1, 1))
    splits = load_splits(
        "arrays", path=str(tmp_path / "set"), test_fraction=0.2, val_fraction=0.25
    )
    assert splits.image_shape == (6, 6, 1)
    assert (splits.train_size, splits.val_size, splits.test_size) == (
        30,
        10,
        10,
    )
    seen = []
    for ds in (splits.train, splits.val, splits.test):
        images, labels = _read(ds)
        assert images.dtype == np.float32 and images.shape[1:] == (6, 6, 1)
        ids = _row_ids(np.round(images * 255))
        np.testing.assert_array_equal(labels, y[ids])
        seen.extend(ids)
    assert sorted(seen) == list(range(50))  # disjoint and complete


def test_make_input_batches_the_stream(tmp_path):
    _save_dir(tmp_path / "d")
    splits = load_splits("arrays", path=str(tmp_path / "d"))
    batches = list(
        make_input(splits.train, source="arrays", batch_size=16, training=True)
    )
    assert [b[0].shape[0] for b in batches] == [16, 16]
    assert batches[0][0].dtype == tf.float32


def _error(**options) -> str:
    with pytest.raises(ValueError) as err:
        load_splits("arrays", **options)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_layout_errors(tmp_path):
    assert "arrays directory not found" in _error(path=str(tmp_path / "none" / "p"))
    (tmp_path / "d").mkdir()
    np.save(tmp_path / "d" / "x_train.npy", _images(3))
    assert _error(path=str(tmp_path / "d")).endswith("Missing: y_train.npy")
    np.save(tmp_path / "d" / "y_train.npy", np.arange(4))
    assert "expected 3 labels, one per image in x_train.npy. Received: 4" in _error(
        path=str(tmp_path / "d")
    )


def test_truncated_file_and_skip(tmp_path):
    x, _, _, _ = _save_dir(tmp_path / "d")
    path = tmp_path / "d" / "x_train.npy"
    path.write_bytes(path.read_bytes()[: -x[0].nbytes - 3])
    message = _error(path=str(tmp_path / "d"))
    assert message.startswith(f"{path}: truncated .npy: expected ")
    splits = load_splits("arrays", path=str(tmp_path / "d"), on_corrupt="skip")
    assert splits.skipped == 2 and splits.train_size == 38
    images, _ = _read(splits.train)
    assert sorted(_row_ids(images)) == list(range(38))


def test_label_out_of_range(tmp_path):
    _, _, _, yt = _save_dir(tmp_path / "d")
    yt[6] = 4  # train labels are 0..3
    np.save(tmp_path / "d" / "y_test.npy", yt)
    assert _error(path=str(tmp_path / "d")) == (
        f"{tmp_path / 'd' / 'y_test.npy'} index 6: label out of range: "
        "expected 0..3 (classes seen in y_train.npy). Received: 4"
    )
    splits = load_splits("arrays", path=str(tmp_path / "d"), on_corrupt="skip")
    assert splits.skipped == 1 and splits.test_size == 9


def test_reads_copy_rows_without_mapping_the_file(tmp_path, monkeypatch):
    x, _, _, _ = _save_dir(tmp_path / "d", n_train=64)
    path = tmp_path / "d" / "x_train.npy"
    opened = []
    real_load = np.load

    def counting_load(*args, **kwargs):
        assert kwargs.get("mmap_mode") == "r"  # never read whole
        opened.append(args[0])
        return real_load(*args, **kwargs)

    monkeypatch.setattr(arrays_module.np, "load", counting_load)
    rows = arrays_module._Rows(path, partial=False)
    for index in (np.arange(0, 64, 8), np.array([3, 4, 5, 9, 10, 63])):
        np.testing.assert_array_equal(rows.read(index), x[index])
        # No map of the file: its page-cache pages never count toward
        # this process's resident memory.
        maps = Path("/proc/self/maps")
        if maps.exists():
            assert str(path) not in maps.read_text()
    assert len(opened) == 1


def test_epoch_orders_replay_in_a_new_pipeline(tmp_path):
    # A resumed run builds its stream anew and skips the epochs already
    # trained: it must then see the order an uninterrupted run sees.
    _save_dir(tmp_path, n_train=60)
    splits = load_splits("arrays", path=str(tmp_path), seed=3)
    n = splits.train_size

    def epochs(count, skip_epochs=0):
        ds = splits.fresh_train().repeat().skip(skip_epochs * n).batch(n)
        return [_row_ids(x) for x, _ in ds.take(count).as_numpy_iterator()]

    first = epochs(3)
    assert all(sorted(e) == sorted(first[0]) for e in first)
    assert not np.array_equal(first[0], first[1])  # reshuffled each epoch
    assert not np.array_equal(first[1], first[2])
    again = epochs(3)  # another pipeline in the same process
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    resumed = epochs(1, skip_epochs=2)
    np.testing.assert_array_equal(resumed[0], first[2])
