"""The dashboard's one script and one style sheet (no build step, no third-party code)."""

APP_JS = r"""
(function () {
  'use strict';
  var csrf = document.querySelector('meta[name="tcc-csrf"]').getAttribute('content');
  var confirmBox = document.getElementById('confirm');
  var flash = document.getElementById('flash');
  var pending = null;

  function say(text, bad) {
    flash.textContent = text;
    flash.className = bad ? 'bad' : 'good';
    flash.hidden = false;
  }

  function busy(region) {
    var a = document.activeElement;
    var typing = a && region.contains(a) && a.matches('input, textarea, select') && a.value !== '';
    return typing || !confirmBox.hidden;
  }

  var lost = false;

  function refresh(region) {
    if (region.dataset.final === '1') { return Promise.resolve(); }
    return fetch(region.dataset.live, {credentials: 'same-origin', headers: {'Accept': 'text/html'}})
      .then(function (r) {
        if (!r.ok) {
          lost = true;
          say('This page lost its dashboard (HTTP ' + r.status + (r.status === 401 || r.status === 403
              ? ': the token changed; open the URL the running tcc ui printed' : '') + ')', true);
          return null;
        }
        if (lost) { lost = false; flash.hidden = true; }
        return r.text();
      })
      .then(function (html) {
        if (html !== null && html !== region.dataset.html && !busy(region)) {
          region.innerHTML = html;
          region.dataset.html = html;
          if (region.querySelector('[data-final]')) { region.dataset.final = '1'; }
        }
      })
      .catch(function () {
        lost = true;
        say('This page cannot reach tcc ui (stopped?); it tries again every second', true);
      });
  }

  // One round at a time: the next starts a second after the last one ended, so a slow
  // store is never asked twice at once; a finished run's page stops asking.
  function poll() {
    Promise.all(Array.prototype.map.call(document.querySelectorAll('[data-live]'), refresh))
      .then(function () { setTimeout(poll, 1000); });
  }

  function refreshAll() {
    document.querySelectorAll('[data-live]').forEach(function (r) { r.dataset.final = ''; refresh(r); });
  }

  function collect(form) {
    var body = {};
    if (!form) { return body; }
    var sets = {};
    form.querySelectorAll('[name]').forEach(function (el) {
      var v = el.value;
      if (v === '' && el.hasAttribute('data-optional')) { return; }
      if (el.hasAttribute('data-json')) {
        if (v === '') { v = 'null'; }
        try { v = JSON.parse(v); } catch (e) { throw new Error(el.name + ' must be JSON: ' + e.message); }
      } else if (v === '' ) { v = null; }
      body[el.name] = v;
    });
    form.querySelectorAll('[data-local]').forEach(function (el) {
      if (el.value === '') { return; }
      try { sets[el.dataset.local] = JSON.parse(el.value); }
      catch (e) { throw new Error('local ' + el.dataset.local + ' must be JSON: ' + e.message); }
    });
    if (Object.keys(sets).length) { body.set = sets; }
    return body;
  }

  function ask(button) {
    var body;
    try { body = collect(button.closest('form')); } catch (e) { say(e.message, true); return; }
    pending = {url: button.dataset.url, body: body, then: button.dataset.then || '', action: button.dataset.action};
    document.getElementById('confirm-text').textContent = button.dataset.confirm || ('Do ' + pending.action + '?');
    confirmBox.hidden = false;
    document.getElementById('confirm-yes').focus();
  }

  document.addEventListener('click', function (ev) {
    var button = ev.target.closest('button[data-action]');
    if (!button) { return; }
    ev.preventDefault();
    ask(button);
  });

  // Enter in an action's field asks for that action too; it never submits the form.
  document.addEventListener('submit', function (ev) {
    var form = ev.target.closest('form.act');
    if (!form) { return; }
    ev.preventDefault();
    var button = form.querySelector('button[data-action]');
    if (button) { ask(button); }
  });

  document.getElementById('confirm-no').addEventListener('click', function () {
    pending = null;
    confirmBox.hidden = true;
  });

  document.getElementById('confirm-yes').addEventListener('click', function () {
    var p = pending;
    pending = null;
    confirmBox.hidden = true;
    if (!p) { return; }
    fetch(p.url, {
      method: 'POST', credentials: 'same-origin',
      headers: {'Content-Type': 'application/json', 'X-TCC-CSRF': csrf, 'Accept': 'application/json'},
      body: JSON.stringify(p.body)
    }).then(function (r) {
      return r.json().then(function (doc) { return {ok: r.ok, doc: doc}; });
    }).then(function (res) {
      if (!res.ok) { say(p.action + ' refused: ' + res.doc.error, true); return; }
      if (p.then === 'open') { window.location.href = '/runs/' + encodeURIComponent(res.doc.id); return; }
      say(p.action === 'resume' ? 'resume: started (pid ' + res.doc.pid + '); this page follows the run'
          : p.action + ': done' + (res.doc.signal ? ' (' + res.doc.signal + ')' : ''), false);
      document.querySelectorAll('[data-live] input').forEach(function (el) { el.blur(); });
      refreshAll();
    }).catch(function (e) { say(p.action + ' failed: ' + e.message, true); });
  });

  poll();
})();
"""

