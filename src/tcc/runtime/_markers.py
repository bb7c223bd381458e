"""Names of the journal's marker records: a wait, a sleep and a spawn are journaled like
effect calls (so a resumed run finds them in order), under these names."""

WAIT_EFFECT = "tcc:wait"  # tcc.wait_for / tcc.approval: args are the wait id
SLEEP_EFFECT = "tcc:sleep"  # tcc.sleep / sleep_until: args are the wake time
SPAWN_EFFECT = "tcc:spawn"  # tcc.spawn: args are (function name, *args)
MARKERS = (WAIT_EFFECT, SLEEP_EFFECT)  # markers that are not effects (`tcc show` counts effects)
