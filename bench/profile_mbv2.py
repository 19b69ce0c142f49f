"""Per-op instruction profile of one training step of a tinytrain build (default: bench/mbv2_tte.yaml).

Builds the spec with the pipeline (cached stages are restored), then recompiles codegen's program with
-DTT_PROFILE=1: every op of the training step is bracketed with tt_instructions() (codegen emits the
TT_PROF_BEGIN/END macros; empty in a normal build, so the firmware the pipeline ships is unchanged), runs a few
steps in QEMU (-icount, deterministic; SysTick counts every 40 instructions, so each op's figure is within 40 per
call) and prints the ops and kernels that take the most instructions per step. The table is also written to
build/<name>/profile-<kernels>.json.

    .venv/bin/python bench/profile_mbv2.py                  # MBV2, the spec's kernels (portable)
    .venv/bin/python bench/profile_mbv2.py --kernels dsp    # the same program with the DSP variants
    .venv/bin/python bench/profile_mbv2.py --spec tinytrain.yaml.example --steps 20

The profiled firmware carries ~2 calls of tt_instructions() per op more than the shipped one; the "sum of ops"
line against the step total shows that overhead (small).
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_SPEC = HERE / "mbv2_tte.yaml"

# Instructions per training step measured before the kernel work of this profile (QEMU -icount, portable C;
# target.kernels: dsp compiled the same code then: cross-compile did not set the TT_USE_DSP switch).
BASELINE = {"mbv2_tte": 439_746_992, "digits": 1_090_000}

_CALL_RE = re.compile(r"\b(tt_[a-z0-9_]+)\(")


def build(spec: Path) -> Path:
    """Build `spec` (MBV2: with its data set) and return its build folder."""
    import contextlib
    import io

    from tinytrain.pipeline.cli import main as cli
    from tinytrain.pipeline.spec import load_spec
    from tinytrain.pipeline.workspace import build_dir

    s = load_spec(spec)
    if s.name == "mbv2_tte":
        sys.path.insert(0, str(HERE))
        from make_mbv2_data import make

        make()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli(["build", str(spec), "--json"])
    if rc != 0:
        raise SystemExit(f"tinytrain build {spec} failed (exit {rc}):\n{out.getvalue()[:4000]}")
    return build_dir(s)


def op_table(model_c: str) -> list[dict]:
    """The profiled ops of the training step in TT_PROF index order: op type, first output, kernels called."""
    ops: dict[int, dict] = {}
    lines = [ln.strip() for ln in model_c.splitlines()]
    for i, ln in enumerate(lines):
        if ln != "TT_PROF_BEGIN();":
            continue
        head = lines[i - 1]
        m = re.match(r"/\* ([a-z0-9_]+): (.*) \*/$", head)
        kind, outs = (m.group(1), m.group(2)) if m else ("?", head)
        kernels = []
        j = i + 1
        while not lines[j].startswith("TT_PROF_END("):
            kernels += [k for k in _CALL_RE.findall(lines[j]) if k not in kernels]
            j += 1
        k = int(lines[j][len("TT_PROF_END("):].split(")")[0])
        ops[k] = {"op": kind, "output": outs.split(", ")[0].split(";")[0], "kernels": kernels}
    return [ops[k] for k in sorted(ops)]


def profile(bdir: Path, kernels: str, steps: int, spec_path: Path) -> dict:
    """Compile build folder `bdir`'s program with TT_PROFILE for `kernels`, run `steps` training steps in the
    emulator (no evaluation) and return the per-op table."""
    from tinytrain.pipeline.spec import load_spec
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.cross_compile import build_firmware, kernel_defines
    from tinytrain.stages.device.launch import run_firmware
    from tinytrain.stages.emulate_run import run_files
    from tinytrain.stages.train.runtime_config import RuntimeConfig

    spec = load_spec(spec_path)
    board = get_board(spec.target.board)
    cg = bdir / "codegen"
    layout = json.loads((cg / "io_layout.json").read_text())
    table = op_table((cg / "tt_model.c").read_text())
    sources = json.loads((cg / "sources.json").read_text())
    defines = {**kernel_defines(kernels), **{str(k): str(v) for k, v in (sources.get("defines") or {}).items()},
               "TT_PROFILE": "1"}
    t = spec.train
    bsz = int(t.batch_size)
    rc = RuntimeConfig(learning_rate=float(t.learning_rate), epochs=1, seed=int(t.seed or 0), batch_size=bsz,
                       momentum=0.0, max_train_samples=steps * bsz, flags=0)
    files, _ = run_files(spec.data, layout, rc)
    with tempfile.TemporaryDirectory(prefix="tt-profile-") as tmp:
        res = build_firmware(board, cg, Path(tmp) / "fw", kernels=sources.get("kernels"), defines=defines,
                             stack_bytes=sources.get("stack_bytes"))
        run = run_firmware(board, res.elf, Path(tmp) / "run", files, timeout_s=float(spec.target.timeout_s))
    raw = run.files["profile.bin"]
    n = len(raw) // 12
    insns = struct.unpack(f"<{n}Q", raw[: 8 * n])
    calls = struct.unpack(f"<{n}I", raw[8 * n: 12 * n])
    r = run.results
    n_steps = int(r["steps"])
    rows = []
    for k, op in enumerate(table):
        rows.append({**op, "index": k, "instructions_per_step": insns[k] / n_steps, "calls": calls[k]})
    total = float(r["instructions_per_step_mean"])
    return {"build": bdir.name, "board": board.name, "kernels": kernels, "steps": n_steps,
            "instructions_per_step": total, "ops": rows}


def by_kernel(rows: list[dict]) -> list[tuple[str, float, int]]:
    agg: dict[str, list] = {}
    for r in rows:
        key = "+".join(r["kernels"]) or r["op"]
        a = agg.setdefault(key, [0.0, 0])
        a[0] += r["instructions_per_step"]
        a[1] += 1
    return sorted(((k, v[0], v[1]) for k, v in agg.items()), key=lambda t: -t[1])


def report(p: dict, top: int) -> str:
    total = p["instructions_per_step"]
    ops_sum = sum(r["instructions_per_step"] for r in p["ops"])
    base = BASELINE.get(p["build"])
    out = [f"{p['build']} on {p['board']} (kernels: {p['kernels']}), {p['steps']} profiled steps",
           f"instructions per training step {total / 1e6:.2f} M (profiled build; sum of ops {ops_sum / 1e6:.2f} M)"
           + (f";  before the kernel work {base / 1e6:.2f} M: {base / total:.2f}x fewer now" if base else ""),
           "", "top kernels (instructions per step, share, ops):"]
    for k, v, n in by_kernel(p["ops"])[:top]:
        out.append(f"  {v / 1e6:9.2f} M  {100 * v / total:5.1f}%  {n:3d}x  {k}")
    out += ["", "top ops:"]
    for r in sorted(p["ops"], key=lambda r: -r["instructions_per_step"])[:top]:
        v = r["instructions_per_step"]
        out.append(f"  {v / 1e6:9.2f} M  {100 * v / total:5.1f}%  #{r['index']:<3d} {r['op']:<28s} "
                   f"{'+'.join(r['kernels'])}  ({r['output'][-60:]})")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=DEFAULT_SPEC)
    ap.add_argument("--kernels", choices=("portable", "dsp"), default=None,
                    help="kernel variant to profile (default: the spec's target.kernels)")
    ap.add_argument("--steps", type=int, default=2, help="training steps to run (a step costs the same each time)")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-build", action="store_true", help="profile the existing build folder as it is")
    a = ap.parse_args(argv)
    from tinytrain.pipeline.spec import load_spec
    from tinytrain.pipeline.workspace import build_dir

    spec = load_spec(a.spec)
    bdir = build_dir(spec) if a.no_build else build(a.spec)
    kernels = a.kernels or spec.target.kernels
    p = profile(bdir, kernels, a.steps, a.spec)
    (bdir / f"profile-{kernels}.json").write_text(json.dumps(p, indent=1) + "\n")
    print(json.dumps(p, indent=1) if a.json else report(p, a.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
