import logging

import numpy as np
import pytest

from advtrain.data import load_splits
from advtrain.data.synthetic import write_image_folder


def _multiset(pairs):
    return sorted((image.tobytes(), int(label)) for image, label in pairs)


def test_train_and_test_trees_read_back_exactly(tmp_path):
    written = write_image_folder(tmp_path, classes=("b", "a", "c"), per_class=2)
    splits = load_splits("folder", path=str(tmp_path))
    assert splits.class_names == ["a", "b", "c"]
    assert splits.image_shape == (12, 10, 3)
    assert (splits.train_size, splits.test_size) == (6, 6)
    for name, ds in (("train", splits.train), ("test", splits.test)):
        got = _multiset(ds.as_numpy_iterator())
        want = _multiset((im, label) for _, label, im in written[name])
        assert got == want


def test_single_tree_grayscale_resized_with_test_fraction(tmp_path):
    write_image_folder(tmp_path, per_class=5, channels=1, size=(9, 7), split_dirs=())
    splits = load_splits(
        "folder", path=str(tmp_path), image_size=(8, 8), test_fraction=0.4
    )
    assert splits.image_shape == (8, 8, 1)
    assert (splits.train_size, splits.test_size) == (6, 4)
    images = [x for x, _ in splits.test.as_numpy_iterator()]
    assert {x.shape for x in images} == {(8, 8, 1)}


def _error(path) -> str:
    with pytest.raises(ValueError) as err:
        load_splits("folder", path=str(path))
    assert "\n" not in str(err.value)
    return str(err.value)


def test_errors_missing_dir_layout_truncated_and_unknown_class(tmp_path):
    assert "image directory not found" in _error(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    assert "expected one folder per class" in _error(tmp_path / "empty")
    write_image_folder(tmp_path / "d")
    bad = tmp_path / "d" / "train" / "dog" / "001.png"
    bad.write_bytes(bad.read_bytes()[:40])
    assert _error(tmp_path / "d") == "train/dog/001.png: truncated PNG: no IEND chunk"
    (tmp_path / "d" / "test" / "cow").mkdir()
    (tmp_path / "d" / "test" / "cow" / "0.png").write_bytes(
        (tmp_path / "d" / "test" / "cat" / "000.png").read_bytes()
    )
    bad.unlink()
    assert _error(tmp_path / "d").startswith(
        "test/cow: class not in the training classes (label out of range)"
    )


def test_skip_counts_bad_files(tmp_path, caplog):
    write_image_folder(tmp_path, per_class=3)
    (tmp_path / "train" / "cat" / "002.png").write_bytes(b"GIF89a nope")
    with caplog.at_level(logging.WARNING):
        splits = load_splits("folder", path=str(tmp_path), on_corrupt="skip")
    assert splits.skipped == 1 and splits.train_size == 5
    assert len(list(splits.train)) == 5
    assert "train/cat/002.png: not a PNG or JPEG image" in caplog.text
    assert np.all([x.shape == (12, 10, 3) for x, _ in splits.train])
