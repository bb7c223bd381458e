"""A library object imported by name: os.environ (review of issue 17)."""

import tcc
from os import environ

@tcc.effect
async def call_api(i):
    return f"{i}:{len(environ.get('MY_KEY', ''))}"

async def main():
    out = []
    for i in range(3):
        out.append(await call_api(i))
    return out
