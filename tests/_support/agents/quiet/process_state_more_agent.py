"""More process state that snapshots do not hold: the working directory, redirected
standard streams and environment variables, set by the agent's own code."""

import contextlib
import io
import os
import sys

import tcc


@tcc.effect
def step(n: int) -> int:
    return n


async def main():
    here = os.getcwd()
    with contextlib.chdir(here):
        await step(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        await step(2)
    os.environ["AGENT_MODE"] = "test"
    os.environ.update({"AGENT_STEP": "3"})
    saved, sys.stdout = sys.stdout, io.StringIO()
    sys.stdout = saved
    os.chdir(here)
    return await Agent().run()


class Agent:
    history = []  # shared by every instance: the import makes it anew

    async def run(self):
        self.history.append(await step(3))
        return self.history[-1]


class BaseModel:  # (stands for pydantic's: a model class copies its field defaults)
    pass


class Note(BaseModel):
    tags: list = []

    def tag(self, t):
        self.tags.append(t)  # not named: a model's instance has its own copy
