"""Datasets: each source, deterministic stratified splits, class selection, calibration from the
train split only, every bad input's message, and the TTDS stream format."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from tinytrain.pipeline.errors import UserError
from tinytrain.pipeline.spec_data import DataSpec
from tinytrain.stages.train.data import (
    DataError,
    calibration_samples,
    check_compatible,
    input_files,
    load_dataset,
    read_stream,
    resize_bilinear,
    write_stream,
)

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def digits():
    return load_dataset(DataSpec(source="digits"))


def _npz(tmp_path: Path, name="d.npz", **arrays) -> Path:
    path = tmp_path / name
    np.savez(path, **arrays)
    return path


def _xy(n=40, classes=4, shape=(3, 3, 1), seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, *shape)).astype(np.float32), np.arange(n) % classes


# ---- spec -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("fields, message", [
    ({"source": "npz"}, "needs `path`: a .npz file"),
    ({"source": "images"}, "needs `path`: a folder"),
    ({"source": "digits", "path": "/x.npz"}, "takes no path"),
    ({"source": "digits", "test_fraction": 1.0}, "strictly between 0 and 1"),
    ({"source": "digits", "classes": []}, "classes is empty"),
    ({"source": "digits", "classes": [1, 2, 1]}, r"lists \[1\] more than once"),
    ({"source": "digits", "classes": [-1]}, "non-negative"),
    ({"source": "images", "path": "/d", "image_size": [0, 8]}, "two positive integers"),
    ({"source": "npz", "path": "/d.npz", "image_size": [8, 8]}, "only applies to source 'images'"),
    ({"source": "digits", "scale": 0}, "finite non-zero"),
    ({"source": "digits", "layout": "nchw"}, "nhwc"),
    ({"source": "digits", "shuffle": True}, "Extra inputs are not permitted"),
    ({"source": "mnist"}, "digits"),
])
def test_spec_rejects_bad_fields(fields, message):
    with pytest.raises(ValidationError, match=message):
        DataSpec(**fields)


def test_spec_defaults_and_scale():
    s = DataSpec(source="digits")
    assert (s.classes, s.test_fraction, s.split_seed, s.layout, s.relabel) == (None, 0.2, 0, "nhwc", True)
    assert s.effective_scale() == 1 / 16
    assert DataSpec(source="images", path="/d").effective_scale() == 1 / 255
    assert DataSpec(source="npz", path="/d.npz", scale=0.5).effective_scale() == 0.5


# ---- digits ---------------------------------------------------------------------------------------

def test_digits_shapes_types_and_range(digits):
    assert digits.x_train.shape[1:] == (8, 8, 1) and digits.x_train.dtype == np.float32
    assert digits.y_train.dtype == np.int64 and digits.y_test.dtype == np.int64
    assert len(digits.x_train) + len(digits.x_test) == 1797
    assert digits.x_train.min() == 0.0 and digits.x_train.max() == 1.0
    assert digits.class_names == [str(i) for i in range(10)] and digits.num_classes == 10


def test_split_is_stratified(digits):
    total = np.bincount(digits.y_train) + np.bincount(digits.y_test)
    frac = np.bincount(digits.y_test) / total
    assert np.all(np.abs(frac - 0.2) < 0.02), frac


def test_split_is_deterministic_and_follows_the_seed(digits):
    again = load_dataset(DataSpec(source="digits"))
    assert again.digest() == digits.digest()
    assert np.array_equal(again.x_test, digits.x_test)
    assert load_dataset(DataSpec(source="digits", split_seed=1)).digest() != digits.digest()


def test_digits_split_holds_out_what_the_fixture_model_never_saw():
    """tests/fixtures/digits_cnn_* were trained on sklearn's usual split of classes 0-4."""
    ds = load_dataset(DataSpec(source="digits", classes=[0, 1, 2, 3, 4], test_fraction=0.25))
    assert (len(ds.x_train), len(ds.x_test)) == (675, 226)
    assert np.array_equal(ds.x_test[:8], np.load(FIXTURES / "digits_cnn.input.npy"))


# ---- class selection ------------------------------------------------------------------------------

def test_class_selection_relabels_in_the_order_given(digits):
    ds = load_dataset(DataSpec(source="digits", classes=[8, 3]))
    assert ds.class_names == ["8", "3"] and set(ds.y_train) == {0, 1}
    # Label 0 now means digit 8: same images as the full set's 8s.
    eights = np.sort(np.concatenate([digits.x_train[digits.y_train == 8], digits.x_test[digits.y_test == 8]])
                     .reshape(-1, 64), axis=0)
    mine = np.sort(np.concatenate([ds.x_train[ds.y_train == 0], ds.x_test[ds.y_test == 0]]).reshape(-1, 64), axis=0)
    assert np.array_equal(eights, mine)


