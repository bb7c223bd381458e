"""A module next to the agent script, with state of its own."""

HISTORY = []


def remember(value):
    HISTORY.append(value)
