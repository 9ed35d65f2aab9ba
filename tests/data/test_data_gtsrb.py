import logging
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from advtrain.data import load_splits
from advtrain.data.gtsrb import gtsrb_config, split_by_track

TRAIN = "GTSRB/Final_Training/Images"


def _manual(path):
    return {"download_config": tfds.download.DownloadConfig(manual_dir=str(path))}


def _by_filename(ds):
    return {ex["filename"].decode(): ex for ex in tfds.as_numpy(ds)}


def _options(path, data_dir, **kw):
    kw.setdefault("image_size", (16, 12))
    return dict(path=str(path), tfds_data_dir=str(data_dir), **kw)


@pytest.mark.parametrize("layout", ["extracted", "zipped"])
def test_tfds_load_reads_pixels_labels_tracks_exactly(
    gtsrb_written, tfds_dir, tmp_path, layout
):
    extracted, zipped, written = gtsrb_written
    manual = extracted if layout == "extracted" else zipped
    import advtrain.data.gtsrb  # noqa: F401 (registers the builder)

    splits = tfds.load(
        "gtsrb",  # default config "full": whole images, native size
        split=["train", "test"],
        # The zips are prepared on their own, not read back from the
        # extracted tree's records.
        data_dir=tfds_dir if layout == "extracted" else tmp_path,
        download_and_prepare_kwargs=_manual(manual),
    )
    train, test = (_by_filename(ds) for ds in splits)
    assert len(train) == 18 and len(test) == 6
    for item in written:
        ex = (train if item.split == "train" else test)[item.path]
        np.testing.assert_array_equal(ex["image"], item.image)
        assert ex["label"] == item.label
        assert ex["track"] == item.track
        assert tuple(ex["roi"]) == item.roi


