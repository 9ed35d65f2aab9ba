import numpy as np
import pytest

from advtrain.data.gtsrb.rows import open_ppm
from advtrain.data.synthetic import encode_ppm


def decode_ppm(data, name="image"):
    return np.array(open_ppm(data, name))


def test_decodes_header_with_comments_exactly():
    pixels = bytes(range(18))
    data = b"P6\n# made by hand\n3 # width\n2\n# maxval next\n255\n" + pixels
    image = decode_ppm(data)
    assert image.shape == (2, 3, 3)
    assert image.dtype == np.uint8
    np.testing.assert_array_equal(image.ravel(), np.arange(18))


def test_raster_may_start_with_whitespace_bytes():
    # Only one whitespace byte ends the header; the next byte is a pixel.
    pixels = b"\n\n\n" + b"\x00\x01\x02"
    image = decode_ppm(b"P6 2 1 255\n" + pixels)
    np.testing.assert_array_equal(image.ravel(), [10, 10, 10, 0, 1, 2])


def test_round_trip_of_odd_size(rng):
    image = rng.integers(0, 256, (17, 23, 3), dtype=np.uint8)
    np.testing.assert_array_equal(decode_ppm(encode_ppm(image, "c")), image)


def test_other_maxvals_are_scaled_to_8_bits():
    # 16-bit samples, big-endian: 0xFFFF is white, 0x8080 is mid-grey.
    image = decode_ppm(b"P6 2 1 65535\n" + b"\xff\xff" * 3 + b"\x80\x80" * 3)
    np.testing.assert_array_equal(image.ravel(), [255] * 3 + [128] * 3)


def test_open_ppm_gives_a_loaded_rgb_image(rng):
    pixels = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    image = open_ppm(encode_ppm(pixels))
    assert image.mode == "RGB" and image.size == (7, 5)  # width, height
    np.testing.assert_array_equal(np.asarray(image), pixels)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"P5 2 1 255\n\x00\x00", "expected magic 'P6'"),
        (b"P6 2 1", "truncated or bad PPM"),
        (b"P6 0 1 255\n", "bad PPM header"),
        (b"P6 2 x 255\n" + b"\x00" * 6, "truncated or bad PPM"),
        (b"P6 2 1 255\n" + b"\x00" * 5, "image file is truncated"),
    ],
)
def test_bad_files_raise_one_line_naming_the_file(data, message):
    with pytest.raises(ValueError, match=message) as err:
        decode_ppm(data, "a/b.ppm")
    assert str(err.value).startswith("a/b.ppm: ")
    assert "\n" not in str(err.value)
