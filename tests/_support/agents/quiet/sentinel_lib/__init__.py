"""A library package beside the agents (a sub-folder: not one of their own modules)."""

MISSING = object()  # "no cached value": tested with `is`


class Cache:
    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def get(self, key: str) -> object:
        return self.data.get(key, MISSING)