APP_CSS = """
:root { --fg: #1d2330; --dim: #6b7385; --line: #dde1ea; --accent: #2456c8; --bad: #b3261e; --good: #1e7b34;
        --warn: #9a5b00; font-family: system-ui, -apple-system, Segoe UI, Roboto, sans-serif; color: var(--fg); }
body { margin: 0; background: #f6f7fb; }
header { background: #1d2330; color: #fff; padding: .6rem 1.2rem; display: flex; gap: 1.2rem; align-items: baseline; }
header .brand { color: #fff; font-weight: 700; text-decoration: none; font-size: 1.2rem; }
header .where { color: #c9cfdb; font-size: .85rem; }
header code { color: #fff; }
main { max-width: 1200px; margin: 0 auto; padding: 1rem 1.2rem 3rem; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin-top: 1.6rem; } h3 { font-size: 1rem; margin: 0 0 .4rem; }
a { color: var(--accent); }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: .85rem; }
pre { background: #fff; border: 1px solid var(--line); padding: .6rem; overflow-x: auto; }
table { border-collapse: collapse; width: 100%; background: #fff; }
th, td { text-align: left; padding: .35rem .5rem; border-bottom: 1px solid var(--line); vertical-align: top; }
th { font-size: .8rem; color: var(--dim); font-weight: 600; }
table.facts { width: auto; } table.facts th { padding-right: 1.2rem; }
.dim { color: var(--dim); } .error { color: var(--bad); } .note { color: var(--warn); }
.badge { display: inline-block; padding: .05rem .45rem; border-radius: .6rem; font-size: .8rem; background: #e4e7ee; }
.s-importing, .s-queued { background: #eef0f3; } .s-running { background: #dbe7ff; } .s-waiting { background: #ffe9b8; } .s-sleeping { background: #e9e0ff; }
.s-completed { background: #d7f2dd; } .s-failed, .s-unverified { background: #ffd9d6; } .s-cancelled { background: #e4e4e4; }
tr.needs-human { background: #fff6dc; }
.needs { background: var(--warn); color: #fff; border-radius: .6rem; padding: .05rem .45rem; font-size: .75rem; }
.wait { font-size: .8rem; color: var(--warn); margin-left: .3rem; }
.gone { color: var(--bad); font-size: .8rem; }
.filters { display: flex; gap: 1rem; align-items: end; margin-bottom: 1rem; }
.filters label { display: flex; flex-direction: column; font-size: .8rem; color: var(--dim); }
input, select, button { font: inherit; padding: .3rem .5rem; }
button { border: 1px solid var(--line); background: #fff; border-radius: .3rem; cursor: pointer; }
button.primary { background: var(--accent); color: #fff; border-color: var(--accent); }
button.danger { color: var(--bad); border-color: var(--bad); }
form.inline { display: flex; gap: .5rem; margin: .5rem 0; flex-wrap: wrap; }
.wait-card { background: #fff6dc; border: 1px solid #f0d48a; padding: .6rem; margin: .5rem 0; display: flex; gap: .5rem;
             flex-wrap: wrap; align-items: center; }
.wait-card p { margin: 0; flex-basis: 100%; }
article.frame { background: #fff; border: 1px solid var(--line); padding: .8rem; margin: .6rem 0; }
pre.src { background: #f3f5fa; margin: .3rem 0; }
code.repr { white-space: pre-wrap; word-break: break-all; }
ul.tree, ul.tree ul { list-style: none; padding-left: 1.2rem; }
#flash { position: sticky; top: 0; padding: .6rem 1.2rem; font-weight: 600; }
#flash.good { background: #d7f2dd; color: var(--good); } #flash.bad { background: #ffd9d6; color: var(--bad); }
#confirm { position: fixed; top: 30%; left: 50%; transform: translateX(-50%); background: #fff; border: 2px solid var(--fg);
           padding: 1rem 1.4rem; box-shadow: 0 6px 30px rgba(0,0,0,.25); z-index: 10; max-width: 32rem; }
#fork-form label { display: block; margin: .3rem 0; }
label.local { font-family: ui-monospace, monospace; }
.empty { color: var(--dim); }
.ready { background: var(--good); color: #fff; border-radius: .6rem; padding: .05rem .45rem; font-size: .75rem; }
.wait-card.answered { background: #e9f6ec; border-color: #b7dfc0; }
td, .error, .wait, .wait-card p, pre, code { overflow-wrap: anywhere; }
table.runs td:nth-child(2) { max-width: 22rem; }
table.timeline td:first-child, table.timeline td:last-child { white-space: nowrap; overflow-wrap: normal; }
"""
