"""Coverage of real third-party models: how far does `tinytrain build` get on the models people have?

    python bench/coverage.py                    # every model, default timeout 300 s per model
    python bench/coverage.py --only face_det    # models whose name contains this text
    python bench/coverage.py --timeout 120
    python bench/coverage.py --only alexa --merge   # re-run rows, keep the others of bench/coverage.json
    python bench/coverage.py --precision fp16-mixed --board mps3-an547   # bench/coverage_fp16-mixed.{md,json}

The models come from the package index only (plus one control, below), downloaded with pip into a cache folder (never committed):
  - the .tflite files inside the MediaPipe wheel (`mediapipe==0.10.14`, the version tests/fixtures/thirdparty
    copies its three models from),
  - microWakeWord's streaming keyword-spotting models, as shipped in the `pymicro-wakeword` wheel,
  - the example model inside the TFLite Micro wheel (`tflite-micro`).
The TFLite Micro wheel ships no other model; `pymicro-wakeword` is the only package on the index whose wheel holds
microWakeWord's .tflite files.
(`--cache` sets the folder; default ~/.cache/tinytrain-coverage.)
When load's error suggests a cut (`model.outputs`, stages/model/prune.py) that leaves unsupported ops out, the model is
built a second time with that cut, as a user following the message would.

For each model the benchmark writes a spec (board stm32f746-disco, `scheme: auto`, everything else default) and
an .npz of synthetic data shaped like the model's first input: smooth random images for 4-D inputs, uniform
noise otherwise; a stateful streaming model (resource variables) gets `model.sequence_length: SEQUENCE` and
sequences of that many such inputs per sample. The targets follow the first output: a SOFTMAX over K >= 2 classes
gets random class labels (cross-entropy), an output made by a sigmoid random 0/1 labels (binary cross-entropy on its
logits, `train.outputs`: MSE through a saturated sigmoid has a zero gradient), any other output random float targets
of its size in [0, 1] (regression, MSE); a model with several outputs trains its first one with MSE (`train.outputs`, as load's message suggests; data.task
outputs). The data is synthetic,
so loss before/after shows that training runs, not that the model gets better at its real task.

Each build runs as `tinytrain build --json` in a subprocess with a private, empty cache and a timeout. Recorded
per model: the furthest stage that completed, the board's SRAM/flash use (cross-compile/size.json), the loss
(epoch means, emulate-run/run.json) and the one-line reason a build stopped. Results: a rich table on the
terminal, bench/coverage.json and bench/coverage.md (a Markdown table, also pasted into the README).

`--precision int8|fp32|fp16-mixed` states `train.precision` in every spec (left out, the spec leaves it out: int8
for these models, the default) and writes bench/coverage_<precision>.json/.md instead; `--board` sets the board
(fp16-mixed needs one with half precision: `host` or `mps3-an547`). A float precision of a stateless int8 model
file trains its dequantized float copy, made by the pipeline's quantize stage (stages/quant/dequantize.py), and the
row says so (`dequantized`, from the stage's metrics); a stateful one (microWakeWord's) has no float copy: quantize
refuses it with one line, the row's reason. An fp16-mixed row
also gives the training arena against the fp32 graph of the same plan (autodiff/precision.json) and the final loss
scale with the steps it skipped.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
STAGES = ("load", "quantize", "sparse-plan", "autodiff", "reorder", "codegen", "cross-compile", "emulate-run")
BOARD = "stm32f746-disco"
# (pip requirement, label): the wheels whose .tflite files are benchmarked.
WHEELS = (("mediapipe==0.10.14", "mediapipe"), ("pymicro-wakeword", "microWakeWord"), ("tflite-micro", "tflm"))
N_TRAIN, N_TEST = 48, 16
# Stateful streaming models (microWakeWord): invocations per training sample (model.sequence_length). A window,
# not the whole receptive field (hey_jarvis' buffers span ~50 invocations): the state before it is the initial one.
SEQUENCE = 16


@dataclass
class Row:
    model: str
    source: str
    inputs: list = field(default_factory=list)       # [[shape], dtype] per input
    outputs: list = field(default_factory=list)
    task: str = ""
    loss: str = ""                                    # the trained head's loss (mse, bce, cross_entropy)
    furthest: str = "-"                               # last stage that completed
    exit_code: int | None = None
    reason: str = ""                                  # first line of the error, or "" when it trained
    board: str = ""
    sram_used: int | None = None
    flash_used: int | None = None
    loss_before: float | None = None
    loss_after: float | None = None
    seconds: float = 0.0
    cut: list | None = None                           # model.outputs, when the build was retried with a cut
    suggested_cut: list | None = None                 # the cut load's error suggested (see stages/model/prune.py)
    dequantized: bool = False                         # a float precision of an int8 model: its dequantized copy
    arena: int | None = None                          # fp16-mixed: the training arena (bytes) ...
    arena_fp32: int | None = None                     # ... and the fp32 graph's of the same plan
    loss_scale: float | None = None                   # fp16-mixed: the final loss scale ...
    skipped_steps: int | None = None                  # ... and the steps skipped for an Inf/NaN gradient


# ---- models ---------------------------------------------------------------------------------------

def fetch_models(cache: Path) -> tuple[list[tuple[Path, str]], dict[str, str]]:
    """Download each wheel with pip (no dependencies) and unzip its .tflite files; return (file, label) pairs
    and the wheel versions."""
    wheels, models, versions = cache / "wheels", [], {}
    wheels.mkdir(parents=True, exist_ok=True)
    for req, label in WHEELS:
        name = req.split("==")[0].replace("-", "_")
        have = sorted(wheels.glob(f"{name}-*.whl"))
        if "==" in req:
            have = [w for w in have if w.name.split("-")[1] == req.split("==")[1]]
        if not have:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", req, "-d", str(wheels)],
                           check=True)
            have = sorted(wheels.glob(f"{name}-*.whl"))
        whl = have[-1]
        versions[label] = whl.name.split("-")[1]
        dest = cache / "models" / label
        with zipfile.ZipFile(whl) as z:
            for info in z.infolist():
                if info.filename.endswith(".tflite"):
                    target = dest / Path(info.filename).name
                    if not target.exists():
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(z.read(info))
                    models.append((target, label))
    return models, versions


def model_io(path: Path) -> tuple[list, list]:
    """([shape, dtype] of each input, of each output) of subgraph 0, read from the flatbuffer directly (the
    model may be one tinytrain cannot load). An output made by SOFTMAX is marked [shape, dtype, "softmax"]."""
    import tflite
    from tflite.BuiltinOperator import BuiltinOperator as BO
    from tflite.TensorType import TensorType as TT

    names = {v: k.lower() for k, v in vars(TT).items() if not k.startswith("_")}
    m = tflite.Model.GetRootAs(path.read_bytes(), 0)
    sg = m.Subgraphs(0)

    def desc(i: int) -> list:
        t = sg.Tensors(i)
        return [[int(d) for d in t.ShapeAsNumpy()] if t.ShapeLength() else [], names.get(t.Type(), str(t.Type()))]

    softmax = set()
    for j in range(sg.OperatorsLength()):
        op = sg.Operators(j)
        oc = m.OperatorCodes(op.OpcodeIndex())
        if max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode()) == BO.SOFTMAX:
            softmax.update(int(t) for t in op.OutputsAsNumpy())
    return ([desc(i) for i in sg.InputsAsNumpy()],
            [desc(i) + (["softmax"] if int(i) in softmax else []) for i in sg.OutputsAsNumpy()])


def is_stateful(path: Path) -> bool:
    """Whether subgraph 0 reads resource variables (a streaming model: its spec needs model.sequence_length)."""
    import tflite
    from tflite.BuiltinOperator import BuiltinOperator as BO

    m = tflite.Model.GetRootAs(path.read_bytes(), 0)
    sg = m.Subgraphs(0)
    for j in range(sg.OperatorsLength()):
        oc = m.OperatorCodes(sg.Operators(j).OpcodeIndex())
        if max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode()) == BO.READ_VARIABLE:
            return True
    return False


def output_names(path: Path) -> list[str]:
    """Names of subgraph 0's outputs (the names train.outputs uses)."""
    import tflite

    sg = tflite.Model.GetRootAs(path.read_bytes(), 0).Subgraphs(0)
    return [sg.Tensors(int(i)).Name().decode() for i in sg.OutputsAsNumpy()]


