"""The model input fed to a row stream row by row (stages/planning/streams.py fed_inputs): the C of its source op.

    RowFeed(gen, stream, sources, outside)   what stream_rows (codegen.py) adds for a stream with a fed input

The stream's `tt_stream_rows` call gets one more op in front, the source (op 0, n_in TT_ROW_SOURCE): tt_stream_rows
asks the call's ctx, the program's `tt_feed`, for its rows (kernels_c/tt_stream.h tt_row_feed_next). The API sets
`tt_feed` before each forward: tt_model.h's *_rows entry points take a row source, the calls taking a whole input
read it through tt_rows_from_memory. The source op keeps the window of input rows the stream's readers need (the
input tensor's place in the arena, planned at the window's bytes): the whole input never exists in SRAM. A source
that fails stops the program function right after the stream, before anything is trained
(`if (tt_feed.status != 0) return;`); the API reports TT_ERR_IO.

`gen.input_feed` tells stages/c_emit/api.py (ApiParts.input_feed) the input's rows and the buffer's bytes.
"""

from __future__ import annotations

from typing import Any

from tinytrain.stages.c_emit.literals import CodegenError
from tinytrain.stages.planning.streams import MAX_ROW_OPS, with_feeds

FEED = "tt_feed"   # the generated program's tt_row_feed (static, set by the API before each forward)


class RowFeed:
    def __init__(self, gen: Any, st: Any, geos: list[dict[str, Any]], sources: list[list[int]], outside: list[str]):
        self.gen = gen
        self.fed = [t for t in st.info.get("fed") or []]
        self.n = len(self.fed)
        self.geos, self.sources = with_feeds(gen.g, geos, sources, outside, self.fed) if self.fed \
            else (list(geos), [list(s) for s in sources])
        if len(self.geos) > MAX_ROW_OPS:
            raise CodegenError(f"a row stream of more than {MAX_ROW_OPS} ops with its input fed (TT_STREAM_MAX_OPS)")
        if self.fed:
            if len(self.fed) != 1 or (gen.input_feed is not None and gen.input_feed["tensor"] != self.fed[0]):
                raise CodegenError("more than one fed model input")
            t = self.fed[0]
            gen.input_feed = {"tensor": t, "buffer_bytes": int(st.chunked[t])}
            decl = f"static tt_row_feed {FEED}; /* the model input's row source during a call (tt_model.h) */"
            if decl not in gen.globals:
                gen.globals.append(decl)
            self.windows = [int(st.info["windows"][t]) for t in self.fed]

    def rows(self) -> list[str]:
        """tt_row_op entries of the source ops."""
        return [f"{{{g['in_h']}, {g['out_h']}, 1, 0, 1, TT_ROW_SOURCE, {{0, 0}}, {{0, 0}}, {g['out_row']}, {w}}}"
                for g, w in zip(self.geos[:self.n], self.windows if self.n else [])]

    def bufs(self) -> list[str]:
        """The source ops' windows: the fed input's (window-sized) place in the arena."""
        return [f"(uint8_t *){self.gen.loc(t)}" for t in self.fed]

    def ext(self, t: str) -> str:
        """An outside input's pointer: a fed one is never read whole (its reads go to the source op)."""
        return "0" if t in self.fed else f"(const uint8_t *){self.gen.loc(t)}"

    def ctx(self) -> str:
        return f"&{FEED}" if self.fed else "0"

    def after(self) -> list[str]:
        """Stops the program function when the source failed (nothing is trained on a partial input)."""
        return [f"if ({FEED}.status != 0) {{", "    return;", "}"] if self.fed else []
