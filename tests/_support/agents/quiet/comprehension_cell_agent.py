"""An await inside comprehensions whose loop variable has the name of a variable a closure
keeps (a cell): on 3.12+ the inlined comprehension keeps the cell on the value stack and
uses the slot as a plain local until it stores the cell back."""
import tcc


@tcc.effect
def fetch(name):
    return str(name).upper()


async def main():
    name = "default"
    label = lambda: f"[{name}]"  # noqa: E731 - makes ``name`` a cell of main
    results = {name: await fetch(name) for name in ["a", "b", "c"]}
    key = "k"
    again = lambda: key  # noqa: E731
    nested = [[await fetch((key, j)) for key in "xy"] for j in range(2)]
    return [results, nested, label(), again()]
