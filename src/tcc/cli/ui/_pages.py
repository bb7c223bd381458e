"""The dashboard's HTML, rendered on the server from the API's documents.

Every text that comes from a run -- ids, entries, reprs of locals, errors, event details --
goes through :func:`h` (``html.escape``), so a local holding ``<script>`` shows as text.
The pages load one script and one style sheet from ``/static/``; the Content-Security-
Policy the server sends allows nothing else (no inline script).  Regions marked
``data-live`` are fetched again every second by that script, which is how an open page
follows a run without a reload.
"""

from __future__ import annotations

import datetime
import html
import json
from typing import Any
from urllib.parse import quote, urlencode

from ...runtime import MARKERS, SLEEP_EFFECT, WAIT_EFFECT
from ...store import FINISHED_STATUSES, RUN_STATUSES


PAGE_CALLS = 200  # calls in a run page's timeline (the API's document has up to 1,000)


def h(value: Any) -> str:
    """``value`` as HTML text (quotes escaped too, so it is safe in an attribute)."""
    return html.escape(str(value), quote=True)


def _t(ts: float | None) -> str:
    if ts is None:
        return ""
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _clock(ts: float | None) -> str:
    if ts is None:
        return ""
    return datetime.datetime.fromtimestamp(ts).strftime("%H:%M:%S.%f")[:-3]


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def _run_url(run_id: str, suffix: str = "") -> str:
    return f"/runs/{quote(run_id, safe='')}{suffix}"


def _api_url(run_id: str, action: str) -> str:
    return f"/api/runs/{quote(run_id, safe='')}/{action}"


def badge(status: str) -> str:
    return f'<span class="badge s-{h(status)}">{h(status)}</span>'


def page(title: str, body: str, *, csrf: str, store_label: str, tenant: str) -> str:
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="tcc-csrf" content="{h(csrf)}">
<title>{h(title)} · tcc</title>
<link rel="stylesheet" href="/static/app.css">
<script src="/static/app.js" defer></script>
</head>
<body>
<header>
  <a class="brand" href="/">tcc</a>
  <span class="where">store <code>{h(store_label)}</code> · tenant <code>{h(tenant)}</code></span>
</header>
<div id="flash" role="status" hidden></div>
<div id="confirm" role="dialog" aria-modal="true" hidden>
  <p id="confirm-text"></p>
  <button type="button" id="confirm-yes" class="primary">Confirm</button>
  <button type="button" id="confirm-no">Cancel</button>
</div>
<main>
{body}
</main>
</body>
</html>
"""


def error_page(status: int, message: str) -> str:
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{status} · tcc</title>
<link rel="stylesheet" href="/static/app.css"></head>
<body><main><h1>{status}</h1><p class="error">{h(message)}</p>
<p><a href="/">All runs</a></p></main></body></html>
"""


# ------------------------------------------------------------------ run list

def runs_page(status: str | None, query: str | None) -> str:
    problem = ""
    if status is not None and status not in RUN_STATUSES:
        problem = f'<p class="error">There is no status {h(status)!s}: pick one of the list.</p>'
        status = None
    options = "".join(
        f'<option value="{h(s)}"{" selected" if s == status else ""}>{h(s)}</option>'
        for s in RUN_STATUSES)
    params = urlencode({k: v for k, v in (("status", status), ("q", query)) if v})
    live = "/fragments/runs" + (f"?{params}" if params else "")
    return f"""<h1>Runs</h1>
<form class="filters" method="get" action="/">
  <label>Status <select name="status"><option value="">any</option>{options}</select></label>
  <label>Search <input type="search" name="q" value="{h(query or '')}" placeholder="run id or entry"></label>
  <button type="submit">Filter</button>
</form>
{problem}
<div id="runs" data-live="{h(live)}"></div>
"""


