"""Names of the journal's marker records: a wait, a sleep and a spawn are journaled like
effect calls (so a resumed run finds them in order), under these names."""

WAIT_EFFECT = "tcc:wait"  # tcc.wait_for / tcc.approval: args are the wait id, or (id, deadline)
SLEEP_EFFECT = "tcc:sleep"  # tcc.sleep / sleep_until: args are the wake time
SPAWN_EFFECT = "tcc:spawn"  # tcc.spawn: args are (function name, *args)
MARKERS = (WAIT_EFFECT, SLEEP_EFFECT)  # markers that are not effects (`tcc show` counts effects)


def wait_args(wait_id: str, deadline: float | None) -> object:
    """What a wait's marker journals: its id, and the deadline of a wait with a timeout (a
    resumed run keeps the first deadline; a signal sent after it goes to the next wait)."""
    return wait_id if deadline is None else (wait_id, deadline)


def read_wait_args(value: object) -> tuple[str | None, float | None]:
    """``(wait id, deadline)`` from a wait marker's journaled arguments (a bare id, as all
    runs journaled before deadlines were, has none); ``(None, None)`` if malformed."""
    if isinstance(value, str):
        return value, None
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) \
            and isinstance(value[1], (int, float)) and not isinstance(value[1], bool):
        return value[0], float(value[1])
    return None, None