def test_class_selection_without_relabel_keeps_raw_labels():
    ds = load_dataset(DataSpec(source="digits", classes=[2, 7], relabel=False))
    assert set(ds.y_train) | set(ds.y_test) == {2, 7}
    assert ds.num_classes == 8 and ds.class_names[7] == "7"


def test_class_that_does_not_exist_is_named(tmp_path):
    with pytest.raises(DataError, match=r"asks for \[12\], which the data does not have; labels present: \[0, 1"):
        load_dataset(DataSpec(source="digits", classes=[1, 12]))


# ---- npz ------------------------------------------------------------------------------------------

def test_npz_with_its_own_split_is_kept(tmp_path):
    x, y = _xy()
    p = _npz(tmp_path, x_train=x[:30], y_train=y[:30], x_test=x[30:], y_test=y[30:], class_names=["a", "b", "c", "d"])
    ds = load_dataset(DataSpec(source="npz", path=p))
    assert np.array_equal(ds.x_train, x[:30]) and np.array_equal(ds.y_test, y[30:])
    assert ds.class_names == ["a", "b", "c", "d"]


def test_npz_xy_is_split_here_and_scaled(tmp_path):
    x, y = _xy(n=100)
    ds = load_dataset(DataSpec(source="npz", path=_npz(tmp_path, x=x, y=y.astype(np.uint8)), scale=2.0, offset=1.0,
                               test_fraction=0.25))
    assert (len(ds.x_train), len(ds.x_test)) == (75, 25)
    assert np.bincount(ds.y_test).tolist() == [6, 7, 6, 6] or sorted(np.bincount(ds.y_test)) == [6, 6, 6, 7]
    assert np.allclose(np.sort(np.concatenate([ds.x_train, ds.x_test]).ravel()), np.sort(x.ravel() * 2 + 1))


def test_integer_valued_float_labels_are_accepted(tmp_path):
    x, y = _xy()
    ds = load_dataset(DataSpec(source="npz", path=_npz(tmp_path, x=x, y=y.astype(np.float32))))
    assert ds.y_train.dtype == np.int64


@pytest.mark.parametrize("arrays, message", [
    ({"a": np.zeros(3)}, r"needs arrays x_train, y_train, x_test, y_test \(or x, y to split here\); it has \['a'\]"),
    ({"x": np.zeros(4), "y": np.zeros(4, int)}, r"x has shape \[4\]; expected one sample per row"),
    ({"x": np.zeros((4, 2, 2, 1), bool), "y": np.zeros(4, int)}, "x has dtype bool"),
    ({"x": np.zeros((4, 2, 2, 1)), "y": np.zeros(5, int)}, "one label per sample"),
    ({"x": np.zeros((4, 2, 2, 1)), "y": np.full(4, 0.5)}, "expected integer class labels"),
    ({"x": np.zeros((4, 2, 2, 1)), "y": np.array([0, 1, -1, 0])}, "labels must be >= 0"),
    ({"x": np.full((4, 2, 2, 1), np.nan), "y": np.array([0, 1, 1, 0])}, "16 values are NaN or infinite"),
    ({"x": np.zeros((0, 2, 2, 1)), "y": np.zeros(0, int)}, "empty"),
    ({"x": np.zeros((3, 2, 2, 1)), "y": np.array([0, 1, 1])}, "single sample"),
    ({"x_train": np.zeros((4, 2, 2, 1)), "y_train": np.zeros(4, int), "x_test": np.zeros((2, 3, 2, 1)),
      "y_test": np.zeros(2, int)}, r"train samples have shape \[2, 2, 1\] but test samples \[3, 2, 1\]"),
    ({"x_train": np.zeros((4, 2, 2, 1)), "y_train": np.zeros(4, int), "x_test": np.zeros((0, 2, 2, 1)),
      "y_test": np.zeros(0, int)}, "test split is empty"),
])
def test_bad_npz_gives_a_clear_user_error(tmp_path, arrays, message):
    with pytest.raises(DataError, match=message) as e:
        load_dataset(DataSpec(source="npz", path=_npz(tmp_path, **arrays)))
    assert isinstance(e.value, UserError) and e.value.exit_code == 2


def test_object_arrays_are_refused_without_unpickling(tmp_path):
    p = _npz(tmp_path, x=np.array([{"a": 1}], dtype=object), y=np.zeros(1, int))
    with pytest.raises(DataError, match="not a readable .npz file"):
        load_dataset(DataSpec(source="npz", path=p))


def test_missing_or_wrong_kind_of_path(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_dataset(DataSpec(source="npz", path=tmp_path / "nope.npz"))
    with pytest.raises(DataError, match="is a folder; expected the npz file"):
        load_dataset(DataSpec(source="npz", path=tmp_path))
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="not a readable .npz file"):
        load_dataset(DataSpec(source="npz", path=tmp_path / "junk.npz"))


