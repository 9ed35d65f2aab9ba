"""GTSRB, the German Traffic Sign Recognition Benchmark, as a TFDS dataset.

Importing this module registers the TFDS builder `gtsrb` (`builder`) and
the source `gtsrb` (`split`: train, validation of whole tracks, test). The
builder downloads the three official archives (from `$ADVTRAIN_GTSRB_URL`
if set) or reads them, or the folders they extract to, from the TFDS manual
directory (`path`); offline without one it stops within seconds, naming:

```
GTSRB_Final_Training_Images.zip  or  GTSRB/Final_Training/Images/000NN/
GTSRB_Final_Test_Images.zip      or  GTSRB/Final_Test/Images/
GTSRB_Final_Test_GT.zip          or  GT-final_test.csv
```

Images are stored as PNG records (optionally ROI-cropped and resized), one
folder per config; training records keep their track id, so validation can
hold out whole tracks (a track's 30 frames show one sign).

Example:

```python
import advtrain  # registers "gtsrb"

config = tfds.download.DownloadConfig(manual_dir="/data")
ds = tfds.load("gtsrb/roi_32x32", split="train", data_dir="/tmp/tfds",
               download_and_prepare_kwargs={"download_config": config})
```
"""

from advtrain.data.gtsrb.builder import (
    CLASS_NAMES,
    URL_ENV,
    Gtsrb,
    GtsrbConfig,
    archives_url,
    gtsrb_config,
    locate_manual_dir,
)
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
