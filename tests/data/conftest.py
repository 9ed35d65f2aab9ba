"""Shared fixtures: small data sets in the real on-disk formats."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from advtrain.data.synthetic import write_gtsrb

# Three classes including the last one (42); three tracks of two frames
# per class, two test images per class; sizes 15..40 px, never square.
GTSRB_LAYOUT = dict(
    classes=(0, 3, 42),
    tracks_per_class=3,
    frames_per_track=2,
    test_per_class=2,
    sizes=(15, 40),
    seed=7,
)


@pytest.fixture(scope="session")
def gtsrb_written(tmp_path_factory):
    """(extracted root, zips root, written images); identical content."""
    extracted = tmp_path_factory.mktemp("gtsrb_extracted")
    zipped = tmp_path_factory.mktemp("gtsrb_zipped")
    written = write_gtsrb(extracted, **GTSRB_LAYOUT)
    write_gtsrb(zipped, archives=True, extracted=False, **GTSRB_LAYOUT)
    return extracted, zipped, written


@pytest.fixture(scope="session")
def tfds_dir(tmp_path_factory):
    """A TFDS data dir shared by the tests that read intact fixtures."""
    return tmp_path_factory.mktemp("tfds")


@pytest.fixture
def gtsrb_copy(gtsrb_written, tmp_path):
    """A private copy of the extracted tree, for tests that damage it."""
    root = tmp_path / "raw"
    shutil.copytree(gtsrb_written[0], root)
    return root


@pytest.fixture
def rng():
    return np.random.default_rng(0)
