"""Reading an image (lib.dataset.read_image): grey and alpha converted to BGR, errors naming the file,
truncated files refused, and images that would exhaust memory refused before decoding."""
import cv2
import numpy as np
import pytest

from dataset_helpers import ann, dataset_cfg, image_record, png_bomb, png_header, write_coco

from lib.config import load_config
from lib.dataset import load_roidb, read_image


def test_read_image_converts_gray_and_alpha_to_bgr(tmp_path):
    gray = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    cv2.imwrite(str(tmp_path / "gray.png"), gray)
    image = read_image(str(tmp_path / "gray.png"))
    assert image.shape == (3, 4, 3) and image.dtype == np.uint8
    for channel in range(3):
        np.testing.assert_array_equal(image[:, :, channel], gray)

    bgra = np.random.default_rng(0).integers(0, 256, (5, 6, 4), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / "bgra.png"), bgra)
    np.testing.assert_array_equal(read_image(str(tmp_path / "bgra.png")), bgra[:, :, :3])

    deep = (np.arange(6, dtype=np.uint16).reshape(2, 3) * 10000)
    cv2.imwrite(str(tmp_path / "deep.png"), deep)
    np.testing.assert_array_equal(read_image(str(tmp_path / "deep.png"))[:, :, 0], deep >> 8)


def test_read_image_errors_name_the_file(tmp_path):
    with pytest.raises(IOError, match=r"cannot read image .*missing\.jpg"):
        read_image(str(tmp_path / "missing.jpg"))
    (tmp_path / "junk.jpg").write_bytes(b"definitely not a jpeg")
    with pytest.raises(IOError, match=r"cannot decode image .*junk\.jpg"):
        read_image(str(tmp_path / "junk.jpg"))
    (tmp_path / "empty.jpg").write_bytes(b"")
    with pytest.raises(IOError, match=r"empty\.jpg"):
        read_image(str(tmp_path / "empty.jpg"))


