"""``tcc.resource``: keep a live client in a local across checkpoints.

The proxy is captured as "call this factory again", never as the live object,
so sockets, locks and connection pools inside the client are rebuilt on
restore instead of refused.
"""

from __future__ import annotations

from typing import Any, Callable


class Resource:
    """A lazily built object that snapshots as its factory call."""

    __slots__ = ("_factory", "_args", "_kwargs", "_obj")

    def __init__(self, factory: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, "_factory", factory)
        object.__setattr__(self, "_args", args)
        object.__setattr__(self, "_kwargs", kwargs)
        object.__setattr__(self, "_obj", None)

    def _get(self) -> Any:
        obj = object.__getattribute__(self, "_obj")
        if obj is None:
            factory = object.__getattribute__(self, "_factory")
            obj = factory(*object.__getattribute__(self, "_args"), **object.__getattribute__(self, "_kwargs"))
            object.__setattr__(self, "_obj", obj)
        return obj

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._get(), name, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._get()(*args, **kwargs)

    def __reduce__(self) -> Any:
        return (
            Resource._rebuild,
            (
                object.__getattribute__(self, "_factory"),
                object.__getattribute__(self, "_args"),
                object.__getattribute__(self, "_kwargs"),
            ),
        )

    @staticmethod
    def _rebuild(factory: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> "Resource":
        return Resource(factory, *args, **kwargs)

    def __repr__(self) -> str:
        factory = object.__getattribute__(self, "_factory")
        return f"<tcc.resource {getattr(factory, '__qualname__', factory)!r}>"


def resource(factory: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Wrap ``factory(*args, **kwargs)`` so that it survives checkpoints.

    ``client = tcc.resource(openai.OpenAI)`` behaves like the client; a
    snapshot records the factory and its arguments, and the client is built
    again, lazily, after a restore.
    """
    return Resource(factory, *args, **kwargs)