def runs_fragment(doc: dict[str, Any], filtered: bool = False) -> str:
    rows = []
    for r in doc["runs"]:
        waits = ""
        if r["waits"]:
            waits = "".join(
                f'<span class="wait">{h(w.get("kind", "signal"))} {h(w.get("prompt") or w.get("name") or w["id"])}'
                f' ({h(w["signal"])})</span>' for w in r["waits"])
        owner = h(r["owner"])
        if r["owner_alive"] is False:
            owner += ' <span class="gone">gone</span>'
        last = r["last_event"]
        last_text = "" if last is None else f'{h(last["kind"])} <span class="dim">{_clock(last["time"])}</span>'
        cls = ' class="needs-human"' if r["needs_human"] else ""
        mark = (" <span class=needs>needs you</span>" if r["needs_human"] else
                " <span class=ready>ready to resume</span>" if r.get("ready") else "")
        rows.append(
            f'<tr{cls} data-run="{h(r["id"])}"><td><a class="run-link" href="{h(_run_url(r["id"]))}">{h(r["id"])}</a>'
            f'{mark}</td>'
            f'<td>{badge(r["status"])} {waits}</td><td><code>{h(r["entry"])}</code></td>'
            f'<td title="{h(_t(r["created"]))}">{h(r["age"])}</td><td>{owner}</td><td>{last_text}</td></tr>')
    if not rows and filtered:
        body = '<p class="empty">No runs match these filters.</p>'
    elif not rows:
        body = '<p class="empty">No runs here yet. Start one with <code>tcc run SCRIPT</code>.</p>'
    else:
        more = ""
        if doc["shown"] < doc["total"]:
            more = f'<p class="dim">showing the newest {doc["shown"]} of {doc["total"]} runs</p>'
        body = ('<table class="runs"><thead><tr><th>Run</th><th>Status</th><th>Entry</th><th>Age</th>'
                '<th>Owner</th><th>Last event</th></tr></thead><tbody>' + "".join(rows)
                + "</tbody></table>" + more)
    damaged = "".join(f'<p class="error">run {h(d["id"])} is not listed: {h(d["why"])}</p>'
                      for d in doc["damaged"])
    return body + damaged


# ------------------------------------------------------------------ one run

def run_page(run_id: str, code: dict[str, Any] | None) -> str:
    code_html = ""
    if code is not None:
        if code["changed"]:
            code_html = ('<section><h2>Code</h2><p class="error">The code of these frames changed since '
                         f'snapshot {h(code["snapshot"])}, so a resume refuses them (`tcc resume '
                         '--strategy replay` re-executes the run instead, if it still makes the same '
                         'calls): ' + ", ".join(f"<code>{h(c)}</code>" for c in code["changed"]) + "</p></section>")
        else:
            code_html = (f'<section><h2>Code</h2><p>The frames of snapshot {h(code["snapshot"])} match '
                         "the code on disk.</p></section>")
    return f"""<p><a href="/">← all runs</a></p>
<div id="run" data-live="{h('/fragments' + _run_url(run_id))}"></div>
{code_html}
"""


def _actions(doc: dict[str, Any]) -> str:
    """What can be done to the run in its state (a finished run: only a fork)."""
    run_id = doc["id"]
    stack_link = (f'<p><a href="{h(_run_url(run_id, "/stack"))}">Frozen stack and fork…</a></p>'
                  if any(not s.get("damaged") for s in doc["snapshots"]) else
                  '<p class="dim">No snapshot to show or fork (a replay run takes none).</p>')
    if doc["status"] in FINISHED_STATUSES:
        return f'<section class="actions"><h2>Actions</h2>{stack_link}</section>'
    return f"""<section class="actions"><h2>Actions</h2>
  <form class="act">
    <button type="button" data-action="resume" data-url="{h(_api_url(run_id, 'resume'))}"
      data-confirm="Resume run {h(run_id)} in a new tcc resume process?">Resume</button>
  </form>
  <form class="act">
    <input name="reason" placeholder="reason (optional)">
    <button type="button" class="danger" data-action="cancel" data-url="{h(_api_url(run_id, 'cancel'))}"
      data-confirm="Cancel run {h(run_id)}? It is never resumed again.">Cancel run</button>
  </form>
  <form class="act">
    <input name="name" placeholder="signal name">
    <input name="value" data-json placeholder="value as JSON (default null)">
    <button type="button" data-action="signal" data-url="{h(_api_url(run_id, 'signal'))}"
      data-confirm="Send this signal to run {h(run_id)}?">Send signal</button>
  </form>
  {stack_link}
</section>"""


