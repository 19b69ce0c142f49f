"""Datasets for calibration, accuracy reports and on-device training (the spec's `data` section).

`load_dataset(spec)` returns float32 samples of any rank with int64 labels, already split into train and
test: [N, F] features, [N, T, F] sequences or [N, H, W, C] images (a sample has 1 to 4 dimensions, what the
TTDS stream below carries). Sources:
- digits: scikit-learn's bundled 8x8 digits (no download): [N, 8, 8, 1], raw values 0..16.
- npz: keys x_train, y_train, x_test, y_test (the file's own split is kept), or x, y (split here).
  x is [N, ...] of a numeric dtype (features, sequences or NHWC images); y 1-D integer labels. An
  optional `class_names` array of strings names the labels.
- images: a folder with one subfolder per class (class label = index of the subfolder in sorted
  name order, class name = folder name). PGM/PPM/PNM and .npy files are read without extra
  packages; PNG/JPEG/BMP/GIF need Pillow. Hidden files and other suffixes are ignored. 16-bit
  PGM/PPM values are rescaled to 0..255 so that every image source has the same raw range.
  `image_size` resizes with bilinear interpolation (half-pixel centres, no antialiasing, as
  tf.image.resize), done here in numpy so the result does not depend on the Pillow version.
  `grayscale` converts RGB with the ITU-R 601 luma weights (as Pillow's "L" mode); with
  `grayscale: false`, gray images are repeated into 3 channels.

Every source then goes through the same steps: x_float = x_raw * scale + offset (see
pipeline/spec_data.py), class selection (with relabelling to 0..k-1 in the order given unless
`relabel: false`), checks (NaN/inf, empty, shapes), and, when the source has no split of its own,
a stratified split with scikit-learn's `train_test_split(test_size=test_fraction,
random_state=split_seed, stratify=y)`: the split most training scripts use, so `digits` with
classes [0..4], test_fraction 0.25, split_seed 0 holds out exactly the samples the digits_cnn
fixture was not trained on. The same spec always gives the same arrays (`Dataset.digest()`).

Streaming format for the firmware (`write_stream` / `read_stream`), all little-endian:

    offset size  field
    0      4     magic  b"TTDS"
    4      2     version (u16): 1 (labels only) or 2 (labels + float32 targets)
    6      1     dtype code (u8): 0 int8, 1 uint8, 2 int16, 3 float32
    7      1     rank R of one sample (u8), 1..4
    8      4     N, the number of records (u32)
    12     16    sample dims (u32[4]); the first R are used, the rest are 0
    28     4     version 1: reserved, 0; version 2: K, float32 targets per record (u32, >= 1)
    32     N x record: label (i32), then (version 2 only) K targets (f32[K], IEEE-754
           little-endian), then the sample, C order (prod(dims) * itemsize bytes)

A 32-byte header keeps it aligned and lets the firmware read one record at a time into a
fixed buffer of 4 + 4K + sample-bytes. Version 2 exists for regression (MSE) training: the label
of a version-2 record is 0 unless the writer gave one. `write_stream` writes version 1 whenever
there are no targets, so classification streams stay byte-identical to what older firmware reads;
readers (this module, kernels_c/boards/tt_ttds.c) accept both versions.

Named outputs (`task: outputs`, npz only; spec train.outputs): x (or x_train, x_test) and one target array per
output, y_<output> (or y_train_<output>, y_test_<output>), any shape with one row per sample; the Dataset keeps
them by name (t_train, t_test) and `target_rows` lays out the trained heads' targets back to back for the TTDS
version-2 stream, checking each against its output's shape.

Regression (`task: regression`, npz only): y_train / y_test are float targets [N, K] (or [N],
taken as K = 1); the Dataset then holds float32 y of shape [N, K], no class names, and a split made
here is a plain seeded shuffle (nothing to stratify on).
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tinytrain.pipeline.errors import UserError
from tinytrain.pipeline.spec_data import DataSpec


class DataError(UserError):
    """The dataset named by the spec cannot be used as given."""


@dataclass(frozen=True, eq=False)
class Dataset:
    x_train: np.ndarray     # float32 [N, ...]: [N, F], [N, T, F] or [N, H, W, C]
    y_train: np.ndarray     # int64 [N]; regression: float32 targets [N, K]
    x_test: np.ndarray
    y_test: np.ndarray
    class_names: list[str]  # index = label; regression: empty
    task: str = "classification"
    # task "outputs": output name -> float32 targets [N, ...] of the train / test split (y_* are then [N, 0])
    t_train: dict[str, np.ndarray] | None = None
    t_test: dict[str, np.ndarray] | None = None

    @property
    def regression(self) -> bool:
        """Float targets (no class labels): task regression, or outputs (one array per trained output)."""
        return self.task in ("regression", "outputs")

    @property
    def num_targets(self) -> int:
        """Float targets per sample (regression); 0 for classification."""
        return int(self.y_train.shape[1]) if self.regression else 0

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    def digest(self) -> str:
        """sha256 of the content (arrays with their dtype and shape, and the class names)."""
        h = hashlib.sha256()
        h.update(json.dumps(self.class_names).encode())
        if self.regression:  # classification digests stay what they were (cache keys)
            h.update(b"task:regression")
        if self.task == "outputs":
            h.update(b"task:outputs")
        arrays = [(n, getattr(self, n)) for n in ("x_train", "y_train", "x_test", "y_test")]
        for split in ("train", "test"):
            arrays += [(f"t_{split}/{k}", v) for k, v in sorted((getattr(self, f"t_{split}") or {}).items())]
        for name, a in arrays:
            a = np.ascontiguousarray(a)
            h.update(f"{name}:{a.dtype.str}:{list(a.shape)}".encode())
            h.update(a.tobytes())
        return h.hexdigest()


# ---- public API ---------------------------------------------------------------------------------

def load_dataset(spec: DataSpec) -> Dataset:
    if getattr(spec, "task", "classification") == "regression":
        return _load_regression(spec)
    if getattr(spec, "task", "classification") == "outputs":
        return _load_outputs(spec)
    raw = _LOADERS[spec.source](spec)
    split = raw.get("x_test") is not None
    names = raw["class_names"]
    parts = {k: raw[k] for k in ("x_train", "y_train", "x_test", "y_test") if raw.get(k) is not None}
    for key in ("x_train", "x_test"):
        if key in parts:
            parts[key] = _normalise(parts[key], spec, key)
    parts, names = _select_classes(parts, names, spec)
    if len(parts["y_train"]) == 0:
        raise DataError(f"{spec.path or spec.source}: no training samples (the data is empty"
                        f"{' after class selection' if spec.classes else ''})")
    if not split:
        parts = _stratified_split(parts["x_train"], parts["y_train"], spec.test_fraction, spec.split_seed)
    ds = Dataset(class_names=names, **parts)
    _check_dataset(ds)
    return ds


def input_files(spec: DataSpec) -> list[Path]:
    """The files `load_dataset(spec)` reads, in a fixed order, for the runner to hash into a cache
    key (digits: none, it ships with scikit-learn). Missing paths give the same errors as loading."""
    if spec.source == "digits":
        return []
    if spec.source == "npz":
        return [_existing(spec.path, "npz file", want_dir=False)]
    root = _existing(spec.path, "image folder", want_dir=True)
    return sorted(f for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")
                  for f in d.iterdir() if f.is_file() and not f.name.startswith(".")
                  and f.suffix.lower() in _IMAGE_SUFFIXES)


def calibration_samples(ds: Dataset, n: int, seed: int = 0) -> np.ndarray:
    """`n` samples drawn without replacement from the TRAIN split only (the test split must stay
    unseen by calibration so that reported accuracy is honest); all of them if there are fewer.
    Returned in train order, float32 [n, ...]."""
    if n <= 0:
        raise DataError(f"the number of calibration samples must be positive, got {n}")
    total = len(ds.x_train)
    if n >= total:
        return ds.x_train.copy()
    idx = np.sort(np.random.default_rng(seed).choice(total, size=n, replace=False))
    return ds.x_train[idx]


def check_compatible(ds: Dataset, input_shape: list[int] | tuple[int, ...], num_classes: int | None = None) -> None:
    """Raise a DataError when the data cannot feed the model: sample shape differs from the model
    input (batch dimension excluded), or labels exceed the model's number of outputs."""
    check_sample_shape(ds.sample_shape, input_shape)
    if ds.regression:
        # num_classes is the model's outputs per sample: a regression target must have one value per output.
        if num_classes is not None and ds.num_targets != num_classes:
            raise DataError(f"targets have {ds.num_targets} value(s) per sample but the model has {num_classes} "
                            f"output(s)", hint="y_train / y_test must be [N, outputs] float targets")
        return
    if num_classes is not None:
        top = int(max(ds.y_train.max(initial=-1), ds.y_test.max(initial=-1)))
        if top >= num_classes:
            raise DataError(f"labels go up to {top} but the model has {num_classes} classes (outputs)",
                            hint="select fewer classes with data.classes (relabelled to 0..k-1)")


