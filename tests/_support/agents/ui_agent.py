"""Agents for the dashboard's tests (FUNC selects one)."""

import tcc


@tcc.effect
def plan(topic):
    return [f"step {i} of {topic}" for i in range(3)]


@tcc.effect
def deploy(steps):
    return f"deployed {len(steps)} steps"


async def gated(topic="x"):
    """A plan, an approval, then a deploy: parks at the approval."""
    steps = await plan(topic)
    note = "<script>window.pwned = 1</script>"  # a local the page must show as text
    ok = await tcc.approval("Deploy to prod?")
    done = await deploy(steps) if ok else "rolled back"
    return {"ok": ok, "done": done, "note": note}


async def signalled(topic="x"):
    """Waits for the signal 'go', then plans with its value."""
    value = await tcc.wait_for("go")
    return await plan(f"{topic}/{value}")


async def quick(topic="x"):
    """Finishes at once."""
    return await plan(topic)


async def parent(topic="x"):
    """Spawns a child run (gated) and waits for it."""
    return await tcc.spawn(gated, topic)
