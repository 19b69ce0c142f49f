"""A stream's steps merged into one step of the memory model's abstract program (memory_model.MemoryModel._simulate).

The abstract program is a list of steps (type, SRAM inputs, outputs), in order. The reorder stage's planner runs a
stream's ops as one group and keeps the group's tensors for the whole group, without in-place sharing inside it
(streams._gather makes the ops consecutive). The memory model mirrors that with one step that reads and writes all
its members do. The position stream (memory_model._merge_positions) and the hidden-channel streams
(channel_stream.merge_steps) both merge this way.
"""
from __future__ import annotations


def merge_group(steps: list[tuple], members: list[int], kind: str) -> dict[int, int] | None:
    """steps[members] (members[0] the first, in the order given) become one step of type `kind` reading what the
    members read and do not make, and writing all they write. The steps between the members that write what the
    group reads go before it, the others after, as streams._gather orders ops. Returns the old -> new index of every
    step; None, with `steps` untouched, when a step between them both feeds the group and reads what it makes (the
    planner would not gather it either)."""
    first, last = members[0], max(members)
    inside = set(members)
    made = {t for k in members for t in steps[k][2]}
    reads = {t for k in members for t in steps[k][1]}
    before, after = [], []
    for k in range(first, last + 1):
        if k in inside:
            continue
        if set(steps[k][2]) & reads:
            if set(steps[k][1]) & made:
                return None
            before.append(k)
        else:
            after.append(k)
    merged = (kind, list(dict.fromkeys(t for k in members for t in steps[k][1] if t not in made)),
              list(dict.fromkeys(t for k in members for t in steps[k][2])))
    span = [steps[k] for k in before] + [merged] + [steps[k] for k in after]
    remap = {k: k for k in range(first)}
    remap.update({k: first + n for n, k in enumerate(before)})
    remap.update({k: first + len(before) for k in members})
    remap.update({k: first + len(before) + 1 + n for n, k in enumerate(after)})
    shift = (last + 1 - first) - len(span)
    remap.update({k: k - shift for k in range(last + 1, len(steps))})
    steps[first:last + 1] = span
    return remap