def check_sample_shape(sample_shape: list[int] | tuple[int, ...], input_shape: list[int] | tuple[int, ...],
                       where: str = "data") -> None:
    """The one check (and message) that samples of `sample_shape` (batch excluded) fit a model input of
    `input_shape` (batch first); quantize's calibration and emulate-run's streams both use it."""
    want = tuple(int(d) for d in input_shape[1:])
    got = tuple(int(d) for d in sample_shape)
    if got != want:
        hint = ("set data.image_size / data.grayscale, or check the model" if len(want) == 3
                else "reshape x in the .npz to [N, " + ", ".join(map(str, want)) + "], or check the model")
        raise DataError(f"{where} shape does not match the model input: expected samples of "
                        f"{describe_sample_shape(want)} (model input {list(input_shape)}, batch first), got "
                        f"{describe_sample_shape(got)}", hint=hint)


# ---- sources --------------------------------------------------------------------------------------

def _load_digits(spec: DataSpec) -> dict:
    from sklearn.datasets import load_digits

    d = load_digits()
    return {"x_train": d.images.astype(np.float32)[..., None], "y_train": d.target.astype(np.int64),
            "class_names": [str(int(c)) for c in d.target_names]}


def _read_npz(spec: DataSpec) -> tuple[Path, dict[str, np.ndarray]]:
    path = _existing(spec.path, "npz file", want_dir=False)
    try:
        with np.load(path, allow_pickle=False) as z:
            return path, {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError) as e:
        raise DataError(f"{path}: not a readable .npz file ({e})") from None


