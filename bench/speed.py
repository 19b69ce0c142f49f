"""Speed, side by side (issue 14, item 5): device cycles, host vs PyTorch, build times.

    .venv/bin/python bench/speed.py [--json] [--skip-mbv2] [--out build/bench-speed.json]

1. Device: instructions per training step (QEMU, counted by the firmware, mean over the run) and the cycle
   estimate of one traced step (stages/device/cycles.py: Cortex-M7 table, the M4 table beside it) for the digits example
   and MobileNetV2-w0.35@128 with the TTE-like sparse update (bench/mbv2_tte.yaml; bench/make_mbv2_data.py makes
   its data), each with `target.kernels: portable` and `dsp`. TTE's 373 ms at 216 MHz = 80.6 M cycles beside it.
   A traced MobileNetV2 step takes ~45 s (QEMU's per-TB log); --skip-mbv2 leaves MobileNetV2 out.
2. Host: the native `host` build's time per training step (-O3, and -march=x86-64-v3 where the build machine
   runs it: stages/device/boards.py HOST_ISA_PROBE; the table's caption gives the flags) (the executable run for 1
   and for 1+N steps, N chosen to take ~0.5 s, the difference over N, best of 5; CPU time, so the machine's other
   load matters little)
   against PyTorch on one thread training the same float graph (tests/torch_mirror.py: forward, cross-entropy,
   backward, SGD on the tensors the firmware trains; the int8 MobileNetV2 as the float graph it stands for,
   stages/quant/dequantize.dequantize_graph; a final softmax dropped, as the firmware's fused loss takes logits),
   best of 5 runs of ~0.5 s each (CPU time of its one thread, torch.set_num_threads(1)). PyTorch computes the
   whole weight gradient of a tensor the firmware trains only a channel slice of (bench/mbv2_tte.yaml's
   weight_ratio), so it does somewhat more work there. `--only host` runs this part alone (about a minute).
3. Build times of the example and of MobileNetV2 (bench/mbv2_tte.yaml), each on its own board: cold (an empty
   cache), no-op (everything cached) and a learning-rate change (emulate-run alone reruns), with the cold build's
   wall and CPU time per stage (the runner's StageInfo.cpu_s: this process and the compilers, QEMU and workers it
   waited for), and the load average when it started. Issue 14's goal: a cold MobileNetV2 build <= 15 s.
4. `scheme: auto` on MobileNetV2 (bench/mbv2_auto.yaml) with 520 train samples (--auto-train-per-class: 52 per
   class, so the analysis' default 256 tuning + 256 held-out samples apply): sparse-plan in a fresh cache (nothing
   memoised), wall and CPU time (issue 14's goal: <= 2 minutes on 2 cores); bench/auto_mbv2.py compares its
   choice in detail.

    .venv/bin/python bench/speed.py --only builds   # 3. and 4. alone (a few minutes; no traced steps)

Benchmarks measure; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXAMPLE = ROOT / "tinytrain.yaml.example"
MBV2 = HERE / "mbv2_tte.yaml"
TTE_CYCLES = 373e-3 * 216e6
HOST_SECONDS = 0.5   # host steps are timed over about this long
AUTO_TRAIN_PER_CLASS = 52   # auto's benchmark: 520 train samples, the analysis' defaults (256 + 256) apply


def _build(spec: Path, cache_dir: Path | None = None, **overrides: Any):
    import tinytrain

    return tinytrain.build(str(spec), cache_dir=cache_dir, **overrides)


def _one_step_files(build_dir: Path, spec: Path, steps: int) -> dict[str, bytes]:
    """runtime.bin (no evaluation, stop after `steps` steps), train.ttds, test.ttds for a built program."""
    from tinytrain.pipeline.spec import load_spec
    from tinytrain.stages import emulate_run
    from tinytrain.stages.model.ir import Graph

    s = load_spec(spec)
    layout = json.loads((build_dir / "codegen" / "io_layout.json").read_text())
    rc = emulate_run.runtime_config({"train.learning_rate": s.train.learning_rate, "train.epochs": 1,
                                     "train.seed": s.train.seed, "train.batch_size": s.train.batch_size,
                                     "train.optimizer": s.train.optimizer, "train.max_train_samples": 0})
    # As many epochs as steps: the run goes round the train split as often as needed and stops after `steps`.
    rc = dataclasses.replace(rc, flags=0, epochs=steps, stop_after_steps=steps)
    files, _ = emulate_run.run_files(s.data, layout, rc, Graph.load(build_dir / "quantize"))
    return files


# ---- 1. device ---------------------------------------------------------------------------------

def device(spec: Path, kernels: str, label: str) -> dict[str, Any]:
    from tinytrain.stages.device import cycles
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.emulate_run import BOARD_CLOCK_HZ

    r = _build(spec, name=f"speed-{label}-{kernels}", **{"target.kernels": kernels})
    run = json.loads((r.out_dir / "emulate-run" / "run.json").read_text())
    board = get_board(run["board"])
    est = run.get("cycles_per_step_estimate") or {}
    if not est.get("traced"):
        with tempfile.TemporaryDirectory(prefix="tt-speed-trace-") as tmp:
            est = cycles.estimate_step(board, r.out_dir / "cross-compile" / "firmware.elf",
                                       _one_step_files(r.out_dir, spec, 1), Path(tmp),
                                       clock_hz=BOARD_CLOCK_HZ.get(board.name), timeout_s=3600)
    return {"model": label, "kernels": kernels, "board": board.name,
            "instructions_per_step": run["instructions"]["per_step_mean"],
            "instructions_traced_step": est["instructions_traced"],
            "cycles_m7": est["by_core"]["cortex-m7"]["cycles"], "cycles_m4": est["by_core"]["cortex-m4"]["cycles"],
            "cpi_m7": est["by_core"]["cortex-m7"]["cpi"], "mix": est["mix"],
            "trace_wall_s": est.get("trace_wall_s"), "emulate_run_s": r.stages["emulate-run"].duration_s}


# ---- 2. host vs PyTorch --------------------------------------------------------------------------

def host_step_ms(spec: Path, label: str, cflags: tuple[str, ...] = ()) -> tuple[float, Any]:
    """ms per training step of the host build (`cflags` appended to the host board's, e.g. -O2 to compare)."""
    tag = "".join(f.strip("-").replace("=", "") for f in cflags)
    r = _build(spec, name=f"speed-{label}-host{tag}", **{"target.board": "host", "target.cflags": list(cflags)})
    elf = r.out_dir / "cross-compile" / "firmware.elf"

    def wall(steps: int) -> float:
        best = float("inf")
        with tempfile.TemporaryDirectory(prefix="tt-speed-host-") as tmp:
            exe = Path(tmp) / "fw"
            exe.write_bytes(elf.read_bytes())
            exe.chmod(0o755)
            for name, content in _one_step_files(r.out_dir, spec, steps).items():
                (Path(tmp) / name).write_bytes(content)
            for _ in range(5):
                proc = subprocess.Popen([str(exe)], cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                _, status, usage = os.wait4(proc.pid, 0)
                proc.returncode = os.waitstatus_to_exitcode(status)
                if proc.returncode != 0:
                    raise SystemExit(f"the host firmware {elf} failed (exit {proc.returncode})")
                # CPU time, not wall time: the figure should not depend on what else the machine runs.
                best = min(best, usage.ru_utime + usage.ru_stime)
        return best

    # Enough steps that their time dwarfs the process start (and the data load) the difference removes.
    base = wall(1)
    rough = max((wall(11) - base) / 10, 1e-6)
    n = int(min(max(HOST_SECONDS / rough, 10), 5000))
    return (wall(1 + n) - base) / n * 1e3, r


def _speed_flags(host_build: Any) -> list[str]:
    """The host build's flags that set its speed: the last -O and any -march (stages/device/boards.py HOST_ISA_PROBE,
    which depends on the build machine)."""
    flags = json.loads((host_build.out_dir / "cross-compile" / "build.json").read_text())["cflags"]
    return [f for f in flags if f.startswith("-O")][-1:] + [f for f in flags if f.startswith("-march=")]


def torch_step_ms(host_build: Any) -> float:
    import numpy as np
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT / "tests"))
    from torch_mirror import TorchMirror

    from tinytrain.stages.model.ir import Graph

    from tinytrain.stages.quant.dequantize import dequantize_graph

    torch.set_num_threads(1)
    g = dequantize_graph(Graph.load(host_build.out_dir / "load"))  # an int8 model: the float graph it stands for
    if g.ops and g.ops[-1].type == "softmax":  # the firmware's loss takes the logits (softmax + cross-entropy fused)
        last = g.ops.pop()
        g.outputs = [last.inputs[0]]
    model = TorchMirror(g)
    layout = json.loads((host_build.out_dir / "codegen" / "io_layout.json").read_text())
    trained = {e["name"] for e in layout.get("trained_tensors") or []}
    params = [p for n, p in zip(model.names, model.params) if n in trained] or list(model.params)
    for p in model.params:
        p.requires_grad_(any(p is q for q in params))
    opt = torch.optim.SGD(params, lr=0.01)
    shape = [1, *g.tensors[g.inputs[0]].shape[1:]]
    x = torch.tensor(np.random.default_rng(0).standard_normal(shape).astype(np.float32))
    y = torch.tensor([1])

    def step() -> None:
        opt.zero_grad()
        out = model(x)
        out = out[0] if isinstance(out, (list, tuple)) else out
        F.cross_entropy(out.reshape(1, -1), y).backward()
        opt.step()

    t = time.process_time()   # CPU time of this process (torch runs on this one thread)
    for _ in range(20):       # warm-up, and the rough time of a step
        step()
    n = int(min(max(HOST_SECONDS / max((time.process_time() - t) / 20, 1e-6), 20), 5000))
    best = float("inf")
    for _ in range(5):        # best of 5 runs of ~HOST_SECONDS each, as the host's figure
        t = time.process_time()
        for _ in range(n):
            step()
        best = min(best, (time.process_time() - t) / n)
    return best * 1e3


