"""GTSRB, the German Traffic Sign Recognition Benchmark, as a TFDS dataset.

Modules: `archive` (the official files, in zips or folders), `config`
(how the images are stored: ROI crop, size), `rows` (CSV rows and PPM
images checked and encoded), `builder` (the TFDS builder and its predefined
configs), `split` (the advtrain source: train / val by track / test).

Importing this module (or `advtrain`) registers the TFDS builder `gtsrb`
and the advtrain source `gtsrb`. The builder downloads the three official
archives when online (from a mirror with the same file names if
`$ADVTRAIN_GTSRB_URL` names one); otherwise it reads them, or the folders
they extract to, from the TFDS manual directory (the recipe's `data.path`).
With no manual directory and no network it stops within seconds, naming
these files:

```
GTSRB_Final_Training_Images.zip  or  GTSRB/Final_Training/Images/000NN/
GTSRB_Final_Test_Images.zip      or  GTSRB/Final_Test/Images/
GTSRB_Final_Test_GT.zip          or  GT-final_test.csv
```

Training images are `000NN/XXXXX_YYYYY.ppm` (class NN, track XXXXX, frame
YYYYY) listed in `000NN/GT-000NN.csv`; test labels are in
`GT-final_test.csv`. The CSVs are `;`-separated with the header
`Filename;Width;Height;Roi.X1;Roi.Y1;Roi.X2;Roi.Y2;ClassId`. The PPM images
are decoded with Pillow at preparation time (TensorFlow cannot read PPM) and
stored as PNG records, optionally cropped to the ROI and resized; each
config (`full`, `roi`, `roi_32x32`, ...) is prepared once into its own
folder. Each training record keeps its track id, so a validation split can
hold out whole tracks: the 30 frames of a track are near-duplicates of one
physical sign, and a random split would leak them.

Example:

```python
import tensorflow_datasets as tfds
import advtrain  # registers "gtsrb"

ds = tfds.load(
    "gtsrb/roi_32x32",
    split="train",
    data_dir="/tmp/tfds",
    download_and_prepare_kwargs={
        "download_config": tfds.download.DownloadConfig(manual_dir="/data")
    },
)
```
"""

from advtrain.data.gtsrb.archive import URL_ENV, archives_url, locate_manual_dir
from advtrain.data.gtsrb.builder import CLASS_NAMES, Gtsrb, gtsrb_config
from advtrain.data.gtsrb.config import GtsrbConfig
from advtrain.data.gtsrb.rows import NUM_CLASSES
from advtrain.data.gtsrb.split import gtsrb_splits, prepare_gtsrb, split_by_track

__all__ = [
    "CLASS_NAMES",
    "Gtsrb",
    "GtsrbConfig",
    "NUM_CLASSES",
    "URL_ENV",
    "archives_url",
    "gtsrb_config",
    "gtsrb_splits",
    "locate_manual_dir",
    "prepare_gtsrb",
    "split_by_track",
]