def _load_npz(spec: DataSpec) -> dict:
    path, arrays = _read_npz(spec)
    have = sorted(arrays)
    if {"x_train", "y_train", "x_test", "y_test"} <= arrays.keys():
        out = {k: arrays[k] for k in ("x_train", "y_train", "x_test", "y_test")}
    elif {"x", "y"} <= arrays.keys():
        out = {"x_train": arrays["x"], "y_train": arrays["y"]}
    else:
        raise DataError(f"{path}: needs arrays x_train, y_train, x_test, y_test (or x, y to split here); "
                        f"it has {have}")
    for xk, yk in (("x_train", "y_train"), ("x_test", "y_test")):
        if xk in out:
            tag = xk.removeprefix("x_") if "x_train" in arrays else ""
            out[xk], out[yk] = _check_xy(out[xk], out[yk], f"{path} ({tag or 'x/y'})")
    labels = np.concatenate([out["y_train"], out.get("y_test", out["y_train"][:0])])
    out["class_names"] = _npz_class_names(arrays, labels, path)
    return out


def _load_regression(spec: DataSpec) -> Dataset:
    """npz with float targets: x as for classification, y [N, K] (or [N] -> K = 1) float32, finite."""
    if spec.source != "npz":  # the spec validates this too; a hand-made DataSpec may not have
        raise DataError(f"task regression needs source npz (float targets), not {spec.source!r}")
    path, arrays = _read_npz(spec)
    if {"x_train", "y_train", "x_test", "y_test"} <= arrays.keys():
        pairs = [("train", arrays["x_train"], arrays["y_train"]), ("test", arrays["x_test"], arrays["y_test"])]
    elif {"x", "y"} <= arrays.keys():
        pairs = [("x/y", arrays["x"], arrays["y"])]
    else:
        raise DataError(f"{path}: needs arrays x_train, y_train, x_test, y_test (or x, y to split here); "
                        f"it has {sorted(arrays)}")
    out = {}
    for tag, x, y in pairs:
        where = f"{path} ({tag})"
        if x.dtype.kind not in "iuf":
            raise DataError(f"{where}: x has dtype {x.dtype}; expected a numeric array (float or integer)")
        _check_x_rank(x, where)
        if y.dtype.kind not in "iuf":
            raise DataError(f"{where}: y has dtype {y.dtype}; regression targets must be numbers")
        if y.ndim == 1:
            y = y[:, None]
        if y.ndim != 2 or len(y) != len(x) or y.shape[1] == 0:
            raise DataError(f"{where}: y has shape {list(y.shape)}; regression expects [N, K] float targets "
                            f"with one row per sample ({len(x)})")
        y = y.astype(np.float32)
        if not np.all(np.isfinite(y)):
            raise DataError(f"{where}: {int(y.size - np.count_nonzero(np.isfinite(y)))} targets are NaN or infinite")
        key = "train" if tag == "x/y" else tag
        out[f"x_{key}"], out[f"y_{key}"] = _normalise(x, spec, f"x_{key}"), y
    if "x_test" not in out:
        if len(out["y_train"]) < 2:
            raise DataError(f"{path}: {len(out['y_train'])} sample(s) cannot be split into train and test")
        from sklearn.model_selection import train_test_split

        # Targets are continuous: nothing to stratify on, a seeded shuffle split.
        x_tr, x_te, y_tr, y_te = train_test_split(out["x_train"], out["y_train"], test_size=spec.test_fraction,
                                                  random_state=spec.split_seed)
        out = {"x_train": x_tr, "y_train": y_tr, "x_test": x_te, "y_test": y_te}
    if out["y_train"].shape[1] != out["y_test"].shape[1]:
        raise DataError(f"{path}: train targets have {out['y_train'].shape[1]} values per sample, test targets "
                        f"{out['y_test'].shape[1]}")
    if len(out["y_train"]) == 0:
        raise DataError(f"{path}: no training samples (the data is empty)")
    ds = Dataset(class_names=[], task="regression", **out)
    _check_dataset(ds)
    return ds