def photo_like(height=120, width=160):
    """A smooth image with detail (JPEG's entropy-coded data of it is tens of kB, like a photo's)."""
    y, x = np.mgrid[:height, :width]
    noise = np.random.default_rng(1).integers(0, 40, (height, width, 3))
    return np.stack([x * 255 // width, y * 255 // height, (x + y) % 256], axis=2).astype(np.uint8) + noise.astype(np.uint8)


def encoded(ext, image, *params):
    ok, data = cv2.imencode(ext, image, list(params))
    assert ok
    return data.tobytes()


@pytest.mark.parametrize("ext, params", [(".jpg", ()), (".jpg", (cv2.IMWRITE_JPEG_PROGRESSIVE, 1)), (".png", ())])
def test_a_truncated_image_is_refused_naming_the_file(tmp_path, ext, params):
    data = encoded(ext, photo_like(), *params)
    cut = data[:len(data) * 2 // 3]
    # the decoder alone fills a baseline JPEG's missing rows with grey and says nothing: the premise
    if ext == ".jpg" and not params:
        decoded = cv2.imdecode(np.frombuffer(cut, np.uint8), cv2.IMREAD_COLOR)
        assert decoded is not None and decoded.shape == (120, 160, 3)
    path = tmp_path / f"cut{ext}"
    path.write_bytes(cut)
    with pytest.raises(IOError, match=rf"truncated image .*cut\{ext}: the file ends before its end-of-image marker"):
        read_image(str(path))
    path.write_bytes(data)
    np.testing.assert_array_equal(read_image(str(path)), cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR))


def test_bytes_after_the_jpeg_end_marker_are_allowed(tmp_path):
    data = encoded(".jpg", photo_like())
    expected = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    # zero padding; a camera-style trailer whose bytes include markers (FFDA: start of scan) but no FFD9
    for tail in (b"\x00" * 100, b"SEFH\xff\xda\x00\x0c" + bytes(range(0, 0xD9)) + b"\xff\xda"):
        (tmp_path / "tail.jpg").write_bytes(data + tail)
        np.testing.assert_array_equal(read_image(str(tmp_path / "tail.jpg")), expected)


def test_a_truncated_jpeg_with_a_complete_thumbnail_inside_is_refused(tmp_path):
    """An EXIF thumbnail is a whole JPEG (with its own end marker FFD9) inside an APP1 segment: finding
    an FFD9 somewhere is not enough, the segments are walked."""
    thumbnail = encoded(".jpg", photo_like(16, 16))
    app1 = b"\xff\xe1" + (len(thumbnail) + 8).to_bytes(2, "big") + b"Exif\x00\x00" + thumbnail
    main = encoded(".jpg", photo_like())
    whole = main[:2] + app1 + main[2:]
    (tmp_path / "exif.jpg").write_bytes(whole)
    assert read_image(str(tmp_path / "exif.jpg")).shape == (120, 160, 3)
    (tmp_path / "exif.jpg").write_bytes(whole[:len(whole) - len(main) // 3])
    assert whole[:len(whole) - len(main) // 3].rfind(b"\xff\xd9") > 0
    with pytest.raises(IOError, match="truncated image .*exif.jpg"):
        read_image(str(tmp_path / "exif.jpg"))


@pytest.mark.parametrize("ext", [".png", ".jpg"])
def test_declared_size_reads_the_header_of_real_files(tmp_path, ext):
    from lib.dataset.image_io import declared_size

    path = str(tmp_path / f"x{ext}")
    cv2.imwrite(path, np.zeros((37, 53, 3), np.uint8))
    with open(path, "rb") as f:
        assert declared_size(f.read()) == (37, 53)
    assert declared_size(b"BM not a jpeg or png") is None


def test_an_image_declaring_too_many_pixels_is_refused_before_decoding(tmp_path, monkeypatch):
    from lib.dataset import image_io

    path = tmp_path / "bomb.png"
    path.write_bytes(png_header(100_000, 100_000) + b"\x00" * 64)
    monkeypatch.setattr(image_io.cv2, "imdecode", lambda *a: pytest.fail("decoded"))
    with pytest.raises(IOError, match=r"bomb.png declares 100000x100000 pixels \(10000 Mpx\), more than "
                                      r"dataset.MAX_IMAGE_PIXELS \(1000 Mpx\); not decoded"):
        image_io.read_image(str(path), max_pixels=1_000_000_000)
    # annotated small, the header says otherwise: refused with the annotated-size message, not decoded
    entry = {"image": str(path), "height": 40, "width": 30}
    with pytest.raises(IOError, match=r"is 100000x100000 pixels, but its annotations say 30x40"):
        image_io.read_roidb_image(entry)


def test_an_image_read_without_a_config_is_held_to_the_keys_default_limit(tmp_path, monkeypatch):
    from lib.dataset import image_io

    path = tmp_path / "bomb.png"
    path.write_bytes(png_bomb(40_000, 30_000))  # 1.2 Gpx
    monkeypatch.setattr(image_io.cv2, "imdecode", lambda *a: pytest.fail("decoded"))
    with pytest.raises(IOError, match=r"bomb.png declares 40000x30000 pixels \(1200 Mpx\), more than "
                                      r"dataset.MAX_IMAGE_PIXELS \(1000 Mpx\); not decoded"):
        image_io.read_image(str(path))
    assert image_io.DEFAULT_MAX_PIXELS == load_config(None).dataset.MAX_IMAGE_PIXELS


def test_an_annotated_size_over_the_pixel_limit_is_refused_at_load(tmp_path):
    write_coco(str(tmp_path / "data"), "train", [image_record(1), image_record(2, width=100_000, height=100_000)],
               [ann(1, 1, [10, 20, 30, 40]), ann(2, 2, [0, 0, 10, 10])], image_files=False)
    with pytest.raises(ValueError, match=r"image id 2 .* is annotated 100000x100000 pixels \(10000 Mpx\), more than "
                                         r"dataset.MAX_IMAGE_PIXELS \(1000 Mpx\); 1 image\(s\) are over it"):
        load_roidb(dataset_cfg(tmp_path), "train")
