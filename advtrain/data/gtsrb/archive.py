"""GTSRB's files: where the three official archives come from, and finding
them (zips or their extracted folders) in a manual directory.
"""

from __future__ import annotations

import dataclasses
import os
import zipfile
import zlib
from pathlib import Path

from advtrain.data.errors import DataError
from advtrain.utils.errors import one_line

URL = "https://sid.erda.dk/public/archives/daaeac0d7ce1152aea9b61d9f1e19370/"
URL_ENV = "ADVTRAIN_GTSRB_URL"  # a mirror of the archives, same file names
ARCHIVES = {
    "train": "GTSRB_Final_Training_Images.zip",
    "test": "GTSRB_Final_Test_Images.zip",
    "test_gt": "GTSRB_Final_Test_GT.zip",
}
TRAIN_DIR = "GTSRB/Final_Training/Images"
TEST_DIR = "GTSRB/Final_Test/Images"
TEST_GT = "GT-final_test.csv"


def archives_url() -> str:
    """Where the archives download from: $ADVTRAIN_GTSRB_URL, else `URL`."""
    url = os.environ.get(URL_ENV) or URL
    return url if url.endswith("/") else url + "/"


class _FolderTree:
    """Files under a directory, addressed by '/'-separated relative paths."""

    def __init__(self, root: Path):
        self.root = root

    def name(self, rel: str) -> str:
        return rel

    def is_file(self, rel: str) -> bool:
        return (self.root / rel).is_file()

    def is_dir(self, rel: str) -> bool:
        return (self.root / rel).is_dir()

    def subdirs(self, rel: str) -> list[str]:
        return sorted(p.name for p in (self.root / rel).iterdir() if p.is_dir())

    def read(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()


class _ZipTree:
    """Members of a zip archive, read without extracting it."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self._zip = zipfile.ZipFile(path)
            names = self._zip.namelist()
        except (OSError, zipfile.BadZipFile) as exc:
            raise DataError(
                f"{path.name}: not a readable zip archive ({one_line(exc)})."
            ) from None
        self._files = {n for n in names if not n.endswith("/")}
        self._dirs: set[str] = set()
        for name in names:
            parts = name.rstrip("/").split("/")
            # A file's parents are folders; so is an explicit "dir/" entry.
            last = len(parts) + 1 if name.endswith("/") else len(parts)
            self._dirs.update("/".join(parts[:i]) for i in range(1, last))

    def name(self, rel: str) -> str:
        return f"{self.path.name}:{rel}"

    def is_file(self, rel: str) -> bool:
        return rel in self._files

    def is_dir(self, rel: str) -> bool:
        return rel in self._dirs

    def subdirs(self, rel: str) -> list[str]:
        prefix = rel.rstrip("/") + "/"
        return sorted(
            d[len(prefix) :]
            for d in self._dirs
            if d.startswith(prefix) and "/" not in d[len(prefix) :]
        )

    def read(self, rel: str) -> bytes:
        try:
            return self._zip.read(rel)
        except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
            raise OSError(f"corrupt archive member ({one_line(exc)})") from None


def _listing(root: Path, limit: int = 8) -> str:
    names = sorted(p.name for p in root.iterdir())
    shown = ", ".join(names[:limit]) or "nothing"
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


@dataclasses.dataclass
class _Layout:
    train: object
    test: object
    gt: object
    gt_rel: str


def _find_tree(root: Path, rel_dir: str, archive: str):
    if (root / rel_dir).is_dir():
        return _FolderTree(root)
    if (root / archive).is_file():
        tree = _ZipTree(root / archive)
        if not tree.is_dir(rel_dir):
            raise DataError(
                f"{archive}: expected the folder {rel_dir}/ inside "
                "(official GTSRB archive layout)."
            )
        return tree
    raise DataError(
        f"{root}: expected {rel_dir}/ or {archive} (official GTSRB layout). "
        f"Received: {_listing(root)}"
    )


def _find_gt(root: Path):
    for rel in (
        TEST_GT,
        f"GTSRB/{TEST_GT}",
        f"GTSRB/Final_Test/{TEST_GT}",
        f"{TEST_DIR}/{TEST_GT}",
    ):
        if (root / rel).is_file():
            return _FolderTree(root), rel
    if (root / ARCHIVES["test_gt"]).is_file():
        return _gt_in_zip(_ZipTree(root / ARCHIVES["test_gt"]))
    raise DataError(
        f"{root}: expected {TEST_GT} (test labels) or {ARCHIVES['test_gt']}. "
        f"Received: {_listing(root)}"
    )


def _gt_in_zip(tree: _ZipTree):
    for rel in sorted(tree._files):
        if rel.split("/")[-1] == TEST_GT:
            return tree, rel
    raise DataError(f"{tree.path.name}: expected {TEST_GT} inside.")


def locate_manual_dir(root: Path) -> _Layout:
    """Finds the train images, test images and test labels under `root`."""
    if not root.is_dir():
        raise DataError(
            f"{root}: GTSRB directory not found. Expected the official zips "
            "or their extracted GTSRB/ folder there."
        )
    if root.name == "GTSRB" and (root / "Final_Training" / "Images").is_dir():
        root = root.parent
    train = _find_tree(root, TRAIN_DIR, ARCHIVES["train"])
    test = _find_tree(root, TEST_DIR, ARCHIVES["test"])
    gt, gt_rel = _find_gt(root)
    return _Layout(train=train, test=test, gt=gt, gt_rel=gt_rel)


def _locate_downloaded(paths: dict) -> _Layout:
    gt, gt_rel = _gt_in_zip(_ZipTree(Path(paths["test_gt"])))
    return _Layout(
        train=_ZipTree(Path(paths["train"])),
        test=_ZipTree(Path(paths["test"])),
        gt=gt,
        gt_rel=gt_rel,
    )
