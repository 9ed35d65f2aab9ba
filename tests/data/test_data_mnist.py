import gzip
import logging

import numpy as np
import pytest

from advtrain.data import load_splits
from advtrain.data.mnist import read_idx
from advtrain.data.synthetic import write_idx, write_mnist


def _options(path, **kw):
    return dict(path=str(path), **kw)


@pytest.mark.parametrize("gz", [True, False])
def test_reads_idx_pixels_and_labels_exactly(tmp_path, gz):
    written = write_mnist(tmp_path, n_train=12, n_test=7, gz=gz)
    splits = load_splits("mnist", **_options(tmp_path))
    assert splits.image_shape == (28, 28, 1) and splits.num_classes == 10
    for name, ds in (("train", splits.train), ("test", splits.test)):
        x, y = written[name]
        images, labels = zip(*ds.as_numpy_iterator(), strict=True)
        np.testing.assert_array_equal(np.stack(images), x[..., None])
        np.testing.assert_array_equal(labels, y)
        assert images[0].dtype == np.uint8


def test_read_idx_hand_written_header(tmp_path):
    header = bytes([0, 0, 0x08, 2]) + (2).to_bytes(4, "big") + (3).to_bytes(4, "big")
    (tmp_path / "a").write_bytes(header + bytes(range(6)))
    np.testing.assert_array_equal(read_idx(tmp_path / "a"), [[0, 1, 2], [3, 4, 5]])


def _one_line_error(options) -> str:
    with pytest.raises(ValueError) as err:
        load_splits("mnist", **options)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_missing_directory_and_file(tmp_path):
    assert "MNIST directory not found" in _one_line_error(_options(tmp_path / "x"))
    write_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    assert _one_line_error(_options(tmp_path)) == (
        f"{tmp_path}: expected t10k-labels-idx1-ubyte or "
        "t10k-labels-idx1-ubyte.gz (MNIST IDX files)."
    )


def test_truncated_gzip_and_plain_files(tmp_path):
    write_mnist(tmp_path, gz=True)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-40])
    message = _one_line_error(_options(tmp_path))
    assert message.startswith(f"{path}: truncated IDX: expected 20 records")
    plain = tmp_path / "plain"
    write_mnist(plain, gz=False)
    path = plain / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    assert "file ends early. Received: 9" in _one_line_error(_options(plain))


def test_not_idx(tmp_path):
    write_mnist(tmp_path, gz=False)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(b"hello")
    assert "not an IDX file" in _one_line_error(_options(tmp_path))


def test_label_out_of_range_and_skip(tmp_path, caplog):
    written = write_mnist(tmp_path, n_train=10, gz=True)
    y = written["train"][1].copy()
    y[3] = 12
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", y)
    assert _one_line_error(_options(tmp_path)) == (
        f"{tmp_path / 'train-labels-idx1-ubyte.gz'} index 3: label out of "
        "range: expected 0..9. Received: 12"
    )
    # Truncate the test images too: skip keeps the complete records.
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    data = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(data[: -28 * 28 - 5])[:-8])
    with caplog.at_level(logging.WARNING):
        splits = load_splits("mnist", **_options(tmp_path, on_corrupt="skip"))
    assert splits.skipped == 1 + 2
    assert (splits.train_size, splits.test_size) == (9, 8)
    x_train = np.stack([x for x, _ in splits.train.as_numpy_iterator()])
    keep = np.arange(10) != 3
    np.testing.assert_array_equal(x_train[..., 0], written["train"][0][keep])
    assert "skipped" in caplog.text
