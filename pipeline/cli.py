"""The `tinytrain` command.

Exit codes: 0 success; 1 a stage failed (including reaching a stage that is not implemented
yet); 2 user error (bad spec or command line, missing or bad input file). Errors print as one
`error: ...` message on stderr; TINYTRAIN_DEBUG=1 re-raises them with the traceback.

Global options (before or after the command): --version, -q/--quiet, -v/--verbose,
--color {auto,always,never}, --progress-every SECONDS. Output cut short by its reader
(`tinytrain status SPEC | head -1`) ends the command quietly, as with other Unix tools.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from tinytrain.pipeline import stage_graph
from tinytrain.pipeline.errors import EXIT_OK, EXIT_USER_ERROR, TinytrainError, UserError

EPILOG = "exit codes: 0 ok, 1 a stage failed (or is not implemented yet), 2 user error"


# What a Unix tool killed by SIGPIPE ends with in a shell (128 + 13).
EXIT_BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader of our output went away (`| head -1`): stop without a traceback, and point
        # stdout at /dev/null so that the interpreter's final flush does not complain either.
        from tinytrain.pipeline.console import silence_stream

        silence_stream(sys.stdout)
        return EXIT_BROKEN_PIPE


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: usage errors exit 2, --help and --version exit 0
        return int(e.code or 0) if isinstance(e.code, int) or e.code is None else EXIT_USER_ERROR
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USER_ERROR
    debug = os.environ.get("TINYTRAIN_DEBUG", "") not in ("", "0")
    try:
        code = args.func(args)
        sys.stdout.flush()  # a broken pipe shows here, inside the handler, not at interpreter exit
        return code
    except TinytrainError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


# ---- commands -----------------------------------------------------------------------------------

def _cmd_build(args: argparse.Namespace) -> int:
    from tinytrain.pipeline.console import BuildLog, format_seconds
    from tinytrain.pipeline.runner import build

    spec, cache = _spec_and_cache(args)
    log = BuildLog(sys.stderr if args.json else sys.stdout, verbosity=args.verbosity, color=args.color,
                   progress_every=args.progress_every)
    result = build(spec, cache, log, until=args.until, only=args.only, force=args.force or (),
                   dry_run=args.dry_run, stage_stdout=sys.stderr if args.json else None)
    if args.json:
        print(json.dumps(result.to_json(), indent=2, sort_keys=True, default=str))
    if result.error is not None:
        if os.environ.get("TINYTRAIN_DEBUG", "") not in ("", "0"):
            raise result.error
        print(f"error: {result.error}", file=sys.stderr)
        report = Path(result.out_dir) / "report.md"
        if not args.dry_run and report.is_file():
            print(f"what was built so far: {_shown(report)}", file=sys.stderr)
        return result.exit_code
    if not args.dry_run:
        from tinytrain.pipeline.report import summary_block

        ran = sum(o.state == "ran" for o in result.outcomes)
        hit = sum(o.state == "cached" for o in result.outcomes)
        log.result(f"build ok in {format_seconds(result.duration_s)}: {ran} ran, {hit} cached; "
                   f"artifacts in {_shown(Path(result.out_dir))}/")
        # Every figure of the closing block is read back from an artifact, named beside it.
        for line in summary_block(Path(result.out_dir), _shown):
            log.line(line)
    return EXIT_OK


def _cmd_status(args: argparse.Namespace) -> int:
    from tinytrain.pipeline.planner import plan

    spec, cache = _spec_and_cache(args)
    items = plan(spec, cache, stage_graph.STAGES)
    if args.json:
        print(json.dumps({"name": spec.name, "stages": [
            {"stage": i.stage.name, "state": i.state, "reason": i.reason, "key": i.key,
             "summary": i.entry.summary if i.entry else ""} for i in items]}, indent=2))
        return EXIT_OK
    width = max(len(i.stage.name) for i in items)
    for i in items:
        detail = f"key {i.key[:12]}  {i.entry.summary}" if i.entry is not None and i.key else i.reason
        if i.state == "not implemented":
            detail = ""
        print(f"{i.stage.name.ljust(width)}  {i.state.ljust(15)}  {detail}".rstrip())
    return EXIT_OK


def _cmd_explain(args: argparse.Namespace) -> int:
    from tinytrain.pipeline.planner import explain

    spec, cache = _spec_and_cache(args)
    print("\n".join(explain(spec, cache, args.stage, stage_graph.STAGES)))
    return EXIT_OK


def _cmd_inspect(args: argparse.Namespace) -> int:
    from tinytrain.pipeline.api import inspect

    view = inspect(args.spec, args.stage, args.artifact, cache_dir=args.cache_dir)
    if view.note:
        print(view.note, file=sys.stderr)
    sys.stdout.write(view.text)
    return EXIT_OK


def _cmd_infer(args: argparse.Namespace) -> int:
    import numpy as np

    from tinytrain.pipeline.artifacts import stage_artifacts
    from tinytrain.pipeline.infer import infer

    spec, cache = _spec_and_cache(args)
    folder, note = stage_artifacts(spec, cache, args.stage, stage_graph.STAGES)
    if note:
        print(note, file=sys.stderr)
    try:
        x = np.load(args.input, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise UserError(f"{args.input}: cannot read a .npy array: {e}") from None
    outputs = infer(folder, x)
    out = Path(args.output)
    if len(outputs) == 1:
        np.save(out, next(iter(outputs.values())))
    elif out.suffix == ".npz":
        np.savez(out, **outputs)
    else:
        raise UserError(f"the graph has {len(outputs)} outputs; name an .npz file as --output to get them all")
    for name, a in outputs.items():
        print(f"{name}: {a.dtype}[{','.join(map(str, a.shape))}] -> {out}")
    return EXIT_OK


def _cmd_export(args: argparse.Namespace) -> int:
    from tinytrain.pipeline.console import BuildLog
    from tinytrain.pipeline.export_lib import export_spec

    spec, cache = _spec_and_cache(args)
    print(f"library in {_shown(export_spec(spec, cache, BuildLog(sys.stdout), Path(args.to)))}/")
    return EXIT_OK


def _cmd_graph(args: argparse.Namespace) -> int:
    from tinytrain.pipeline.dag_render import render

    states = None
    if args.spec:
        from tinytrain.pipeline.planner import plan

        spec, cache = _spec_and_cache(args)
        states = {i.stage.name: i.state for i in plan(spec, cache, stage_graph.STAGES)}
    sys.stdout.write(render(stage_graph.STAGES, args.format, states))
    return EXIT_OK


def _cmd_clean(args: argparse.Namespace) -> int:
    from tinytrain.pipeline.spec import load_spec
    from tinytrain.pipeline.workspace import build_dir, clean

    spec = load_spec(args.spec)
    target = _shown(build_dir(spec))
    print(f"removed {target}/" if clean(spec) else f"nothing to clean ({target}/ does not exist)")
    return EXIT_OK


def _cmd_cache_stats(args: argparse.Namespace) -> int:
    cache = _cache_only(args)
    st = cache.stats()
    if args.json:
        print(json.dumps(st, indent=2, sort_keys=True))
        return EXIT_OK
    print(f"cache: {st['root']}")
    print(f"size: {_human_bytes(st['size_bytes'])} in {st['entries']} entries, {st['blobs']} blobs, "
          f"{st['unit_files']} unit files")
    print(f"last build: {st['hits']} hits, {st['misses']} misses")
    return EXIT_OK


def _cmd_cache_gc(args: argparse.Namespace) -> int:
    if args.max_size is None and args.max_age is None:
        raise UserError("cache gc needs a scope: --max-size (e.g. 500M) and/or --max-age (e.g. 30d)")
    cache = _cache_only(args)
    res = cache.gc(max_size=parse_size(args.max_size) if args.max_size else None,
                   max_age_s=parse_age(args.max_age) if args.max_age else None)
    print(f"removed {res['entries_removed']} entries, {res['blobs_removed']} blobs and {res['units_removed']} unit "
          f"files, freed "
          f"{_human_bytes(res['bytes_freed'])}; cache is now {_human_bytes(res['size_bytes'])}")
    return EXIT_OK


def _cmd_schema(args: argparse.Namespace) -> int:
    from tinytrain.pipeline.spec import json_schema, json_schema_text

    if args.markdown:
        from tinytrain.pipeline.spec_docs import reference_markdown

        sys.stdout.write(reference_markdown(json_schema()))
    else:
        sys.stdout.write(json_schema_text())
    return EXIT_OK


# ---- helpers ------------------------------------------------------------------------------------

def _spec_and_cache(args: argparse.Namespace):
    from tinytrain.pipeline.spec import load_spec
    from tinytrain.pipeline.workspace import open_cache

    spec = load_spec(args.spec)
    return spec, open_cache(spec, getattr(args, "cache_dir", None))


def _cache_only(args: argparse.Namespace):
    from tinytrain.pipeline.spec import load_spec
    from tinytrain.pipeline.workspace import open_cache

    spec = load_spec(args.spec) if args.spec else None
    return open_cache(spec, args.cache_dir)


_SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise UserError(f"--max-size {text!r}: expected a size like 500M, 2G or 1048576")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).upper()])


def parse_age(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if not m:
        raise UserError(f"--max-age {text!r}: expected an age like 30d, 12h, 45m or 90s")
    return float(m.group(1)) * _AGE_UNITS[m.group(2) or "s"]


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _shown(p: Path) -> str:
    try:
        return os.path.relpath(p)
    except ValueError:
        return str(p)


# ---- argument parsing ---------------------------------------------------------------------------

def _output_options(defaults: bool) -> argparse.ArgumentParser:
    """-q/-v/--color/--progress-every, accepted before and after the command. The copy on the
    sub-commands has no defaults (SUPPRESS), else it would overwrite what was given before the command."""
    from tinytrain.pipeline.console import COLOR_CHOICES, NORMAL, PROGRESS_EVERY_S, QUIET, VERBOSE

    d = (lambda v: v) if defaults else (lambda v: argparse.SUPPRESS)
    o = argparse.ArgumentParser(add_help=False)
    g = o.add_argument_group("output")
    v = g.add_mutually_exclusive_group()
    v.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=QUIET, default=d(NORMAL),
                   help="print only errors and the final result")
    v.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=VERBOSE, default=d(NORMAL),
                   help="print more: cache folder, full cache keys, restore timings")
    g.add_argument("--color", choices=COLOR_CHOICES, default=d("auto"),
                   help="colour the output: auto (default: only on a terminal, never when $NO_COLOR is set), "
                        "always, never")
    g.add_argument("--progress-every", metavar="SECONDS", type=_seconds, default=d(PROGRESS_EVERY_S),
                   help=f"when the output is not a terminal (a CI log), print a progress line this often "
                        f"while a stage runs (default {PROGRESS_EVERY_S:g}; 0: every report)")
    return o


def _seconds(text: str) -> float:
    import math

    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def _with_output(subparsers: Any, output: argparse.ArgumentParser) -> Any:
    """Every command made by `subparsers` also takes the output options."""
    plain = subparsers.add_parser

    def add_parser(name: str, **kw: Any) -> argparse.ArgumentParser:
        return plain(name, **{**kw, "parents": [*kw.get("parents", ()), output]})

    subparsers.add_parser = add_parser
    return subparsers


class _VersionAction(argparse.Action):
    """--version: the installed version, looked up only when asked (the lookup scans the installed packages)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        import tinytrain

        print(f"tinytrain {tinytrain.__version__}")  # to stdout, as argparse's own version action does
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    stage_names = ", ".join(stage_graph.STAGE_NAMES)
    p = argparse.ArgumentParser(
        prog="tinytrain", description="Compile a neural network into on-device training firmware "
                                      "for microcontrollers, and run it in emulation.", epilog=EPILOG,
        parents=[_output_options(defaults=True)])
    p.add_argument("--version", action=_VersionAction, help="show the version and exit")
    output = _output_options(defaults=False)
    sub = _with_output(p.add_subparsers(title="commands", metavar="COMMAND"), output)

    cache_opt = argparse.ArgumentParser(add_help=False)
    cache_opt.add_argument("--cache-dir", metavar="DIR",
                           help="cache folder (overrides build.cache_dir and $TINYTRAIN_CACHE_DIR)")

    b = sub.add_parser("build", parents=[cache_opt], help="build the spec (restoring what is cached)",
                       epilog=EPILOG)
    b.add_argument("spec", metavar="SPEC")
    g = b.add_mutually_exclusive_group()
    g.add_argument("--until", metavar="STAGE", help=f"stop after STAGE ({stage_names})")
    g.add_argument("--only", metavar="STAGE", help="build only STAGE; its inputs must be cached")
    b.add_argument("--force", metavar="STAGE", action="append", help="rerun STAGE even if cached (repeatable)")
    b.add_argument("--dry-run", action="store_true", help="say what would run and why, run nothing")
    b.add_argument("--json", action="store_true", help="print one JSON document (for CI) on stdout")
    b.set_defaults(func=_cmd_build)

    s = sub.add_parser("status", parents=[cache_opt], help="per stage: cached, will run (and why), not implemented")
    s.add_argument("spec", metavar="SPEC")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_cmd_status)

    e = sub.add_parser("explain", parents=[cache_opt], help="why STAGE would rerun: what changed, field by field")
    e.add_argument("spec", metavar="SPEC")
    e.add_argument("stage", metavar="STAGE")
    e.set_defaults(func=_cmd_explain)

    i = sub.add_parser("inspect", parents=[cache_opt], help="readable view of a stage's artifacts")
    i.add_argument("spec", metavar="SPEC")
    i.add_argument("stage", metavar="STAGE")
    i.add_argument("artifact", metavar="ARTIFACT", nargs="?", help="one artifact file name (default: all)")
    i.set_defaults(func=_cmd_inspect)

    n = sub.add_parser("infer", parents=[cache_opt], help="run the reference executor on a stage's graph")
    n.add_argument("spec", metavar="SPEC")
    n.add_argument("--stage", required=True, metavar="STAGE", help="stage whose IR to run (e.g. load, quantize)")
    n.add_argument("--input", required=True, metavar="IN.npy", help="input batch, batch dimension first")
    n.add_argument("--output", required=True, metavar="OUT.npy", help="where to write the output(s)")
    n.set_defaults(func=_cmd_infer)

    x = sub.add_parser("export", parents=[cache_opt], help="the model's C training library as a folder")
    x.add_argument("spec", metavar="SPEC")
    x.add_argument("--to", metavar="DIR", required=True)
    x.set_defaults(func=_cmd_export)
    gr = sub.add_parser("graph", parents=[cache_opt], help="the stage graph (with each stage's state if SPEC is given)")
    gr.add_argument("spec", metavar="SPEC", nargs="?")
    gr.add_argument("--format", choices=("text", "mermaid", "dot"), default="text")
    gr.set_defaults(func=_cmd_graph)

    c = sub.add_parser("clean", help="remove <out_dir>/<name>/ (the cache is left alone)")
    c.add_argument("spec", metavar="SPEC")
    c.set_defaults(func=_cmd_clean)

    ca = sub.add_parser("cache", help="the local cache: stats, gc")
    csub = _with_output(ca.add_subparsers(title="cache commands", metavar="COMMAND"), output)
    cs = csub.add_parser("stats", parents=[cache_opt], help="size, entries, hits and misses of the last build")
    cs.add_argument("spec", metavar="SPEC", nargs="?", help="use this spec's cache folder")
    cs.add_argument("--json", action="store_true")
    cs.set_defaults(func=_cmd_cache_stats)
    cg = csub.add_parser("gc", parents=[cache_opt], help="drop old / least recently used entries")
    cg.add_argument("spec", metavar="SPEC", nargs="?", help="use this spec's cache folder")
    cg.add_argument("--max-size", metavar="SIZE", help="keep the cache at most this big, e.g. 500M, 2G")
    cg.add_argument("--max-age", metavar="AGE", help="drop entries unused for longer, e.g. 30d, 12h")
    cg.set_defaults(func=_cmd_cache_gc)
    ca.set_defaults(func=lambda a: (ca.print_help(sys.stderr), EXIT_USER_ERROR)[1])

    sc = sub.add_parser("schema", help="print the JSON Schema of the spec (for editors)")
    sc.add_argument("--markdown", action="store_true", help="print the YAML reference table of the README instead")
    sc.set_defaults(func=_cmd_schema)
    return p