def test_tfds_load_after_import_advtrain_in_a_fresh_interpreter(
    gtsrb_written, tmp_path
):
    # The README's promise: `import advtrain` is all tfds.load("gtsrb") needs.
    script = (
        "import advtrain, tensorflow_datasets as tfds\n"
        "cfg = tfds.download.DownloadConfig(manual_dir=sys.argv[1])\n"
        "ds = tfds.load('gtsrb/roi_32x32', split='test', data_dir=sys.argv[2],\n"
        "    download_and_prepare_kwargs={'download_config': cfg})\n"
        "print('examples', sum(1 for _ in ds))\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\n" + script,
            str(gtsrb_written[0]),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "examples 6" in result.stdout


def test_roi_crop_uses_the_csv_coordinates(gtsrb_written, tfds_dir):
    extracted, _, written = gtsrb_written
    builder = tfds.builder("gtsrb/roi", data_dir=tfds_dir)
    builder.download_and_prepare(**_manual(extracted))
    examples = {}
    for split in ("train", "test"):
        examples.update(_by_filename(builder.as_dataset(split=split)))
    for item in written:
        x1, y1, x2, y2 = item.roi
        image = examples[item.path]["image"]
        assert image.shape == (y2 - y1, x2 - x1, 3)
        np.testing.assert_array_equal(image, item.image[y1:y2, x1:x2])


def test_resized_records_match_tf_image_resize(gtsrb_written, tfds_dir):
    # Pillow's bilinear filter widens with the shrink factor (antialias),
    # as tf.image.resize(antialias=True) does; rounding may differ by one.
    extracted, _, written = gtsrb_written
    config = gtsrb_config(roi_crop=True, image_size=(16, 12))  # h x w
    builder = tfds.builder("gtsrb", config=config, data_dir=tfds_dir)
    builder.download_and_prepare(**_manual(extracted))
    stored = _by_filename(builder.as_dataset(split="train"))
    for item in written[:8]:
        x1, y1, x2, y2 = item.roi
        expected = tf.image.resize(
            item.image[y1:y2, x1:x2], (16, 12), antialias=True
        ).numpy()
        image = stored[item.path]["image"]
        assert image.shape == (16, 12, 3)
        assert np.abs(image - expected).max() <= 1.0


def test_source_resizes_and_describes_the_splits(gtsrb_written, tfds_dir):
    extracted, _, _ = gtsrb_written
    splits = load_splits("gtsrb", **_options(extracted, tfds_dir, image_size=(16, 12)))
    assert splits.num_classes == 43
    assert splits.image_shape == (16, 12, 3)
    assert (splits.train_size, splits.val_size, splits.test_size) == (18, 0, 6)
    assert splits.val is None and splits.skipped == 0
    images, labels = zip(*splits.test.as_numpy_iterator(), strict=True)
    assert {im.shape for im in images} == {(16, 12, 3)}  # height, width
    assert images[0].dtype == np.uint8
    assert sorted(labels) == [0, 0, 3, 3, 42, 42]
    assert splits.class_names[14] == "stop"


def test_validation_holds_out_whole_tracks(gtsrb_written, tfds_dir):
    extracted, _, _ = gtsrb_written
    splits = load_splits("gtsrb", **_options(extracted, tfds_dir, val_fraction=0.34))
    # Map each stored image back to its (class, track).
    config = gtsrb_config(roi_crop=True, image_size=(16, 12))
    builder = tfds.builder("gtsrb", config=config, data_dir=tfds_dir)
    track_of = {
        ex["image"].tobytes(): (int(ex["label"]), int(ex["track"]))
        for ex in tfds.as_numpy(builder.as_dataset(split="train"))
    }
    train = {track_of[x.tobytes()] for x, _ in splits.train.as_numpy_iterator()}
    val = {track_of[x.tobytes()] for x, _ in splits.val.as_numpy_iterator()}
    assert not train & val
    assert len(train | val) == 9  # 3 classes x 3 tracks
    assert {cls for cls, _ in val} == {0, 3, 42}  # one track per class
    assert (splits.train_size, splits.val_size) == (12, 6)
    assert len(list(splits.val)) == 6 and len(list(splits.train)) == 12


def test_split_by_track_keeps_each_track_on_one_side():
    labels = np.repeat([0, 0, 0, 0, 1, 1], 5)
    tracks = np.repeat([0, 1, 2, 3, 0, 1], 5)
    held = split_by_track(labels, tracks, 0.5, seed=3)
    for cls, track in {(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)}:
        sel = (labels == cls) & (tracks == track)
        assert held[sel].all() or not held[sel].any()
    assert held[labels == 0].sum() == 10 and held[labels == 1].sum() == 5
    assert not split_by_track(labels, tracks, 0.0, seed=3).any()


def test_source_tfds_reads_a_tfds_dataset_by_name(gtsrb_written, tfds_dir):
    extracted, _, _ = gtsrb_written
    splits = load_splits(
        "tfds",
        tfds_name="gtsrb",
        path=str(extracted),
        tfds_data_dir=str(tfds_dir),
        val_fraction=0.25,
        limit_test=4,
        image_size=(10, 14),
    )
    assert (splits.train_size, splits.val_size, splits.test_size) == (14, 4, 4)
    assert splits.num_classes == 43 and splits.image_shape == (10, 14, 3)
    assert len(list(splits.test)) == 4 and len(list(splits.val)) == 4
    shapes = {x.shape for x, _ in splits.train.as_numpy_iterator()}
    assert shapes == {(10, 14, 3)} and len(list(splits.train)) == 14


# ------------------------------------------------------------------ errors


def _error(options) -> str:
    with pytest.raises(ValueError) as err:
        load_splits("gtsrb", **options)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_missing_directory(tmp_path):
    message = _error(_options(tmp_path / "nope", tmp_path / "tfds"))
    assert message.startswith(f"{tmp_path / 'nope'}: GTSRB directory not found")


def test_wrong_layout_names_what_was_expected(tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "signs.txt").write_text("x")
    message = _error(_options(tmp_path / "raw", tmp_path / "tfds"))
    assert "expected GTSRB/Final_Training/Images/ or " in message
    assert "GTSRB_Final_Training_Images.zip" in message
    assert message.endswith("Received: signs.txt")


def test_image_size_is_required(gtsrb_written, tmp_path):
    message = _error(_options(gtsrb_written[0], tmp_path, image_size=None))
    assert message.startswith("image_size: source gtsrb needs one image size")


def test_csv_row_with_missing_file(gtsrb_copy, tmp_path):
    (gtsrb_copy / TRAIN / "00003" / "00001_00001.ppm").unlink()
    message = _error(_options(gtsrb_copy, tmp_path / "tfds"))
    assert message == (
        f"{TRAIN}/00003/GT-00003.csv row 4: file 00001_00001.ppm not found"
    )


def test_missing_class_csv(gtsrb_copy, tmp_path):
    (gtsrb_copy / TRAIN / "00042" / "GT-00042.csv").unlink()
    message = _error(_options(gtsrb_copy, tmp_path / "tfds"))
    assert message == f"{TRAIN}/00042: GT-00042.csv not found"


def test_truncated_image(gtsrb_copy, tmp_path):
    path = gtsrb_copy / TRAIN / "00000" / "00002_00001.ppm"
    path.write_bytes(path.read_bytes()[:-7])
    message = _error(_options(gtsrb_copy, tmp_path / "tfds"))
    assert message.startswith(
        f"{TRAIN}/00000/00002_00001.ppm: truncated or bad PPM: expected "
    )


def test_unreadable_image(gtsrb_copy, tmp_path):
    path = gtsrb_copy / TRAIN / "00000" / "00000_00000.ppm"
    path.write_bytes(b"\x89PNG not a ppm")
    message = _error(_options(gtsrb_copy, tmp_path / "tfds"))
    assert message.startswith(f"{TRAIN}/00000/00000_00000.ppm: not a binary PPM")


def test_label_out_of_range_in_test_csv(gtsrb_copy, tmp_path):
    gt = gtsrb_copy / "GT-final_test.csv"
    lines = gt.read_text().splitlines()
    lines[1] = lines[1].rsplit(";", 1)[0] + ";43"
    gt.write_text("\n".join(lines) + "\n")
    message = _error(_options(gtsrb_copy, tmp_path / "tfds"))
    assert message == (
        "GT-final_test.csv row 1: ClassId out of range: expected 0..42. Received: 43"
    )


def test_errors_inside_archives_name_the_archive(gtsrb_written, tmp_path):
    zipped = tmp_path / "zips"
    zipped.mkdir()
    for name in ("GTSRB_Final_Test_Images.zip", "GTSRB_Final_Test_GT.zip"):
        (zipped / name).write_bytes((gtsrb_written[1] / name).read_bytes())
    source = zipfile.ZipFile(gtsrb_written[1] / "GTSRB_Final_Training_Images.zip")
    missing = f"{TRAIN}/00003/00000_00001.ppm"
    with zipfile.ZipFile(zipped / "GTSRB_Final_Training_Images.zip", "w") as out:
        for info in source.infolist():
            if info.filename != missing:
                out.writestr(info, source.read(info))
    message = _error(_options(zipped, tmp_path / "tfds"))
    assert message == (
        f"GTSRB_Final_Training_Images.zip:{TRAIN}/00003/GT-00003.csv row 2: "
        "file 00000_00001.ppm not found"
    )


def test_skip_leaves_out_and_counts_corrupt_examples(gtsrb_copy, tmp_path, caplog):
    (gtsrb_copy / TRAIN / "00003" / "00001_00001.ppm").unlink()
    bad = gtsrb_copy / "GTSRB/Final_Test/Images/00001.ppm"
    bad.write_bytes(bad.read_bytes()[:20])
    data_dir = tmp_path / "tfds"
    with caplog.at_level(logging.WARNING):
        splits = load_splits(
            "gtsrb", **_options(gtsrb_copy, data_dir, on_corrupt="skip")
        )
    assert splits.skipped == 2
    assert (splits.train_size, splits.test_size) == (17, 5)
    assert len(list(splits.train)) == 17 and len(list(splits.test)) == 5
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("00001_00001.ppm not found" in w for w in warnings)
    assert any("skipped 1 corrupt example" in w for w in warnings)
    # The same prepared data is refused where every example is expected.
    message = _error(_options(gtsrb_copy, data_dir))
    assert "prepared with on_corrupt: skip (2 example(s) left out)" in message


def test_a_pickled_builder_keeps_on_corrupt(tfds_dir):
    import pickle

    builder = tfds.builder(
        "gtsrb", data_dir=tfds_dir, config="roi_32x32", on_corrupt="skip"
    )
    copy = pickle.loads(pickle.dumps(builder))
    assert copy._on_corrupt == "skip"
    assert copy.builder_config.name == "roi_32x32"
    assert str(copy.data_dir) == str(builder.data_dir)