# ---- 3. build times --------------------------------------------------------------------------------

def build_times(spec: Path = EXAMPLE, label: str = "digits") -> dict[str, Any]:
    """Cold, no-op and learning-rate-change builds of `spec` in a fresh cache; the cold build's seconds per stage.
    Wall time of the build call (the report and the cache writes included), on whatever else the machine runs."""
    with tempfile.TemporaryDirectory(prefix="tt-speed-cache-") as cache, \
            tempfile.TemporaryDirectory(prefix="tt-speed-out-") as out:
        common = dict(cache_dir=Path(cache), name=f"speed-build-{label}", build={"out_dir": out})
        lr = _runtime_value(spec, "learning_rate") * 2
        load = os.getloadavg()[0]
        t, c = time.perf_counter(), _cpu()
        r = _build(spec, **common)
        cold, cold_cpu = time.perf_counter() - t, _cpu() - c
        stages = {name: round(st.duration_s, 3) for name, st in r.stages.items()}
        stages_cpu = {name: round(st.cpu_s, 3) for name, st in r.stages.items()}
        t = time.perf_counter()
        _build(spec, **common)
        noop = time.perf_counter() - t
        t, c = time.perf_counter(), _cpu()
        _build(spec, **common, **{"train.learning_rate": lr})
        lr_s, lr_cpu = time.perf_counter() - t, _cpu() - c
    return {"model": label, "cold_s": cold, "cold_cpu_s": cold_cpu, "noop_s": noop, "lr_change_s": lr_s,
            "lr_change_cpu_s": lr_cpu, "cold_stages_s": stages, "cold_stages_cpu_s": stages_cpu,
            "load_before": load}


