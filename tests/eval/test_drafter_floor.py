"""eval/engine/drafter_floor.py: a request's match length drops to 1 once its drafter's verified chains average
under the floor, read from how its context grew; it never reads ahead of the step."""

import pytest

from headstart.eval.engine.drafter_floor import AFTER, WEAK_MIN_MATCH, DrafterFloor


def steps(floor: DrafterFloor, request, accepted: list[int], drafts: int = 3, length: int = 10) -> int:
    """Verify the request's drafter chain of `drafts` once per entry of `accepted`, each accepting that many."""
    for a in accepted:
        floor.seen(request, length)
        floor.drafted(request, length, drafts)
        length += a + 1  # the accepted drafts and the bonus token
    floor.seen(request, length)
    return length


def test_the_floor_needs_after_chains_and_an_average_under_it():
    floor = DrafterFloor(0.5)
    steps(floor, "a", [0] * (AFTER - 1))
    assert floor.min_match("a", 2) == 2  # too few chains to judge
    steps(floor, "b", [0] * AFTER)
    assert floor.min_match("b", 2) == WEAK_MIN_MATCH
    steps(floor, "c", [1, 0, 0, 1])  # 0.5 a step: not under the floor
    assert floor.min_match("c", 2) == 2
    steps(floor, "d", [1, 0, 0, 0])  # 0.25
    assert floor.min_match("d", 3) == WEAK_MIN_MATCH and floor.min_match("d", 1) == 1
    assert floor.min_match("never seen", 2) == 2


def test_only_the_drafters_chains_count_and_a_grown_context_is_clamped_to_its_drafts():
    floor = DrafterFloor(1.0)
    floor.seen("a", 10)
    floor.seen("a", 15)  # a lookup step (no drafter chain pending): nothing counted
    assert floor.requests["a"][:2] == [0, 0]
    floor.drafted("a", 15, 2)
    floor.seen("a", 30)  # more than 2 drafts + bonus (e.g. a preempted request recomputed): 2 at most
    assert floor.requests["a"][:2] == [1, 2]
    floor.drafted("a", 30, 0)  # no drafts verified: nothing pending
    floor.seen("a", 31)
    assert floor.requests["a"][:2] == [1, 2]


def test_requests_that_left_are_forgotten_and_a_bad_floor_is_refused():
    floor = DrafterFloor(0.2)
    for request in "abc":
        steps(floor, request, [0])
    floor.keep(["b"])
    assert set(floor.requests) == {"b"}
    with pytest.raises(ValueError, match=r"drafter_floor=0: must be > 0.*Fix"):
        DrafterFloor(0)