def _load_outputs(spec: DataSpec) -> Dataset:
    """npz with one target array per output: x_train, x_test with y_train_<output>, y_test_<output> (the file's
    split), or x with y_<output> (a seeded shuffle split here). Targets are numbers, one row per sample, any
    shape (checked against each trained output by `target_rows`)."""
    if spec.source != "npz":
        raise DataError(f"task outputs needs source npz (one y array per output), not {spec.source!r}")
    path, arrays = _read_npz(spec)
    if {"x_train", "x_test"} <= arrays.keys():
        parts = [("train", arrays["x_train"], "y_train_"), ("test", arrays["x_test"], "y_test_")]
    elif "x" in arrays:
        parts = [("train", arrays["x"], "y_")]
    else:
        raise DataError(f"{path}: needs x_train and x_test (or x, to split here) and one y array per trained output; "
                        f"it has {sorted(arrays)}")
    out: dict[str, Any] = {}
    for split, x, prefix in parts:
        where = f"{path} ({split if len(parts) > 1 else 'x/y'})"
        if x.dtype.kind not in "iuf":
            raise DataError(f"{where}: x has dtype {x.dtype}; expected a numeric array (float or integer)")
        _check_x_rank(x, where)
        ts = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix) and len(k) > len(prefix)}
        if not ts:
            raise DataError(f"{path}: no target arrays: expected one {prefix}<output> array per trained output; "
                            f"it has {sorted(arrays)}")
        for name, t in ts.items():
            if t.dtype.kind not in "iuf" or t.ndim < 1 or len(t) != len(x):
                raise DataError(f"{where}: {prefix}{name} has shape {list(t.shape)} dtype {t.dtype}; expected "
                                f"numbers with one row per sample ({len(x)})")
            if not np.all(np.isfinite(t)):
                raise DataError(f"{where}: {prefix}{name} has NaN or infinite values")
        out[f"x_{split}"] = _normalise(x, spec, f"x_{split}")
        out[f"t_{split}"] = {k: v.astype(np.float32) for k, v in ts.items()}
    if "x_test" not in out:
        if len(out["x_train"]) < 2:
            raise DataError(f"{path}: {len(out['x_train'])} sample(s) cannot be split into train and test")
        from sklearn.model_selection import train_test_split

        names = sorted(out["t_train"])
        cut = train_test_split(out["x_train"], *(out["t_train"][n] for n in names), test_size=spec.test_fraction,
                               random_state=spec.split_seed)
        out = {"x_train": cut[0], "x_test": cut[1], "t_train": dict(zip(names, cut[2::2])),
               "t_test": dict(zip(names, cut[3::2]))}
    if sorted(out["t_train"]) != sorted(out["t_test"]):
        raise DataError(f"{path}: train targets are for outputs {sorted(out['t_train'])} but test targets for "
                        f"{sorted(out['t_test'])}")
    ds = Dataset(class_names=[], task="outputs", y_train=np.zeros((len(out["x_train"]), 0), np.float32),
                 y_test=np.zeros((len(out["x_test"]), 0), np.float32), **out)
    _check_dataset(ds)
    return ds


def single_target(ds: Dataset, classification: bool) -> Dataset:
    """Named-output data (task outputs) for a program that trains one output with train.loss's layout (one
    cross-entropy head reads integer labels, one MSE head the regression targets): its single target array as
    labels or as float targets [N, K]."""
    names = sorted(ds.t_train or {})
    if len(names) != 1:
        raise DataError(f"the program trains one output but the data has targets for {names}",
                        hint="keep one y_<output> array, or name the outputs in train.outputs")
    tr, te = ds.t_train[names[0]], ds.t_test[names[0]]
    if not classification:
        return Dataset(ds.x_train, tr.reshape(len(tr), -1), ds.x_test, te.reshape(len(te), -1), [], "regression")
    ys = [_check_xy(x, y, f"targets y_{names[0]} ({split})")[1]
          for split, x, y in (("train", ds.x_train, tr), ("test", ds.x_test, te))]
    k = int(max(ys[0].max(initial=-1), ys[1].max(initial=-1))) + 1
    return Dataset(ds.x_train, ys[0], ds.x_test, ys[1], [str(i) for i in range(k)])


