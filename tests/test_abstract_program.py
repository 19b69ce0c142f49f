"""abstract_program.merge_group: a stream's steps as one step of the memory model's abstract program, the steps
between its members ordered as streams._gather orders ops."""
from tinytrain.stages.planning.abstract_program import merge_group


def test_members_become_one_step_with_the_others_before_or_after():
    steps = [("a", ["x"], ["g0"]),          # member
             ("w", ["p"], ["wq"]),          # the group reads wq: before it
             ("m", ["g0", "wq"], ["g1"]),   # member
             ("u", ["g0"], []),             # reads what the group makes: after it
             ("b", ["g1"], ["g2"]),         # member
             ("z", ["g2"], ["out"])]
    remap = merge_group(steps, [0, 2, 4], "kind")
    assert steps == [("w", ["p"], ["wq"]), ("kind", ["x", "wq"], ["g0", "g1", "g2"]), ("u", ["g0"], []),
                     ("z", ["g2"], ["out"])]
    assert remap == {0: 1, 1: 0, 2: 1, 3: 2, 4: 1, 5: 3}


def test_a_step_that_feeds_the_group_and_needs_it_refuses_the_merge():
    steps = [("a", ["x"], ["g0"]), ("t", ["g0"], ["v"]), ("m", ["g0", "v"], ["g1"])]
    before = list(steps)
    assert merge_group(steps, [0, 2], "kind") is None
    assert steps == before