def _tree(node: dict[str, Any]) -> str:
    kids = "".join(f"<li>{_tree(k)}</li>" for k in node["children"])
    more = f' <span class="dim">(+{node["more"]} more)</span>' if node.get("more") else ""
    link = f'<a href="{h(_run_url(node["id"]))}">{h(node["id"])}</a> {badge(node["status"])}{more}'
    return link + (f"<ul>{kids}</ul>" if kids else "")


def _timeline(doc: dict[str, Any]) -> str:
    items: list[tuple[float, str]] = []
    for c in doc["calls"]:
        name = c["name"]
        kind = ("wait" if name == WAIT_EFFECT else "sleep" if name == SLEEP_EFFECT
                else "marker" if name in MARKERS else "effect")
        if c["status"] == "error":
            outcome = f'<span class="error">raised {h(c["error"])}</span>'
        elif c["status"] == "pending":
            outcome = '<span class="dim">no outcome recorded yet</span>'
        else:
            outcome = f"→ <code>{h(c['result'])}</code>"
        attempt = f' <span class="dim">attempt {h(c["attempt"])}</span>' if c["attempt"] and c["attempt"] > 1 else ""
        items.append((c["time"] or 0.0,
                      f'<tr class="t-{kind}"><td>{_clock(c["time"])}</td><td>{kind}</td>'
                      f'<td><code>{h(c["call"])}</code> {outcome}{attempt}</td>'
                      f'<td>{h(_duration(c["duration"]))}</td></tr>'))
    for e in doc["events"]:
        data = e.get("data") or {}
        detail = " ".join(f"{h(k)}={h(json.dumps(v) if not isinstance(v, str) else v)}" for k, v in data.items())
        items.append((e["time"], f'<tr class="t-event"><td>{_clock(e["time"])}</td><td>{h(e["kind"])}</td>'
                                 f'<td class="dim">{detail}</td><td></td></tr>'))
    items.sort(key=lambda item: item[0])
    earlier = ""
    if doc["calls_earlier"]:
        earlier = f'<p class="dim">{h(doc["calls_earlier"])} earlier calls are not listed</p>'
    elif doc["calls_earlier"] is None:  # only the journal's end was read
        earlier = (f'<p class="dim">Only the last {len(doc["calls"])} calls are listed (the journal has '
                   f'{h(doc["journal_records"])} records; <code>tcc show --all-calls</code> lists them all).</p>')
    return (earlier + '<table class="timeline"><thead><tr><th>Time</th><th>What</th><th>Detail</th>'
            '<th>Duration</th></tr></thead><tbody>' + "".join(i[1] for i in items) + "</tbody></table>")


def _waits(run_id: str, doc: dict[str, Any]) -> str:
    if not doc["waits"]:
        return ""
    out = ['<section class="waits"><h2>Waiting</h2>']
    for w in doc["waits"]:
        what = (f'Approval <strong>{h(w.get("prompt") or "")}</strong>' if w.get("kind") == "approval"
                else f'Signal <code>{h(w.get("name"))}</code>')
        ident = f' <span class="dim">(id {h(w["id"])})</span>'
        if w["signal"] != "not sent":  # answered: the run goes on when it is resumed
            out.append(f'<form class="wait-card answered act"><p>{what}{ident}: answered. The run goes on '
                       'when it is resumed (here, or by <code>tcc worker</code>).</p>'
                       f'<button type="button" class="primary" data-action="resume" '
                       f'data-url="{h(_api_url(run_id, "resume"))}" data-confirm="Resume run {h(run_id)} '
                       'in a new tcc resume process?">Resume</button></form>')
        elif w.get("kind") == "approval":
            label = h(w.get("prompt") or w["id"])
            out.append(
                f'<form class="wait-card act"><p>{what}{ident}</p>'
                '<input name="comment" placeholder="comment (optional)">'
                f'<button type="button" class="primary" data-action="approve" data-url="{h(_api_url(run_id, "approve"))}"'
                f' data-confirm="Approve: {label}">Approve</button>'
                f'<button type="button" class="danger" data-action="reject" data-url="{h(_api_url(run_id, "reject"))}"'
                f' data-confirm="Reject: {label}">Reject</button></form>')
        else:
            out.append(f'<p class="wait-card">{what}{ident}: send it with the form under Actions</p>')
    out.append("</section>")
    return "".join(out)


