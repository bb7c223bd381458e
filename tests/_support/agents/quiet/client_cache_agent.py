"""A module-level cache filled with uncapturable clients inside effects (review of issue 17)."""

import threading
import tcc

_clients = {}          # lazily built clients, used only inside effects

class Client:
    def __init__(self):
        self._lock = threading.Lock()     # like any HTTP client's pool
    def get(self, q):
        with self._lock:
            return q.upper()

def client(name):
    if name not in _clients:
        _clients[name] = Client()
    return _clients[name]

@tcc.effect
def search(q):
    return client("search").get(q)

async def main():
    return [await search(q) for q in ["a", "b"]]
