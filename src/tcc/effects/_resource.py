"""``tcc.resource``: keep a live client in a local across checkpoints.

The proxy is captured as "call this factory again", never as the live object,
so sockets, locks and connection pools inside the client are rebuilt on
restore instead of refused.
"""

from __future__ import annotations

from typing import Any, Callable

# "Not built yet".  Not None: a factory may return None, and must then be
# called once, not again on every use.  Never captured: a snapshot records the
# factory call (``__reduce__``), not ``_obj``.
_UNBUILT: Any = object()


class Resource:
    """A lazily built object that snapshots as its factory call."""

    __slots__ = ("_factory", "_args", "_kwargs", "_obj")

    def __init__(self, factory: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, "_factory", factory)
        object.__setattr__(self, "_args", args)
        object.__setattr__(self, "_kwargs", kwargs)
        object.__setattr__(self, "_obj", _UNBUILT)

    def _get(self) -> Any:
        obj = object.__getattribute__(self, "_obj")
        if obj is _UNBUILT:
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

    # Special methods are looked up on the type, not through __getattr__.
    def __enter__(self) -> Any:
        return self._get().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self._get().__exit__(*exc)

    async def __aenter__(self) -> Any:
        return await self._get().__aenter__()

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._get().__aexit__(*exc)

    def __iter__(self) -> Any:
        return iter(self._get())

    def __bool__(self) -> bool:
        # Without it, truth falls back to __len__, which the built object may lack.
        return bool(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __getitem__(self, key: Any) -> Any:
        return self._get()[key]

    def __contains__(self, item: Any) -> bool:
        return item in self._get()

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