def _cpu() -> float:
    """CPU seconds of this process and its finished children (compilers, QEMU, forked workers): on a shared
    machine the wall time also counts other jobs' turns, the CPU time does not."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _runtime_value(spec: Path, name: str) -> float:
    from tinytrain.pipeline.spec import load_spec

    return float(getattr(load_spec(spec).train, name))


# ---- 4. auto on MobileNetV2 --------------------------------------------------------------------------

def auto_time(train_per_class: int = AUTO_TRAIN_PER_CLASS) -> dict[str, Any]:
    """sparse-plan of bench/mbv2_auto.yaml in a fresh cache (load and quantize built first, not timed) on
    bench/make_mbv2_data.py's task with `train_per_class` x 10 train samples (52: 520, enough for the analysis'
    default 256 tuning + 256 held-out samples, issue 14's case): wall and CPU seconds of the child process, and the
    plan it chose."""
    import resource

    sys.path.insert(0, str(HERE))
    import make_mbv2_data

    data = make_mbv2_data.DEFAULT_OUT
    if train_per_class != make_mbv2_data.TRAIN_PER_CLASS:      # never overwrite bench/mbv2_tte.yaml's data
        data = data.with_name(f"mbv2_synth_{train_per_class}pc.npz")
        make_mbv2_data.TRAIN_PER_CLASS = train_per_class
    make_mbv2_data.make(data)
    with tempfile.TemporaryDirectory(prefix="tt-speed-auto-") as tmp:
        spec = Path(tmp) / "mbv2_auto.yaml"
        text = (HERE / "mbv2_auto.yaml").read_text()
        spec.write_text(text.replace("../build/bench-data/mbv2_synth.npz", str(data))
                        .replace("out_dir: ../build", f"out_dir: {tmp}/build"))
        cmd = [sys.executable, "-m", "tinytrain", "build", str(spec), "--cache-dir", f"{tmp}/cache", "-q"]
        subprocess.run(cmd + ["--until", "quantize"], check=True, capture_output=True)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(cmd + ["--until", "sparse-plan"], check=True, capture_output=True)
        wall = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        plan = json.loads((Path(tmp) / "build" / "mbv2_auto" / "sparse-plan" / "plan.json").read_text())
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    p = plan["predicted"]
    return {"wall_s": wall, "cpu_s": cpu, "k": p["k"], "weights": p["weights"],
            "exact_peak_bytes": plan["exact"]["peak_bytes"], "train_samples": train_per_class * 10,
            "load_after": os.getloadavg()[0]}


# ---- report --------------------------------------------------------------------------------------

def _m(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e6:.2f} M" if n >= 1e5 else f"{n / 1e3:.1f} k"


def _device_tables(console: Any, doc: dict[str, Any]) -> None:
    from rich.table import Table

    if doc["device"]:  # not with --only host
        t = Table(title="device: one training step (QEMU counts; cycles: stages/device/cycles.py tables)")
        for c in ("model", "kernels", "instr/step", "traced step", "cycles M7", "CPI M7", "cycles M4", "vs TTE (M7)"):
            t.add_column(c, justify="left" if c in ("model", "kernels") else "right")
        for d in doc["device"]:
            t.add_row(d["model"], d["kernels"], _m(d["instructions_per_step"]), _m(d["instructions_traced_step"]),
                      _m(d["cycles_m7"]), f"{d['cpi_m7']:.3f}", _m(d["cycles_m4"]),
                      f"{d['cycles_m7'] / TTE_CYCLES:.3f}x")
        console.print(t)
    if not doc["host"]:  # --device-only
        return
    h = Table(title="host: CPU ms per training step (best of 5), PyTorch on 1 thread")
    for c in ("model", "host", "PyTorch", "speed-up", "load"):
        h.add_column(c, justify="right")
    for d in doc["host"]:
        ratio = d["torch_ms"] / d["host_ms"] if d.get("torch_ms") else None
        h.add_row(d["model"], f"{d['host_ms']:.4f}", "-" if d.get("torch_ms") is None else f"{d['torch_ms']:.4f}",
                  "-" if ratio is None else f"{ratio:.1f}x", f"{d.get('load', 0.0):.1f}")
    h.caption = "host flags: " + " ".join(doc["host"][0].get("host_flags", []))
    console.print(h)


def table(doc: dict[str, Any]) -> str:
    from rich.console import Console
    from rich.table import Table

    console = Console(record=True, width=120)
    if doc["device"] or doc["host"]:
        _device_tables(console, doc)
    if "build" not in doc:  # --device-only
        return console.export_text()
    bt = Table(title="build times (s, wall / CPU; cold: an empty cache; CPU counts compilers, QEMU and workers)")
    for c in ("model", "cold", "no-op", "lr change", "load", "cold per stage (wall/CPU)"):
        bt.add_column(c, justify="left" if c in ("model", "cold per stage (wall/CPU)") else "right")
    for b in doc["build"]:
        cpu = b.get("cold_stages_cpu_s", {})
        per = ", ".join(f"{k} {v:.1f}/{cpu.get(k, 0.0):.1f}" for k, v in b["cold_stages_s"].items() if v >= 0.05)
        bt.add_row(b["model"], f"{b['cold_s']:.1f} / {b['cold_cpu_s']:.1f}", f"{b['noop_s']:.2f}",
                   f"{b['lr_change_s']:.1f} / {b['lr_change_cpu_s']:.1f}", f"{b['load_before']:.1f}", per)
    console.print(bt)
    a = doc.get("auto")
    if a:
        ws = ", ".join(f"#{op}@{r:g}" for op, r in sorted(a["weights"].items(), key=lambda t: int(t[0]))) or "none"
        console.print(f"scheme auto on MobileNetV2, {a['train_samples']} train samples (sparse-plan, fresh cache; "
                      f"load {a['load_after']:.1f} after): {a['wall_s']:.1f} s wall, {a['cpu_s']:.1f} s CPU; plan "
                      f"k={a['k']}, weights {ws}, exact peak {a['exact_peak_bytes'] / 1024:.1f} KB")
    return console.export_text()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the figures as JSON instead of tables")
    ap.add_argument("--skip-mbv2", action="store_true", help="leave MobileNetV2 out (its traced steps take minutes)")
    ap.add_argument("--device-only", action="store_true",
                    help="only the device table (instructions and estimated cycles, portable vs dsp): no host or "
                         "build timings")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "bench-speed.json")
    ap.add_argument("--only", choices=("all", "builds", "host"), default="all",
                    help="builds: only the build times and the auto time (no device traces, no host steps); "
                         "host: only the host steps against PyTorch")
    ap.add_argument("--auto-train-per-class", type=int, default=AUTO_TRAIN_PER_CLASS,
                    help="train samples per class of auto's MobileNetV2 task (default 52: 520 samples; "
                         "bench/make_mbv2_data.py's own 4 gives the 40-sample build of bench/mbv2_auto.yaml)")
    a = ap.parse_args(argv)
    os.chdir(ROOT)
    if not a.skip_mbv2:
        sys.path.insert(0, str(HERE))
        from make_mbv2_data import make
        make()
    models = [("digits", EXAMPLE)] + ([] if a.skip_mbv2 else [("mbv2", MBV2)])
    doc: dict[str, Any] = {"device": [], "host": []}
    if a.only == "all":
        for label, spec in models:
            for kernels in ("portable", "dsp"):
                doc["device"].append(device(spec, kernels, label))
    if a.only in ("all", "host"):
        for label, spec in [] if a.device_only else models:
            ms, hb = host_step_ms(spec, label)
            # CPU time still grows with the machine's load (shared caches, SMT): the 1-minute load beside it
            entry: dict[str, Any] = {"model": label, "host_ms": ms, "load": os.getloadavg()[0],
                                     "host_flags": _speed_flags(hb)}
            entry["torch_ms"] = torch_step_ms(hb)
            doc["host"].append(entry)
    if not a.device_only and a.only != "host":
        doc["build"] = [build_times(spec, label) for label, spec in models]
        if not a.skip_mbv2:
            doc["auto"] = auto_time(a.auto_train_per_class)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    if a.json:
        print(json.dumps(doc, indent=1))
    else:
        table(doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