# ---- images ---------------------------------------------------------------------------------------

def _pgm(path: Path, img: np.ndarray, binary=True, comment=True):
    h, w = img.shape
    head = f"P{5 if binary else 2}\n{'# made by a test' + chr(10) if comment else ''}{w} {h}\n255\n".encode()
    body = img.astype(np.uint8).tobytes() if binary else " ".join(str(v) for v in img.ravel()).encode()
    path.write_bytes(head + body)


def _ppm(path: Path, img: np.ndarray):
    h, w, _ = img.shape
    path.write_bytes(f"P6 {w} {h} 255\n".encode() + img.astype(np.uint8).tobytes())


def _image_folder(root: Path, n=4, size=(6, 5)) -> dict[str, list[np.ndarray]]:
    rng = np.random.default_rng(3)
    made = {}
    for k, cls in enumerate(["cat", "ant", "bee"]):
        (root / cls).mkdir(parents=True)
        made[cls] = []
        for i in range(n):
            img = rng.integers(0, 256, size=size)
            made[cls].append(img)
            if i % 3 == 0:
                _pgm(root / cls / f"{i}.pgm", img)
            elif i % 3 == 1:
                _pgm(root / cls / f"{i}.pgm", img, binary=False)
            else:
                np.save(root / cls / f"{i}.npy", img.astype(np.uint8))
        (root / cls / ".DS_Store").write_bytes(b"\0")
        (root / cls / "notes.txt").write_text("ignored")
    return made


def test_image_folder_labels_follow_sorted_folder_names(tmp_path):
    made = _image_folder(tmp_path)
    ds = load_dataset(DataSpec(source="images", path=tmp_path, test_fraction=0.25))
    assert ds.class_names == ["ant", "bee", "cat"] and ds.sample_shape == (6, 5, 1)
    all_x = np.concatenate([ds.x_train, ds.x_test])
    all_y = np.concatenate([ds.y_train, ds.y_test])
    for label, cls in enumerate(ds.class_names):
        want = np.sort(np.stack(made[cls]).reshape(len(made[cls]), -1) / 255.0, axis=0)
        got = np.sort(all_x[all_y == label].reshape(-1, 30), axis=0)
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_input_files_lists_what_loading_reads(tmp_path):
    assert input_files(DataSpec(source="digits")) == []
    _image_folder(tmp_path / "imgs")
    files = input_files(DataSpec(source="images", path=tmp_path / "imgs"))
    assert [f"{f.parent.name}/{f.name}" for f in files][:4] == ["ant/0.pgm", "ant/1.pgm", "ant/2.npy", "ant/3.pgm"]
    assert len(files) == 12
    with pytest.raises(DataError, match="does not exist"):
        input_files(DataSpec(source="npz", path=tmp_path / "x.npz"))


def test_colour_images_to_grayscale_and_back_and_resize(tmp_path):
    rng = np.random.default_rng(4)
    for cls in ("a", "b"):
        (tmp_path / cls).mkdir()
        for i in range(3):
            _ppm(tmp_path / cls / f"{i}.ppm", rng.integers(0, 256, size=(4, 6, 3)))
    gray = load_dataset(DataSpec(source="images", path=tmp_path, test_fraction=0.34))
    assert gray.sample_shape == (4, 6, 1)
    rgb = load_dataset(DataSpec(source="images", path=tmp_path, grayscale=False, image_size=(8, 3),
                                test_fraction=0.34))
    assert rgb.sample_shape == (8, 3, 3)


def test_resize_bilinear_is_half_pixel_centred():
    img = np.arange(4, dtype=np.float32).reshape(1, 4, 1)
    np.testing.assert_allclose(resize_bilinear(img, (1, 2))[0, :, 0], [0.5, 2.5])
    np.testing.assert_allclose(resize_bilinear(img, (1, 8))[0, :, 0], [0, 0.25, 0.75, 1.25, 1.75, 2.25, 2.75, 3])


def test_images_of_different_sizes_need_image_size(tmp_path):
    for cls, size in (("a", (4, 4)), ("b", (5, 4))):
        (tmp_path / cls).mkdir()
        for i in range(2):
            _pgm(tmp_path / cls / f"{i}.pgm", np.zeros(size))
    with pytest.raises(DataError, match="different sizes") as e:
        load_dataset(DataSpec(source="images", path=tmp_path))
    assert "image_size" in str(e.value)
    ds = load_dataset(DataSpec(source="images", path=tmp_path, image_size=(4, 4), test_fraction=0.5))
    assert ds.sample_shape == (4, 4, 1)


