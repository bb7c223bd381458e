"""``tcc ui``'s HTTP side: routes, the access token, and cross-site request protection.

Security, in the order a request meets it:

1. **Host.** Bound to a loopback address (the default), a request must name a loopback
   host (``127.0.0.1``, ``localhost``, ``[::1]``): a web page cannot reach the dashboard
   by pointing a name of its own at 127.0.0.1 (DNS rebinding).
2. **Token.** Every request carries the access token that ``tcc ui`` printed: as
   ``Authorization: token …`` (scripts), ``?token=…`` (GET only), or the cookie the page
   sets when it is opened with ``?token=`` (HttpOnly, SameSite=Strict, named after the
   port, so that two dashboards do not overwrite each other's).  None: 401; a wrong one: 403.
3. **Cross-site POSTs.** A POST whose ``Origin`` (or ``Sec-Fetch-Site``) names another
   site is refused (403), and a POST authenticated by the cookie alone must also carry
   the page's CSRF token in ``X-TCC-CSRF``, which another site cannot read, and be
   ``Content-Type: application/json``, which an HTML form cannot send.
4. **Content.** Every page is rendered on the server with every run-supplied text
   escaped; the Content-Security-Policy allows only the dashboard's own script and
   style sheet, and no framing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import hmac
import json
import secrets
import socket
import sys
from typing import Any, Callable, TextIO, TypeVar
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ... import errors
from ...store import Store, redact_url
from . import _pages, check_listen, is_loopback
from ._assets import APP_CSS, APP_JS
from ._dashboard import ApiError, Dashboard

COOKIE = "tcc_ui_token"  # + "_PORT"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
T = TypeVar("T")


def csrf_token(token: str) -> str:
    return hmac.new(token.encode(), b"tcc ui csrf", hashlib.sha256).hexdigest()


def _hostname(host_header: str) -> str:
    if host_header.startswith("["):
        return host_header[: host_header.find("]") + 1]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


class Guard:
    """The ASGI middleware that applies the rules in the module docstring."""

    def __init__(self, app: ASGIApp, token: str, *, loopback: bool, cookie: str = COOKIE) -> None:
        self.app = app
        self.token = token
        self.csrf = csrf_token(token)
        self.loopback = loopback
        self.cookie = cookie

    def _deny(self, request: Request, status: int, message: str) -> Response:
        if request.url.path.startswith("/api/") or "application/json" in request.headers.get("accept", ""):
            return JSONResponse({"error": message}, status_code=status)
        return HTMLResponse(_pages.error_page(status, message), status_code=status)

    def _presented(self, request: Request) -> tuple[str | None, str]:
        auth = request.headers.get("authorization", "")
        scheme, _, value = auth.partition(" ")
        if scheme.lower() in ("token", "bearer") and value.strip():
            return value.strip(), "header"
        if "token" in request.query_params:
            return request.query_params["token"], "query"
        if self.cookie in request.cookies:
            return request.cookies[self.cookie], "cookie"
        return None, ""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        response = self.check(request)
        if response is not None:
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def check(self, request: Request) -> Response | None:
        if self.loopback and not is_loopback(_hostname(request.headers.get("host", ""))):
            return self._deny(request, 403, "this dashboard answers only to a loopback host name "
                                            "(127.0.0.1, localhost, [::1])")
        presented, source = self._presented(request)
        if presented is None:
            return self._deny(request, 401, "an access token is needed: open the URL `tcc ui` printed "
                                            "(…/?token=…), or send `Authorization: token …`")
        if not hmac.compare_digest(presented.encode(), self.token.encode()):
            return self._deny(request, 403, "wrong access token: use the one the running `tcc ui` printed")
        if request.method not in ("GET", "HEAD"):
            origin = request.headers.get("origin")
            own = f"{request.url.scheme}://{request.headers.get('host', '')}"
            site = request.headers.get("sec-fetch-site")
            if (origin is not None and origin != own) or site not in (None, "same-origin", "none"):
                return self._deny(request, 403, "cross-site request refused")
            if source == "query":
                return self._deny(request, 403, "a POST takes the token in its Authorization header "
                                                "(`Authorization: token …`), not in the URL")
            if source == "cookie" and not hmac.compare_digest(
                    request.headers.get("x-tcc-csrf", "").encode(), self.csrf.encode()):
                return self._deny(request, 403, "cross-site request refused: a POST with the page's "
                                                "cookie must carry its X-TCC-CSRF header")
            ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if source == "cookie" and ctype != "application/json":
                return self._deny(request, 403, "cross-site request refused: a POST with the page's "
                                                "cookie must be application/json")
        if source == "query" and request.method == "GET" and not request.url.path.startswith("/api/"):
            # a page opened with ?token=: keep the token in a cookie and drop it from the address
            rest = {k: v for k, v in request.query_params.items() if k != "token"}
            target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
            redirect = RedirectResponse(target, status_code=303)
            redirect.set_cookie(self.cookie, self.token, httponly=True, samesite="strict", path="/")
            return redirect
        return None


class _Headers:
    """Adds the security headers to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(b"content-security-policy", CSP.encode()), (b"x-frame-options", b"DENY"),
                            (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
                            (b"cache-control", b"no-store")]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, sending)