def target_rows(ds: Dataset, heads: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """The float32 target rows [N, K] of the train and test split for the trained `heads` (codegen's io_layout
    "heads": output, loss, shape): each head's targets back to back (stages/train/losses.py), a class index as one value.
    Every mismatch is one line: a missing array (the arrays there are named), a shape that differs from the
    output's, a class out of range."""
    have = sorted(ds.t_train or {})
    if ds.task != "outputs":
        raise DataError("the firmware trains named outputs (train.outputs) but the data has no per-output targets",
                        hint="set data.task: outputs with one y_<output> array per trained output")
    cols: dict[str, list[np.ndarray]] = {"train": [], "test": []}
    for h in heads:
        name, shape = str(h["output"]), [int(d) for d in h["shape"]]
        if name not in have:
            raise DataError(f"the data has no targets for output {name!r}: expected an array y_{name} (or "
                            f"y_train_{name} / y_test_{name}); it has targets for {have}")
        for split in ("train", "test"):
            t = getattr(ds, f"t_{split}")[name]
            if h["loss"] == "cross_entropy":
                if t.ndim != 1 or np.any(t != np.round(t)) or t.min(initial=0) < 0 or t.max(initial=0) >= shape[-1]:
                    raise DataError(f"targets for output {name!r} ({split}) must be class indices [N] in "
                                    f"0..{shape[-1] - 1} (cross_entropy); got shape {list(t.shape)}, values "
                                    f"{float(t.min(initial=0)):g}..{float(t.max(initial=0)):g}")
                cols[split].append(t.reshape(-1, 1))
                continue
            want = shape[1:] if len(shape) > 1 else shape
            if list(t.shape[1:]) != want and not (t.ndim == 1 and int(np.prod(want)) == 1):
                raise DataError(f"data shape does not match output {name!r}: expected targets of {want} per sample "
                                f"(the output is {shape}), got {list(t.shape[1:])}")
            cols[split].append(t.reshape(len(t), -1))
    return (np.concatenate(cols["train"], axis=1).astype(np.float32),
            np.concatenate(cols["test"], axis=1).astype(np.float32))


def _load_images(spec: DataSpec) -> dict:
    root = _existing(spec.path, "image folder", want_dir=True)
    class_dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not class_dirs:
        raise DataError(f"{root}: no class subfolders; expected one subfolder of images per class")
    xs, ys = [], []
    for label, d in enumerate(class_dirs):
        files = sorted(p for p in d.iterdir() if p.is_file() and not p.name.startswith(".")
                       and p.suffix.lower() in _IMAGE_SUFFIXES)
        if not files:
            raise DataError(f"{d}: no images (supported: {', '.join(sorted(_IMAGE_SUFFIXES))})")
        for f in files:
            xs.append(_prepare_image(_read_image(f), spec, f))
            ys.append(label)
    shapes = sorted({x.shape for x in xs})
    if len(shapes) > 1:
        raise DataError(f"{root}: images have different sizes {[list(s) for s in shapes[:4]]}",
                        hint="set data.image_size: [height, width] to resize them")
    return {"x_train": np.stack(xs).astype(np.float32), "y_train": np.asarray(ys, dtype=np.int64),
            "class_names": [d.name for d in class_dirs]}


_LOADERS = {"digits": _load_digits, "npz": _load_npz, "images": _load_images}


def _existing(path: Path | None, what: str, *, want_dir: bool) -> Path:
    if path is None:
        raise DataError(f"data.path is required: the {what}")
    path = Path(path)
    if not path.exists():
        raise DataError(f"data.path {path} does not exist (the {what})")
    if want_dir != path.is_dir():
        raise DataError(f"data.path {path} is {'a file' if want_dir else 'a folder'}; expected the {what}")
    return path


def _check_xy(x: np.ndarray, y: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
    if x.dtype.kind not in "iuf":
        raise DataError(f"{where}: x has dtype {x.dtype}; expected a numeric array (float or integer)")
    _check_x_rank(x, where)
    if y.ndim != 1 or len(y) != len(x):
        raise DataError(f"{where}: y has shape {list(y.shape)}; expected 1-D with one label per sample ({len(x)})")
    if y.dtype.kind == "f" and np.all(np.isfinite(y)) and np.all(y == np.round(y)):
        y = y.astype(np.int64)
    if y.dtype.kind not in "iu":
        raise DataError(f"{where}: y has dtype {y.dtype}; expected integer class labels")
    if len(y) and int(y.min()) < 0:
        raise DataError(f"{where}: labels must be >= 0, found {int(y.min())}")
    return x, y.astype(np.int64)


# The rank of one sample -> what it usually is (for messages); a sample has 1..4 dimensions (the TTDS limit).
_SAMPLE_KINDS = {1: "[N, F] features", 2: "[N, T, F] sequences", 3: "[N, H, W, C] images", 4: "[N, D, H, W, C]"}


def _check_x_rank(x: np.ndarray, where: str) -> None:
    if not 2 <= x.ndim <= 5:
        raise DataError(f"{where}: x has shape {list(x.shape)}; expected one sample per row: "
                        f"{', '.join(_SAMPLE_KINDS[r] for r in (1, 2, 3))}",
                        hint="for one value per sample use x[:, None]" if x.ndim == 1 else None)


def describe_sample_shape(shape: list[int] | tuple[int, ...]) -> str:
    """`[64] (features)`: a sample shape with what its rank usually holds, for messages."""
    kind = {1: "features", 2: "a sequence [T, F]", 3: "an image [H, W, C]"}.get(len(shape))
    return f"{list(shape)}" + (f" ({kind})" if kind else "")


def _npz_class_names(arrays: dict, labels: np.ndarray, path: Path) -> list[str]:
    k = int(labels.max()) + 1 if len(labels) else 0
    if "class_names" not in arrays:
        return [str(i) for i in range(k)]
    names = [str(n) for n in arrays["class_names"].tolist()]
    if len(names) < k:
        raise DataError(f"{path}: class_names has {len(names)} entries but labels go up to {k - 1}")
    return names


# ---- images ---------------------------------------------------------------------------------------

_PNM_SUFFIXES = {".pgm", ".ppm", ".pnm"}
_PILLOW_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif"}
_IMAGE_SUFFIXES = _PNM_SUFFIXES | _PILLOW_SUFFIXES | {".npy"}


def _read_image(path: Path) -> np.ndarray:
    """Raw pixels as float32 [H, W, C] (C = 1 or 3), values 0..255."""
    suffix = path.suffix.lower()
    try:
        if suffix in _PNM_SUFFIXES:
            img = _read_pnm(path.read_bytes())
        elif suffix == ".npy":
            img = np.load(path, allow_pickle=False)
        else:
            img = _read_with_pillow(path)
    except DataError:
        raise
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: cannot read image ({e})") from None
    if img.ndim == 2:
        img = img[..., None]
    if img.ndim != 3 or img.shape[2] not in (1, 3, 4) or img.dtype.kind not in "iuf":
        raise DataError(f"{path}: image array of shape {list(img.shape)} and dtype {img.dtype}; "
                        "expected [H, W] or [H, W, 1|3|4] numbers")
    return img[..., :3].astype(np.float32)   # alpha is dropped: models see colour only


def _read_with_pillow(path: Path) -> np.ndarray:
    try:
        from PIL import Image
    except ImportError:
        raise DataError(f"{path}: reading {path.suffix} images needs Pillow, which is not installed",
                        hint="pip install Pillow, or convert the images to .pgm/.ppm/.npy") from None
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB" if im.mode not in ("L", "I;16", "I") else im.mode))


def _read_pnm(data: bytes) -> np.ndarray:
    """Netpbm P2/P3 (ASCII) and P5/P6 (binary) grey and colour images."""
    magic = data[:2]
    if magic not in (b"P2", b"P3", b"P5", b"P6"):
        raise ValueError(f"not a PGM/PPM file (magic {magic!r})")
    channels = 3 if magic in (b"P3", b"P6") else 1
    tokens, pos = _pnm_header(data, 3)
    width, height, maxval = tokens
    if not (0 < maxval < 65536) or width <= 0 or height <= 0:
        raise ValueError(f"bad header: width {width}, height {height}, maxval {maxval}")
    count = width * height * channels
    if magic in (b"P2", b"P3"):
        pixels = np.array(data[pos:].split()[:count], dtype=np.int64)
    else:
        dtype = np.dtype(">u2") if maxval > 255 else np.dtype("u1")
        pixels = np.frombuffer(data, dtype=dtype, count=min(count, (len(data) - pos) // dtype.itemsize), offset=pos)
    if pixels.size != count:
        raise ValueError(f"truncated: {pixels.size} of {count} values")
    img = pixels.reshape(height, width, channels).astype(np.float32)
    return img if maxval == 255 else img * (255.0 / maxval)


def _pnm_header(data: bytes, n: int) -> tuple[list[int], int]:
    """The n integers after the magic, skipping # comments; returns them and the offset of the pixel data
    (one whitespace byte after the last header token)."""
    values, pos = [], 2
    while len(values) < n:
        while pos < len(data) and data[pos:pos + 1].isspace():
            pos += 1
        if data[pos:pos + 1] == b"#":
            pos = data.find(b"\n", pos) + 1 or len(data)
            continue
        start = pos
        while pos < len(data) and data[pos:pos + 1].isdigit():
            pos += 1
        if start == pos:
            raise ValueError("malformed header")
        values.append(int(data[start:pos]))
    return values, pos + 1


def _prepare_image(img: np.ndarray, spec: DataSpec, path: Path) -> np.ndarray:
    if spec.grayscale and img.shape[2] == 3:
        img = img @ np.array([[0.299], [0.587], [0.114]], dtype=np.float32)
    elif not spec.grayscale and img.shape[2] == 1:
        img = np.repeat(img, 3, axis=2)
    if spec.image_size is not None and tuple(img.shape[:2]) != tuple(spec.image_size):
        img = resize_bilinear(img, spec.image_size)
    return img


def resize_bilinear(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """[H, W, C] -> [h, w, C], half-pixel centres, edge clamp (tf.image.resize 'bilinear', no antialias)."""
    def axis(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pos = np.clip((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0, n_in - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, n_in - 1)
        return lo, hi, (pos - lo).astype(np.float32)

    (y0, y1, fy), (x0, x1, fx) = axis(img.shape[0], size[0]), axis(img.shape[1], size[1])
    rows = img[y0] * (1 - fy)[:, None, None] + img[y1] * fy[:, None, None]
    return rows[:, x0] * (1 - fx)[None, :, None] + rows[:, x1] * fx[None, :, None]


# ---- common steps ---------------------------------------------------------------------------------

def _normalise(x: np.ndarray, spec: DataSpec, where: str) -> np.ndarray:
    x = x.astype(np.float32) * np.float32(spec.effective_scale()) + np.float32(spec.offset)
    bad = ~np.isfinite(x)
    if bad.any():
        first = int(np.argwhere(bad)[0][0])
        raise DataError(f"{spec.path or spec.source} ({where}): {int(bad.sum())} values are NaN or infinite (first in sample {first})")
    return x


def _select_classes(parts: dict, names: list[str], spec: DataSpec) -> tuple[dict, list[str]]:
    if spec.classes is None:
        return parts, names
    present = set(np.unique(np.concatenate([parts[k] for k in ("y_train", "y_test") if k in parts])).tolist())
    missing = [c for c in spec.classes if c not in present]
    if missing:
        raise DataError(f"data.classes asks for {missing}, which the data does not have; "
                        f"labels present: {sorted(present)}")
    keep = np.asarray(spec.classes, dtype=np.int64)
    out = dict(parts)
    for xk, yk in (("x_train", "y_train"), ("x_test", "y_test")):
        if yk not in parts:
            continue
        mask = np.isin(parts[yk], keep)
        y = parts[yk][mask]
        if spec.relabel:
            y = _relabel_table(spec.classes)[y]
        out[xk], out[yk] = parts[xk][mask], y.astype(np.int64)
    # Without relabelling the labels keep their raw values, so names stay indexed by raw label.
    labels = spec.classes if spec.relabel else range(max(spec.classes) + 1)
    return out, [names[c] if c < len(names) else str(c) for c in labels]


def _relabel_table(classes: list[int]) -> np.ndarray:
    """Lookup raw label -> new label: position in `classes` as given (classes [8, 3]: 8->0, 3->1)."""
    table = np.full(max(classes) + 1, -1, dtype=np.int64)
    table[classes] = np.arange(len(classes))
    return table


def _stratified_split(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int) -> dict:
    """scikit-learn's stratified `train_test_split`, so that a model trained on a split made the usual
    way (e.g. tests/fixtures/digits_cnn_*) is evaluated on exactly its held-out samples."""
    from sklearn.model_selection import train_test_split

    counts = np.bincount(y)
    if counts[counts > 0].min() < 2:
        rare = [int(c) for c in np.flatnonzero((counts > 0) & (counts < 2))]
        raise DataError(f"classes {rare} have a single sample: a stratified split needs at least 2 per class")
    n_test = int(np.ceil(len(y) * test_fraction))
    n_classes = int((counts > 0).sum())
    if n_test < n_classes or len(y) - n_test < n_classes:
        raise DataError(f"{len(y)} samples of {n_classes} classes cannot be split with test_fraction "
                        f"{test_fraction}: each split needs at least one sample per class",
                        hint="add samples, or change data.test_fraction")
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)
    return {"x_train": x_tr, "y_train": y_tr, "x_test": x_te, "y_test": y_te}


def _check_dataset(ds: Dataset) -> None:
    if len(ds.x_train) == 0:
        raise DataError("the training split is empty: no samples left after loading and class selection")
    if len(ds.x_test) == 0:
        raise DataError("the test split is empty: too few samples per class to hold any out",
                        hint="add samples, or raise data.test_fraction")
    if ds.x_train.shape[1:] != ds.x_test.shape[1:]:
        raise DataError(f"train samples have shape {list(ds.x_train.shape[1:])} but test samples "
                        f"{list(ds.x_test.shape[1:])}")


# ---- streaming format -----------------------------------------------------------------------------

STREAM_MAGIC = b"TTDS"
STREAM_VERSION = 1             # labels only
STREAM_VERSION_TARGETS = 2     # labels + K float32 targets per record
_STREAM_HEADER = struct.Struct("<4sHBBI4II")
_STREAM_DTYPES = {0: np.dtype("i1"), 1: np.dtype("u1"), 2: np.dtype("<i2"), 3: np.dtype("<f4")}
_STREAM_CODES = {v: k for k, v in _STREAM_DTYPES.items()}


def write_stream(path: Path, x: np.ndarray, y: np.ndarray | None, targets: np.ndarray | None = None) -> None:
    """Write samples `x` [N, ...] (int8, uint8, int16 or float32; usually int8 already quantized
    with the model's input parameters), labels `y` [N] (None: all 0, for regression) and optional
    float32 `targets` [N, K] in the TTDS format of the module docstring (version 2 with targets,
    version 1 without)."""
    x = np.asarray(x)
    y = np.zeros(len(x), np.int32) if y is None else np.asarray(y)
    code = _STREAM_CODES.get(x.dtype.newbyteorder("<") if x.dtype.itemsize > 1 else x.dtype)
    if code is None:
        raise DataError(f"stream samples must be int8, uint8, int16 or float32, not {x.dtype}")
    if not 2 <= x.ndim <= 5:
        raise DataError(f"stream samples must be [N, d1..dR] with 1 <= R <= 4, got shape {list(x.shape)}")
    if y.shape != (len(x),) or y.dtype.kind not in "iu":
        raise DataError(f"stream labels must be 1-D integers, one per sample ({len(x)}); got "
                        f"shape {list(y.shape)} dtype {y.dtype}")
    k = 0
    if targets is not None:
        t = np.asarray(targets)
        if t.ndim != 2 or t.shape[0] != len(x) or t.shape[1] < 1 or t.dtype.kind not in "iuf":
            raise DataError(f"stream targets must be numbers [N, K] with K >= 1, one row per sample ({len(x)}); "
                            f"got shape {list(t.shape)} dtype {t.dtype}")
        k = int(t.shape[1])
    dims = list(x.shape[1:]) + [0] * (5 - x.ndim)
    version = STREAM_VERSION_TARGETS if k else STREAM_VERSION
    header = _STREAM_HEADER.pack(STREAM_MAGIC, version, code, x.ndim - 1, len(x), *dims, k)
    cols = [y.astype("<i4").reshape(-1, 1).view(np.uint8)]
    if k:
        cols.append(np.ascontiguousarray(t, dtype="<f4").view(np.uint8).reshape(len(x), 4 * k))
    cols.append(np.ascontiguousarray(x, dtype=_STREAM_DTYPES[code]).reshape(len(x), -1).view(np.uint8))
    Path(path).write_bytes(header + np.concatenate(cols, axis=1).tobytes())


def read_stream(path: Path, targets: bool = False):
    """Inverse of write_stream: (x [N, ...], y int64 [N]); with `targets=True` (x, y, t) where t is
    float32 [N, K] for a version-2 stream and None for version 1."""
    data = Path(path).read_bytes()
    if len(data) < _STREAM_HEADER.size or data[:4] != STREAM_MAGIC:
        raise DataError(f"{path}: not a TTDS data stream")
    magic, version, code, rank, n, *rest = _STREAM_HEADER.unpack_from(data)
    k = rest[4]
    if (version not in (STREAM_VERSION, STREAM_VERSION_TARGETS) or code not in _STREAM_DTYPES
            or not 1 <= rank <= 4 or (version == STREAM_VERSION_TARGETS) != (k > 0)):
        raise DataError(f"{path}: unsupported TTDS stream (version {version}, dtype code {code}, rank {rank}, "
                        f"targets {k})")
    dims, dtype = rest[:rank], _STREAM_DTYPES[code]
    record = 4 + 4 * k + int(np.prod(dims)) * dtype.itemsize
    body = data[_STREAM_HEADER.size:]
    if len(body) != n * record:
        raise DataError(f"{path}: truncated or padded TTDS stream ({len(body)} bytes of records, expected {n * record})")
    rows = np.frombuffer(body, dtype=np.uint8).reshape(n, record)
    y = rows[:, :4].copy().view("<i4").reshape(n).astype(np.int64)
    t = rows[:, 4:4 + 4 * k].copy().view("<f4").reshape(n, k).astype(np.float32) if k else None
    x = rows[:, 4 + 4 * k:].copy().view(dtype).reshape(n, *dims)
    return (x, y, t) if targets else (x, y)