def run_fragment(doc: dict[str, Any], tree: dict[str, Any]) -> str:
    run_id = doc["id"]
    forked_from = next((e["data"].get("parent") for e in doc["events"] if e["kind"] == "forked"), None)
    owner = h(doc["owner"])
    if doc.get("unstarted_fork"):
        owner = '<span class="dim">none yet: a fork that has not been started (Resume starts it)</span>'
    elif doc["owner_alive"] is False:
        owner += ' <span class="gone">gone: a resume or the worker takes it over</span>'
    args = " ".join(map(str, doc["args"]))
    parent = doc["parent"] or forked_from
    final = ' data-final="1"' if doc["status"] in FINISHED_STATUSES else ""
    parts = [f'<h1{final}>Run <code>{h(run_id)}</code> <span id="run-status">{badge(doc["status"])}</span></h1>',
             '<table class="facts">',
             f"<tr><th>Entry</th><td><code>{h(doc['entry'])} {h(args)}</code></td></tr>",
             f"<tr><th>Strategy</th><td>{h(doc['strategy'])} · epoch {h(doc['epoch'])}</td></tr>",
             f"<tr><th>Owner</th><td>{owner}</td></tr>",
             f"<tr><th>Created</th><td>{_t(doc['created'])} · updated {_t(doc['updated'])}</td></tr>",
             f"<tr><th>Effects</th><td>{h(doc['effects'] if doc['effects'] is not None else 'not counted')}"
             f" · checkpoints {h(doc['checkpoints'])}</td></tr>"]
    if parent:
        how = "forked from" if forked_from else "spawned by"
        parts.append(f'<tr><th>Parent</th><td>{how} <a href="{h(_run_url(parent))}">{h(parent)}</a></td></tr>')
    parts.append("</table>")
    if doc["result"] is not None or doc["status"] == "completed":
        parts.append(f'<section><h2>Result</h2><pre id="run-result">{h(json.dumps(doc["result"], indent=2))}</pre></section>')
    if doc["error"]:
        detail = doc.get("error_detail") or {}
        frames = "".join(f"<li><code>{h(f.get('file'))}:{h(f.get('line'))}</code> in {h(f.get('function'))}"
                         f"{' — <code>' + h(f['source']) + '</code>' if f.get('source') else ''}</li>"
                         for f in (detail.get("frames") or []) if isinstance(f, dict))
        parts.append(f'<section><h2>Error</h2><p class="error">{h(doc["error"])}</p>'
                     + (f"<ol class='tb'>{frames}</ol>" if frames else "") + "</section>")
    parts.append(_waits(run_id, doc))
    parts.append(_actions(doc))
    if tree["children"]:
        parts.append('<section><h2>Children</h2><ul class="tree">'
                     + "".join(f"<li>{_tree(k)}</li>" for k in tree["children"]) + "</ul></section>")
    if doc["snapshots"]:
        snaps = []
        for s in doc["snapshots"]:
            if s.get("damaged"):
                snaps.append(f'<li class="error">snapshot {h(s["number"])}: fails verification</li>')
            else:
                snaps.append(f'<li><a href="{h(_run_url(run_id, "/stack?at=" + str(s["number"])))}">snapshot '
                             f'{h(s["number"])}</a> <span class="dim">journal {h(s["journal"])} · '
                             f'{h(s["bytes"])} bytes</span></li>')
        parts.append('<section><h2>Snapshots</h2><ul class="snaps">' + "".join(snaps) + "</ul></section>")
    parts.append("<section><h2>Timeline</h2>" + _timeline(doc) + "</section>")
    return "".join(parts)


# --------------------------------------------------------------- frozen stack