def test_bad_image_folders(tmp_path):
    with pytest.raises(DataError, match="no class subfolders"):
        load_dataset(DataSpec(source="images", path=tmp_path))
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "readme.txt").write_text("x")
    with pytest.raises(DataError, match=r"a: no images \(supported: "):
        load_dataset(DataSpec(source="images", path=tmp_path))
    (tmp_path / "a" / "0.pgm").write_bytes(b"P5 4 4 255\n\x00\x01")
    with pytest.raises(DataError, match=r"0.pgm: cannot read image \(truncated"):
        load_dataset(DataSpec(source="images", path=tmp_path))
    (tmp_path / "a" / "0.pgm").write_bytes(b"GIF89a")
    with pytest.raises(DataError, match="not a PGM/PPM file"):
        load_dataset(DataSpec(source="images", path=tmp_path))


def test_png_needs_pillow_or_reads_with_it(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "0.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    try:
        import PIL  # noqa: F401
    except ImportError:
        with pytest.raises(DataError, match="needs Pillow, which is not installed") as e:
            load_dataset(DataSpec(source="images", path=tmp_path))
        assert "pip install Pillow" in str(e.value)
    else:
        with pytest.raises(DataError, match="cannot read image"):
            load_dataset(DataSpec(source="images", path=tmp_path))


# ---- calibration and compatibility ----------------------------------------------------------------

def test_calibration_draws_from_train_only_and_is_deterministic(tmp_path):
    rng = np.random.default_rng(0)
    xtr = rng.uniform(1, 2, size=(50, 2, 2, 1))        # train positive, test negative: tells them apart
    xte = -rng.uniform(1, 2, size=(20, 2, 2, 1))
    ytr, yte = np.arange(50) % 2, np.arange(20) % 2
    ds = load_dataset(DataSpec(source="npz", path=_npz(tmp_path, x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)))
    cal = calibration_samples(ds, 10, seed=3)
    assert cal.shape == (10, 2, 2, 1) and cal.dtype == np.float32 and np.all(cal > 0)
    assert np.array_equal(cal, calibration_samples(ds, 10, seed=3))
    assert not np.array_equal(cal, calibration_samples(ds, 10, seed=4))
    assert len(calibration_samples(ds, 500)) == 50
    with pytest.raises(DataError, match="must be positive"):
        calibration_samples(ds, 0)


def test_check_compatible_with_the_model(digits):
    check_compatible(digits, [1, 8, 8, 1], num_classes=10)
    with pytest.raises(DataError, match=r"expected samples of \[16, 16, 3\] .*got \[8, 8, 1\]"):
        check_compatible(digits, [1, 16, 16, 3])
    with pytest.raises(DataError, match="labels go up to 9 but the model has 5 classes"):
        check_compatible(digits, [1, 8, 8, 1], num_classes=5)


# ---- stream format --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "float32"])
def test_stream_round_trips(tmp_path, dtype):
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(7, 8, 8, 1)) * 50).astype(dtype)
    y = rng.integers(0, 10, 7)
    write_stream(tmp_path / "d.ttds", x, y)
    x2, y2 = read_stream(tmp_path / "d.ttds")
    assert x2.dtype == x.dtype and np.array_equal(x2, x) and np.array_equal(y2, y)


def test_stream_header_layout(tmp_path):
    x = np.arange(2 * 3 * 4, dtype=np.int8).reshape(2, 3, 4)
    write_stream(tmp_path / "d.ttds", x, np.array([5, 6]))
    data = (tmp_path / "d.ttds").read_bytes()
    assert data[:4] == b"TTDS"
    assert struct.unpack_from("<HBBI4II", data, 4) == (1, 0, 2, 2, 3, 4, 0, 0, 0)
    assert len(data) == 32 + 2 * (4 + 12)
    assert struct.unpack_from("<i", data, 32)[0] == 5 and data[36:48] == x[0].tobytes()


def test_stream_errors(tmp_path):
    with pytest.raises(DataError, match="int8, uint8, int16 or float32"):
        write_stream(tmp_path / "d", np.zeros((2, 2), np.float64), np.zeros(2, int))
    with pytest.raises(DataError, match="one per sample"):
        write_stream(tmp_path / "d", np.zeros((2, 2), np.int8), np.zeros(3, int))
    write_stream(tmp_path / "d", np.zeros((2, 2), np.int8), np.zeros(2, int))
    (tmp_path / "t").write_bytes((tmp_path / "d").read_bytes()[:-1])
    with pytest.raises(DataError, match="truncated"):
        read_stream(tmp_path / "t")
    (tmp_path / "m").write_bytes(b"XXXX" + bytes(40))
    with pytest.raises(DataError, match="not a TTDS data stream"):
        read_stream(tmp_path / "m")