# ---- spec and data --------------------------------------------------------------------------------

def smooth_images(shape: tuple[int, ...], n: int, rng: np.random.Generator) -> np.ndarray:
    """n images [H, W, C] in [0, 1]: 8x8 coarse noise upsampled (large-scale structure) plus 10% fine noise."""
    h, w, c = shape
    coarse = rng.uniform(0, 1, size=(n, 8, 8, c))
    big = np.repeat(np.repeat(coarse, -(-h // 8), axis=1), -(-w // 8), axis=2)[:, :h, :w, :]
    return np.clip(0.9 * big + 0.1 * rng.uniform(0, 1, size=(n, h, w, c)), 0, 1).astype(np.float32)


def sigmoid_output(model: Path, cut: list | None = None) -> str | None:
    """The first output's name as tinytrain loads it when a LOGISTIC makes it (a probability: microWakeWord's
    score, read as the int8 source of its uint8 re-encoding), else None (also when the model does not load)."""
    from tinytrain.stages.model.tflite_reader import read_model

    try:
        g = read_model(model, outputs=cut) if cut else read_model(model)
    except Exception:
        return None
    out = g.outputs[0]
    return out if any(op.type == "logistic" and out in op.outputs for op in g.ops) else None


def write_data(path: Path, inputs: list, outputs: list, seed: int = 0, steps: int | None = None,
               first_output: str | None = None, sigmoid: str | None = None) -> str:
    """Synthetic .npz for the first input and first output; returns the task: classification when that output
    is a softmax over K >= 2 classes, else regression on all its values. With `steps` (a stateful model) a sample
    is a sequence of that many inputs. A model with several outputs trains its first one (`first_output`, its
    name) with MSE, as load's message suggests: task outputs, y_<split>_<name>. A probability made by a sigmoid
    (`sigmoid`: that output's loaded name) gets random 0/1 labels, trained with bce on its logits (task outputs,
    spec_text): MSE through a saturated sigmoid has an exactly zero gradient (microWakeWord's score is 0 on noise
    input), so such a row would train nothing."""
    rng = np.random.default_rng(seed)
    shape = ((steps,) if steps else ()) + tuple(max(1, d) for d in inputs[0][0][1:])
    n = N_TRAIN + N_TEST
    x = smooth_images(shape, n, rng) if len(shape) == 3 else rng.uniform(0, 1, size=(n, *shape)).astype(np.float32)
    out_shape = outputs[0][0]
    k = int(np.prod(out_shape[1:])) if len(out_shape) > 1 else 1
    if sigmoid:
        t = rng.integers(0, 2, size=(n, *[max(1, d) for d in out_shape[1:]])).astype(np.float32)
        np.savez(path, x_train=x[:N_TRAIN], x_test=x[N_TRAIN:], **{f"y_train_{sigmoid}": t[:N_TRAIN],
                                                                    f"y_test_{sigmoid}": t[N_TRAIN:]})
        return "outputs"
    if len(outputs) > 1 and first_output:
        t = rng.uniform(0, 1, size=(n, *[max(1, d) for d in out_shape[1:]])).astype(np.float32)
        np.savez(path, x_train=x[:N_TRAIN], x_test=x[N_TRAIN:], **{f"y_train_{first_output}": t[:N_TRAIN],
                                                                    f"y_test_{first_output}": t[N_TRAIN:]})
        return "outputs"
    if outputs[0][2:] == ["softmax"] and k >= 2:
        task, y = "classification", np.arange(n) % k
        rng.shuffle(y)
    else:
        task, y = "regression", rng.uniform(0, 1, size=(n, k)).astype(np.float32)
    np.savez(path, x_train=x[:N_TRAIN], y_train=y[:N_TRAIN], x_test=x[N_TRAIN:], y_test=y[N_TRAIN:])
    return task


def spec_text(name: str, model: Path, data: Path, task: str, out_dir: Path, cut: list | None = None,
              sequence_length: int | None = None, first_output: str | None = None, sigmoid: str | None = None,
              board: str = BOARD, precision: str | None = None) -> str:
    loss = {"outputs": [{"name": sigmoid, "loss": "bce"}]} if sigmoid else \
        {"outputs": [{"name": first_output, "loss": "mse"}]} if task == "outputs" else \
        {"loss": "cross_entropy" if task == "classification" else "mse"}
    spec = {
        "name": name,
        "model": {"path": str(model)} | ({"outputs": cut} if cut else {})
                 | ({"sequence_length": sequence_length} if sequence_length else {}),
        "data": {"source": "npz", "path": str(data), "task": task},
        "train": {"update": {"scheme": "auto"}, **loss, "epochs": 2}
                 | ({"precision": precision} if precision else {}),
        "target": {"board": board},
        "build": {"out_dir": str(out_dir)},
    }
    return json.dumps(spec, indent=1)   # JSON is YAML


# ---- one build ------------------------------------------------------------------------------------

def run_one(model: Path, label: str, work: Path, timeout: float, cut: list | None = None, board: str = BOARD,
            precision: str | None = None) -> Row:
    """One build. With `cut` (model.outputs), the outputs are those tensors: their shapes come from the load
    stage of the first, uncut build (`io_of_cut`)."""
    name = model.stem + ("-cut" if cut else "")
    row = Row(model=name, source=label, cut=cut)
    try:
        row.inputs, row.outputs = model_io(model)
    except Exception as e:  # not even a flatbuffer we can open: say so and go on
        row.reason = f"cannot read the model's inputs/outputs: {e}"
        return row
    if cut:
        row.outputs = io_of_cut(model, cut)
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    steps = SEQUENCE if is_stateful(model) else None
    first = cut[0] if cut else output_names(model)[0]
    sigmoid = sigmoid_output(model, cut)
    row.task = write_data(folder / "data.npz", row.inputs, row.outputs, steps=steps, first_output=first,
                          sigmoid=sigmoid)
    row.loss = "bce" if sigmoid else "cross_entropy" if row.task == "classification" else "mse"
    spec = folder / "spec.yaml"
    spec.write_text(spec_text(name, model, folder / "data.npz", row.task, folder / "build", cut, steps, first,
                              sigmoid, board, precision))
    cmd = [sys.executable, "-m", "tinytrain", "build", str(spec), "--json", "--cache-dir", str(folder / "cache")]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=folder)
    except subprocess.TimeoutExpired:
        row.seconds = round(time.monotonic() - t0, 1)
        row.reason = f"timeout after {timeout:.0f} s"
        _read_artifacts(row, folder / "build" / name, done=_done_stages(folder / "build" / name))
        return row
    row.seconds = round(time.monotonic() - t0, 1)
    row.exit_code = proc.returncode
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        doc = None
    if doc is None:  # a failure before the build started (a spec error): its first line on stderr
        row.reason = _short_paths(_first_line(proc.stderr), model, folder) or f"exit {proc.returncode}, no output"
        return row
    done = [s["stage"] for s in doc.get("stages", []) if s.get("state") in ("ran", "cached")]
    if doc.get("error"):
        row.reason = _short_paths(_first_line(doc["error"]), model, folder)
        found = re.search(r"`outputs: (\[.*?\])`", doc["error"])
        row.suggested_cut = json.loads(found.group(1)) if found and not cut else None
    _read_artifacts(row, Path(doc.get("out_dir") or folder / "build" / name), done)
    return row


def io_of_cut(model: Path, cut: list) -> list:
    """[shape, dtype] of each tensor of `cut`, as tinytrain's reader reads the model cut there."""
    from tinytrain.stages.model.tflite_reader import read_model

    g = read_model(model, outputs=cut)
    return [[list(g.tensors[n].shape), g.tensors[n].dtype] for n in cut]


def _done_stages(build: Path) -> list[str]:
    return [s for s in STAGES if (build / s).is_dir()]


def _read_artifacts(row: Row, build: Path, done: list[str]) -> None:
    reached = [s for s in STAGES if s in done]
    row.furthest = reached[-1] if reached else "-"
    quantize = build / "quantize" / "manifest.json"
    if quantize.is_file():  # a float precision of an int8 model file: quantize trains its dequantized copy
        row.dequantized = bool(json.loads(quantize.read_text()).get("metrics", {}).get("dequantized_int8"))
    size = build / "cross-compile" / "size.json"
    if size.is_file():
        s = json.loads(size.read_text())
        row.board = s.get("board", "")
        row.sram_used, row.flash_used = s.get("sram", {}).get("used"), s.get("flash", {}).get("used")
    run = build / "emulate-run" / "run.json"
    if run.is_file():
        loss = json.loads(run.read_text())["loss"]
        means = loss.get("epoch_mean") or [loss.get("first"), loss.get("last")]
        row.loss_before, row.loss_after = means[0], means[-1]
        row.board = row.board or json.loads(run.read_text()).get("board", "")
        scale = json.loads(run.read_text()).get("loss_scale") or {}
        row.loss_scale, row.skipped_steps = scale.get("final"), scale.get("skipped_steps")
    plan, prec = build / "reorder" / "memplan.json", build / "autodiff" / "precision.json"
    if plan.is_file():
        row.arena = int(json.loads(plan.read_text())["arena_bytes"])
    if prec.is_file():
        row.arena_fp32 = json.loads(prec.read_text()).get("arena_bytes_fp32")


def _short_paths(text: str, model: Path, folder: Path) -> str:
    """The reason without the machine's folders: the model by its file name, the data as data.npz."""
    return text.replace(str(model), model.name).replace(str(folder) + "/", "")


def _first_line(text: str) -> str:
    """The error's first line; one that ends in ':' (a message listing its details, e.g. the regions over the
    board's memory) goes on with its indented detail lines, joined with '; '."""
    raw = [ln for ln in (text or "").splitlines() if ln.strip()]
    if not raw:
        return ""
    first = raw[0].strip()
    if first.endswith(":"):
        details = []
        for ln in raw[1:]:
            if not ln.startswith((" ", "\t")) or ln.strip().startswith("hint:"):
                break
            details.append(ln.strip())
        first = first + " " + "; ".join(details) if details else first
    return first


# ---- output ---------------------------------------------------------------------------------------

def _kb(n: int | None) -> str:
    return "" if n is None else f"{n / 1024:.1f}"


def _loss(v: float | None) -> str:
    return "" if v is None else f"{v:.4g}"


def _io_text(ios: list) -> str:
    return " ".join(f"{'x'.join(str(d) for d in io[0])}{'' if io[1] == 'float32' else ' ' + io[1]}" for io in ios)


def result_text(r: Row) -> str:
    """"trains", or why not: the reason the build stopped, or a training run whose loss did not move at all."""
    if r.exit_code != 0:
        return r.reason
    if r.loss_before is not None and r.loss_before == r.loss_after:
        return "runs, but the loss does not move (no update changed a trained tensor)"
    return "trains"


def _model_text(r: Row) -> str:
    return (r.model + (f" (model.outputs: {', '.join(r.cut)})" if r.cut else "")
            + (" (dequantized)" if r.dequantized else ""))


def _scale_text(r: Row) -> str:
    return "" if r.loss_scale is None else f"{r.loss_scale:g} ({r.skipped_steps})"


def headers(precision: str | None) -> list[str]:
    """The table's columns; fp16-mixed adds its arena against fp32's on the same plan and the loss scale."""
    extra = ["arena KB", "fp32 same plan KB", "loss scale (skipped)"] if precision == "fp16-mixed" else []
    return ["wheel", "model", "inputs", "outputs", "furthest stage", "SRAM KB", "flash KB", *extra, "board", "loss",
            "loss before", "loss after", "result / reason it stops"]


def table_rows(rows: list[Row], precision: str | None = None) -> list[list[str]]:
    def extra(r: Row) -> list[str]:
        return [_kb(r.arena), _kb(r.arena_fp32), _scale_text(r)] if precision == "fp16-mixed" else []

    return [[r.source, _model_text(r), _io_text(r.inputs), _io_text(r.outputs), r.furthest, _kb(r.sram_used),
             _kb(r.flash_used), *extra(r), r.board, r.loss, _loss(r.loss_before), _loss(r.loss_after), result_text(r)]
            for r in rows]


def _setting(board: str, precision: str | None) -> str:
    return f"board {board}, `scheme: auto`" + (f", `train.precision: {precision}`" if precision else "")


def markdown(rows: list[Row], versions: dict[str, str], date: str, board: str = BOARD,
             precision: str | None = None) -> str:
    def cell(s: str) -> str:
        return s.replace("|", "\\|")

    heads = headers(precision)
    lines = [f"Coverage run of {date}; wheels: " + ", ".join(f"{k} {v}" for k, v in versions.items()) +
             f"; {_setting(board, precision)}, synthetic data.", "",
             "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in table_rows(rows, precision)]
    n_ok = sum(result_text(r) == "trains" for r in rows)
    where = "on the host" if board == "host" else f"in QEMU on {board}"
    lines += ["", f"{n_ok} of {len(rows)} builds train {where} (a `-cut` row is a second build of the "
                  f"model above it, cut where load's error suggested"
                  + ("; a `dequantized` row trains the int8 model's dequantized float copy (the quantize stage)"
                     if any(r.dequantized for r in rows) else "") + ")."]
    return "\n".join(lines) + "\n"


def print_table(rows: list[Row], board: str = BOARD, precision: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"tinytrain coverage ({_setting(board, precision)})")
    for h in headers(precision):
        t.add_column(h, overflow="fold")
    for r in table_rows(rows, precision):
        t.add_row(*r)
    Console(width=max(Console().width, 200)).print(t)


def merged(new: list[Row], old: list[dict]) -> list[Row]:
    """The old rows in their order, each replaced by the new row of the same model (new models at the end)."""
    fresh = {r.model: r for r in new}
    fields = set(Row.__dataclass_fields__)
    def row(d: dict) -> Row:
        r = Row(**{k: v for k, v in d.items() if k in fields})
        r.loss = r.loss or ("cross_entropy" if r.task == "classification" else "mse")   # rows from before `loss`
        return r

    out = [fresh.pop(d["model"], None) or row(d) for d in old]
    return out + list(fresh.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "tinytrain-coverage",
                    help="where the wheels and their models are kept")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per model build")
    ap.add_argument("--only", default=None, help="benchmark only models whose file name contains this text")
    ap.add_argument("--out", type=Path, default=HERE, help="folder for coverage.json and coverage.md")
    ap.add_argument("--precision", choices=("int8", "fp32", "fp16-mixed"), default=None,
                    help="train.precision of every build (left out: the spec's default, int8 for these models); "
                         "writes coverage_<precision>.json/.md")
    ap.add_argument("--board", default=BOARD, help=f"target.board of every build (default {BOARD}; fp16-mixed "
                                                   "needs half precision: host or mps3-an547)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the other rows of the existing coverage.json (with --only: re-run some rows)")
    a = ap.parse_args(argv)
    models, versions = fetch_models(a.cache)
    # A control that is known to train (this project's own example model, same synthetic data recipe): its row
    # shows that an empty SRAM/flash/loss column of a third-party model is the model's, not the benchmark's.
    models.append((REPO / "tests" / "fixtures" / "digits_cnn_float.tflite", "control"))
    if a.only:
        models = [(m, lab) for m, lab in models if a.only in m.name]
    rows = []
    with tempfile.TemporaryDirectory(prefix="tt-coverage-") as tmp:
        for i, (model, label) in enumerate(models, 1):
            print(f"[{i}/{len(models)}] {label}/{model.name} ...", flush=True)
            rows.append(run_one(model, label, Path(tmp), a.timeout, board=a.board, precision=a.precision))
            r = rows[-1]
            print(f"    {r.furthest} in {r.seconds} s: {result_text(r)}", flush=True)
            if r.suggested_cut:  # load named a cut that leaves the unsupported ops out: try it too
                print(f"    retrying with model.outputs {r.suggested_cut} ...", flush=True)
                rows.append(run_one(model, label, Path(tmp), a.timeout, cut=r.suggested_cut, board=a.board,
                                    precision=a.precision))
                r = rows[-1]
                print(f"    {r.furthest} in {r.seconds} s: {result_text(r)}", flush=True)
    date = _dt.date.today().isoformat()
    stem = "coverage" + (f"_{a.precision}" if a.precision else "")
    js = a.out / f"{stem}.json"
    if a.merge and js.exists():
        rows = merged(rows, json.loads(js.read_text())["models"])
    print_table(rows, a.board, a.precision)
    a.out.mkdir(parents=True, exist_ok=True)
    js.write_text(json.dumps({"date": date, "board": a.board, "precision": a.precision, "wheels": versions,
                              "models": [asdict(r) for r in rows]}, indent=1) + "\n")
    (a.out / f"{stem}.md").write_text(markdown(rows, versions, date, a.board, a.precision))
    return 0


if __name__ == "__main__":
    sys.exit(main())
