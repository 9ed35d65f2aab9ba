"""Up-front path checks: plain ValueError / FileNotFoundError, one line."""

import pytest

from advtrain.utils.io import (
    check_data_paths,
    check_keras_file,
    check_readable_file,
    check_writable_dir,
)


def test_missing_data_path_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="^path .*no-mnist: not found"):
        check_data_paths(source="mnist", path=tmp_path / "no-mnist")
    with pytest.raises(FileNotFoundError, match="arrays: a folder with x_train"):
        check_data_paths(source="arrays", path=tmp_path / "p")
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="is a file, expected a folder"):
        check_data_paths(source="folder", path=tmp_path / "f")
    check_data_paths(source="digits", path=tmp_path / "ignored")


def test_cache_and_tfds_dirs_must_be_writable(tmp_path):
    with pytest.raises(FileNotFoundError, match="^cache .* not found"):
        check_data_paths(cache=str(tmp_path / "no" / "cache"))
    with pytest.raises(ValueError, match="^tfds_data_dir /proc/t: under /proc"):
        check_data_paths(tfds_data_dir="/proc/t")
    check_data_paths(cache=str(tmp_path / "cache"), tfds_data_dir=tmp_path / "t")


def test_file_checks_name_the_option(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.weights .*: file not found"):
        check_readable_file(tmp_path / "w.h5", "model.weights")
    (tmp_path / "w.h5").write_bytes(b"not hdf5")
    with pytest.raises(ValueError, match="not an HDF5 weights file"):
        check_readable_file(tmp_path / "w.h5", "model.weights")
    (tmp_path / "m.keras").write_bytes(b"PK nope")
    with pytest.raises(ValueError, match="not a Keras model archive") as info:
        check_keras_file(tmp_path / "m.keras")
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="--output .*exists and is not a folder"):
        check_writable_dir(tmp_path / "w.h5", "--output")
