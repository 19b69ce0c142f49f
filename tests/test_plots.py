"""The build's pictures (pipeline/plots.py): what they show, and the same bytes for the same data in any process
(a cached artifact must depend only on its key)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tinytrain.pipeline import plots

SVG_NS = "{http://www.w3.org/2000/svg}"


def _texts(svg: bytes) -> str:
    return " ".join(t.text or "" for t in ET.fromstring(svg).iter(f"{SVG_NS}text"))


def _run_like(n_epochs: int = 3, per_epoch: int = 200) -> list[float]:
    # A spike at the start (new classes), then a slow fall with single-sample noise, some samples already right.
    out = []
    for i in range(n_epochs * per_epoch):
        base = 8.0 / (1 + i / 10) + 0.1
        out.append(base * (0.2 + (i * 7919 % 13) / 6.5) if i % 5 else 1e-6)
    return out


def test_an_interrupted_write_leaves_the_previous_picture_whole(tmp_path, monkeypatch):
    """Picture.write goes through a temporary file renamed into place: a write that fails half-way (here: at the
    flush to disk) leaves the previous picture as it was and no partial file beside it."""
    stem = tmp_path / "chart"
    plots.Picture(b"<svg>old</svg>", b"old png").write(stem)

    def interrupted(fd):
        raise OSError("interrupted")
    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(OSError, match="interrupted"):
        plots.Picture(b"<svg>new</svg>", b"new png").write(stem)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chart.png", "chart.svg"]
    assert (stem.with_suffix(".svg").read_bytes(), stem.with_suffix(".png").read_bytes()) == (b"<svg>old</svg>",
                                                                                            b"old png")


def test_moving_average_is_centred_and_shrinks_at_the_ends():
    v = [1.0, 2.0, 3.0, 4.0, 10.0]
    # window 3: [mean(1,2), mean(1,2,3), mean(2,3,4), mean(3,4,10), mean(4,10)]
    assert plots.moving_average(v, 3) == pytest.approx([1.5, 2.0, 3.0, 17 / 3, 7.0])
    assert plots.moving_average(v, 1) == v
    assert plots.moving_average([], 5) == []


def test_loss_limits_ignore_single_sample_extremes():
    # one confidently wrong first sample, and every fourth sample already right (1e-6)
    losses = [30.0] + [1e-6 if i % 4 == 0 else 0.5 for i in range(1, 500)]
    smooth = plots.moving_average(losses, 20)
    lo, hi = plots.loss_limits(losses, smooth, [0.6, 0.4])
    assert hi < 30 and hi >= max(smooth[10:]) and 1e-6 < lo <= min(smooth) / 4 + 1e-12


def test_loss_picture_shows_epoch_means_and_only_the_measured_accuracy():
    losses = _run_like()
    means = [sum(losses[e * 200:(e + 1) * 200]) / 200 for e in range(3)]
    pic = plots.loss_figure(losses, 200, title="trained 3 epochs on somewhere: a long summary line " * 3,
                            epoch_means=means, accuracy=[(0, 49.4, "before"), (600, 95.0, "after")])
    text = _texts(pic.svg)
    for e, m in enumerate(means):
        assert f"epoch {e + 1} mean {m:.3g}" in text
    assert "before: 49.4" in text and "after: 95.0" in text
    assert len(re.findall(r"(before|after): \d", text)) == 2
    assert "loss (log scale)" in text and "training step" in text
    # Step numbers on the x axis.
    assert {"0", "100", "200", "300", "400", "500", "600"} <= set(text.split())
    # The clipped single samples are counted, not hidden silently.
    assert re.search(r"not shown: \d+ step\(s\) below", text)
    assert pic.png.startswith(b"\x89PNG")
    # The title is wrapped onto lines that fit the figure (not one line running off its edge).
    title = [t.text or "" for t in ET.fromstring(pic.svg).iter(f"{SVG_NS}text") if "long summary" in (t.text or "")]
    assert len(title) >= 2 and all(len(line) <= 110 for line in title)


def test_memory_picture_names_both_peaks():
    live = [{"weight": 100, "activation": a} for a in (50, 300, 120)]
    pic = plots.memory_figure(live, ["conv2d -> a", "fc -> big_output", "update -> w"], arena=400, lower_bound=400,
                              plain_live=[150, 200, 900, 300], plain_arena=912,
                              plain_labels=["conv2d -> a", "fc -> big_output", "grad -> everything", "u"],
                              title="t")
    text = _texts(pic.svg)
    assert "peak 0.4 KB at step 1: fc -> big_output" in text
    assert "plain-order peak 0.9 KB at step 2: grad -> everything" in text
    assert "without reordering (plain order)" in text


_DRAW = """
import sys
from tinytrain.pipeline import plots
losses = [2.0 / (1 + 0.01 * i) for i in range(300)]
pics = [plots.loss_figure(losses, 100, "t", [1.5, 1.0, 0.8], [(0, 10.0, "before"), (300, 90.0, "after")]),
        plots.memory_figure([{"activation": 10 * i} for i in range(20)], [f"op{i}" for i in range(20)], 200, 190,
                            [20 * i for i in range(20)], 400, [f"op{i}" for i in range(20)], title="m"),
        plots.layers_figure(["a", "b"], {"weights": [1, 2], "activations": [3, 4]}, [5, 6], "l")]