def _frame(f: dict[str, Any], index: int) -> str:
    where = f'{h(f["file"] or "?")}:{h(f["line"] or "?")}'
    rows = "".join(
        f'<tr><td><code>{h(name)}</code></td><td><code class="repr">{h(value)}</code></td></tr>'
        for name, value in f["locals"].items())
    notes = "".join(f'<li>{h(n)}</li>' for n in f.get("notes") or [])
    changed = ' <span class="error">code changed</span>' if f.get("code_changed") else ""
    awaits = f'<p class="dim">awaits <code>{h(f["awaits"])}</code></p>' if f.get("awaits") else ""
    return (f'<article class="frame"><h3>#{index} <code>{h(f["qualname"] or f["function"])}</code> '
            f'<span class="dim">{where}</span>{changed}</h3>'
            + (f'<pre class="src">{h(f["source"])}</pre>' if f.get("source") else "")
            + awaits
            + (f'<table class="locals"><thead><tr><th>Local</th><th>Value</th></tr></thead><tbody>{rows}</tbody></table>'
               if rows else '<p class="dim">no locals</p>')
            + (f"<ul class='notes'>{notes}</ul>" if notes else "") + "</article>")


def stack_page(run_id: str, doc: dict[str, Any]) -> str:
    snaps = " ".join(
        (f"<strong>{n}</strong>" if n == doc["snapshot"] else
         f'<a href="{h(_run_url(run_id, "/stack?at=" + str(n)))}">{n}</a>') for n in doc["snapshots"])
    frames = "".join(_frame(f, i) for i, f in enumerate(doc["frames"]))
    awaiting = doc.get("awaiting")
    awaiting_html = ""
    if awaiting:
        awaiting_html = (f'<section><h2>Awaiting</h2><p><span class="badge">{h(awaiting.get("kind"))}</span> '
                         f'<code>{h(awaiting.get("text"))}</code></p></section>')
    pending = f'<p class="dim">{h(doc["pending"])}</p>' if doc.get("pending") else ""
    globals_html = ""
    if doc.get("globals"):
        rows = "".join(f'<tr><td><code>{h(m)}.{h(n)}</code></td><td><code class="repr">{h(v)}</code></td></tr>'
                       for m, vals in doc["globals"].items() for n, v in vals.items())
        globals_html = ('<section><h2>Module globals</h2><table class="locals"><tbody>' + rows
                        + "</tbody></table></section>")
    notes = "".join(f'<p class="note">{h(n)}</p>' for n in doc.get("notes") or [])
    innermost = doc["frames"][-1] if doc["frames"] else None
    fork_inputs = ""
    if innermost is not None:
        fork_inputs = "".join(
            f'<label class="local">{h(name)} <input data-local="{h(name)}" '
            f'placeholder="JSON; now {h(str(value)[:70])}"></label>'
            for name, value in innermost["locals"].items())
    answer_html = ""
    if (awaiting or {}).get("kind") in ("effect", "gather") \
            and str(doc.get("pending") or "").startswith("resumes by sending"):
        answer_html = ('<label>Answer the frame receives from the call it awaits (JSON, optional) '
                       '<input name="answer" data-json data-optional></label>')
    return f"""<p><a href="{h(_run_url(run_id))}">← run {h(run_id)}</a></p>
<h1>Frozen stack of <code>{h(run_id)}</code>, snapshot {h(doc["snapshot"])}</h1>
<p class="dim">snapshots: {snaps} · taken {_t(doc["taken"])} · journal {h(doc["journal_len"])} · {h(doc["size"])} bytes
· read without running any code of the run</p>
{notes}
{awaiting_html}
{pending}
<section id="frames"><h2>Frames (outermost first)</h2>{frames}</section>
{globals_html}
<section class="actions"><h2>Fork from snapshot {h(doc["snapshot"])}</h2>
<form id="fork-form" class="act">
  <input type="hidden" name="at" data-json value="{h(doc["snapshot"])}">
  <p class="dim">New values for the innermost frame's locals, as JSON (leave empty to keep a value):</p>
  {fork_inputs}
  {answer_html}
  <label>New run id (optional) <input name="run_id" data-optional></label>
  <button type="button" data-action="fork" data-then="open" data-url="{h(_api_url(run_id, 'fork'))}"
    data-confirm="Create a new run from snapshot {h(doc["snapshot"])} of {h(run_id)}? (It is not started.)">Fork…</button>
</form></section>
"""
