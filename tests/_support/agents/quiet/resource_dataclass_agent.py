"""A dataclass holding a tcc.resource, passed to an effect method (review of issue 17)."""

import dataclasses
import tcc

class Client:
    def ask(self, q): return q.upper()

@dataclasses.dataclass
class Bot:
    client: object
    name: str

    @tcc.effect
    def ask(self, q):
        return self.client.ask(q)

async def main():
    bot = Bot(tcc.resource(Client), "b")
    out = []
    for q in ["a", "b", "c"]:
        out.append(await bot.ask(q))
    return out