def build_app(dashboard: Dashboard, token: str, *, loopback: bool = True, store_label: str = "",
              tenant: str = "default", port: int | None = None) -> ASGIApp:
    """The dashboard as an ASGI app.  Store calls run one at a time on one thread."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tcc-ui-store")
    csrf = csrf_token(token)

    async def call(fn: Callable[..., T], *args: Any) -> T:
        def locked() -> T:
            with dashboard.lock:
                return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(pool, locked)

    def failure(exc: Exception, page: bool = False) -> Response:
        if isinstance(exc, ApiError):
            status, message = exc.status, exc.message
        elif isinstance(exc, errors.RunNotFoundError):
            status, message = 404, str(exc)
        elif isinstance(exc, errors.UsageError):
            status, message = 400, str(exc)
        elif isinstance(exc, errors.TccError):
            status, message = 500, str(exc)
        else:
            raise exc
        if page:
            return HTMLResponse(_pages.error_page(status, message), status_code=status)
        return JSONResponse({"error": message}, status_code=status)

    def html(title: str, body: str) -> HTMLResponse:
        return HTMLResponse(_pages.page(title, body, csrf=csrf, store_label=store_label, tenant=tenant))

    async def api_runs(request: Request) -> Response:
        try:
            doc = await call(dashboard.runs, request.query_params.get("status") or None,
                             request.query_params.get("q") or None)
        except Exception as exc:  # noqa: BLE001 - mapped to a status, or re-raised
            return failure(exc)
        return JSONResponse(doc)

    async def api_run(request: Request) -> Response:
        try:
            return JSONResponse(await call(dashboard.run, request.path_params["run_id"]))
        except Exception as exc:  # noqa: BLE001
            return failure(exc)

    async def api_stack(request: Request) -> Response:
        try:
            return JSONResponse(await call(dashboard.stack, request.path_params["run_id"],
                                           request.query_params.get("at")))
        except Exception as exc:  # noqa: BLE001
            return failure(exc)

    async def api_action(request: Request) -> Response:
        raw = await request.body()
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if raw.strip() and ctype != "application/json":
            return JSONResponse({"error": "send the body as JSON (Content-Type: application/json)"},
                                status_code=415)
        try:
            body = json.loads(raw) if raw.strip() else None
        except ValueError as exc:
            return JSONResponse({"error": f"the body is not valid JSON: {exc}"}, status_code=400)
        try:
            status, doc = await call(dashboard.act, request.path_params["run_id"],
                                     request.path_params["action"], body)
        except Exception as exc:  # noqa: BLE001
            return failure(exc)
        return JSONResponse(doc, status_code=status)

    async def page_runs(request: Request) -> Response:
        status = request.query_params.get("status") or None
        query = request.query_params.get("q") or None
        return html("Runs", _pages.runs_page(status, query))

    async def fragment_runs(request: Request) -> Response:
        try:
            doc = await call(dashboard.runs, request.query_params.get("status") or None,
                             request.query_params.get("q") or None)
        except Exception as exc:  # noqa: BLE001
            return failure(exc, page=True)
        return HTMLResponse(_pages.runs_fragment(
            doc, filtered=bool(request.query_params.get("status") or request.query_params.get("q"))))

    async def page_run(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            await call(dashboard.run, run_id, 0)  # a missing run is a 404 page
            code = await call(dashboard.code_state, run_id)
        except Exception as exc:  # noqa: BLE001
            return failure(exc, page=True)
        return html(f"Run {run_id}", _pages.run_page(run_id, code))

    async def fragment_run(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            doc = await call(dashboard.run, run_id, _pages.PAGE_CALLS)
            tree = await call(dashboard.tree, run_id)
        except Exception as exc:  # noqa: BLE001
            return failure(exc, page=True)
        return HTMLResponse(_pages.run_fragment(doc, tree))

    async def page_stack(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            doc = await call(dashboard.stack, run_id, request.query_params.get("at"))
        except Exception as exc:  # noqa: BLE001
            return failure(exc, page=True)
        return html(f"Stack of {run_id}", _pages.stack_page(run_id, doc))

    async def script(request: Request) -> Response:
        return Response(APP_JS, media_type="text/javascript")

    async def style(request: Request) -> Response:
        return Response(APP_CSS, media_type="text/css")

    async def not_found(request: Request, exc: Exception) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": f"no such route: {request.method} {request.url.path}"},
                                status_code=getattr(exc, "status_code", 404))
        status = getattr(exc, "status_code", 404)
        return HTMLResponse(_pages.error_page(status, f"no such page: {request.url.path}"), status_code=status)

    routes = [
        Route("/", page_runs),
        Route("/runs/{run_id}", page_run),
        Route("/runs/{run_id}/stack", page_stack),
        Route("/fragments/runs", fragment_runs),
        Route("/fragments/runs/{run_id}", fragment_run),
        Route("/static/app.js", script),
        Route("/static/app.css", style),
        Route("/api/runs", api_runs),
        Route("/api/runs/{run_id}", api_run),
        Route("/api/runs/{run_id}/stack", api_stack),
        Route("/api/runs/{run_id}/{action}", api_action, methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
    cookie = COOKIE if port is None else f"{COOKIE}_{port}"
    return _Headers(Guard(app, token, loopback=loopback, cookie=cookie))


def serve(store: Store, *, host: str = "127.0.0.1", port: int = 8765, allow_remote: bool = False,
          out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Serve the dashboard until SIGINT/SIGTERM.  The first line on ``out`` is the URL with
    the access token; a non-loopback ``host`` needs ``allow_remote`` (and gets a warning)."""
    import uvicorn

    out = out or sys.stdout
    err = err or sys.stderr
    check_listen(host, port, allow_remote)
    loopback = is_loopback(host)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise errors.TccError(f"tcc ui cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound = sock.getsockname()[1]
    token = secrets.token_urlsafe(32)
    label = redact_url(getattr(store, "url", None) or store.path)
    app = build_app(Dashboard(store), token, loopback=loopback, store_label=label, tenant=store.tenant,
                    port=bound)
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    print(f"http://{shown}:{bound}/?token={token}", file=out, flush=True)
    if not loopback:
        print(f"tcc: warning: tcc ui listens on {host}, reachable from other machines; anyone who has "
              "the token can act on the runs, and plain HTTP does not hide it: put it behind TLS",
              file=err, flush=True)
    print(f"tcc ui: serving the runs of store {label} (tenant {store.tenant}); Ctrl-C stops it",
          file=err, flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    return 0