out = sys.stdout.buffer
for p in pics:
    out.write(p.svg + b"\\0" + p.png + b"\\0")
"""


def test_same_data_gives_the_same_bytes_in_another_process():
    # Another process: matplotlib would salt the SVG's ids with a per-process random value and stamp a date.
    env = dict(os.environ)
    runs = [subprocess.run([sys.executable, "-c", _DRAW], capture_output=True, env=env, check=True).stdout
            for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) > 10_000
    assert b"<dc:date>" not in runs[0]


# ---- the example, end to end --------------------------------------------------------------------------------

@pytest.mark.slow
def test_example_build_draws_every_picture(tmp_path, capsys):
    from test_emulate_run import ARM_MISSING, _example_spec

    if ARM_MISSING:
        pytest.skip(ARM_MISSING)
    from tinytrain.pipeline.cli import main

    spec = _example_spec(tmp_path, "stm32f746-disco", epochs=2, max_train_samples=150)
    assert main(["build", str(spec)]) == 0, capsys.readouterr()
    build = tmp_path / "build" / "digits"
    run = json.loads((build / "emulate-run" / "run.json").read_text())
    loss_text = _texts((build / "emulate-run" / "loss.svg").read_bytes())
    for e, m in enumerate(run["loss"]["epoch_mean"]):
        assert f"epoch {e + 1} mean {m:.3g}" in loss_text
    mem = (build / "reorder" / "schedule.txt").read_text().splitlines()
    steps = [line.split() for line in mem if not line.startswith("#")]
    peak = max(steps, key=lambda s: (int(s[2]), -int(s[0])))
    mem_text = _texts((build / "reorder" / "memory.svg").read_bytes())
    assert f"peak {int(peak[2]) / 1024:.1f} KB at step {peak[0]}: {peak[3]} -> {peak[5].rstrip(',')}" in mem_text
    layers = _texts((build / "layers.svg").read_bytes())
    assert "dense_1/MatMul (fully_connected)" in layers
    report = (build / "report.md").read_text()
    assert "mean loss per epoch" in report and "Flash by part of the firmware" in report
    page = (build / "report.html").read_text()
    assert all(s.startswith("data:image/png;base64,") for s in re.findall(r'\bsrc="([^"]*)"', page))
    for name in ("emulate-run/loss.png", "reorder/memory.png", "layers.png"):
        assert (build / name).read_bytes().startswith(b"\x89PNG")
    # A cached rebuild: the same bytes, and the report says how long each stage took when it ran.
    first = {p: (build / p).read_bytes() for p in ("emulate-run/loss.svg", "reorder/memory.png", "layers.svg")}
    assert main(["build", str(spec)]) == 0
    assert first == {p: (build / p).read_bytes() for p in first}
    assert "when it ran" in (build / "report.md").read_text()


def test_regression_run_shows_the_measured_mse_and_odd_runs_still_draw():
    from tinytrain.stages.emulate_run import loss_picture

    losses = [0.5 / (1 + i) for i in range(7)]
    doc = {"summary": "s", "loss": {"per_step": losses, "steps": 7, "steps_per_epoch": None, "epoch_mean": None},
           "accuracy": {"before_pct": None, "after_pct": None}, "mse": {"before": 0.031, "after": 0.012}}
    text = _texts(loss_picture(doc).svg)
    assert "test MSE" in text and "before: 0.031" in text and "epoch 1 mean" not in text
    # A diverged MSE is null in run.json: no point is drawn for it; no steps at all still gives a picture.
    doc["mse"]["after"] = None
    assert "after:" not in _texts(loss_picture(doc).svg)
    empty = {**doc, "loss": {"per_step": [], "steps": 0, "steps_per_epoch": None, "epoch_mean": None}}
    assert loss_picture(empty).png.startswith(b"\x89PNG")
