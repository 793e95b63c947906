"""``serve``: run the HTTP edge with uvicorn, refusing to expose it without a token."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from outlast import config
from outlast.errors import InvalidInput

if TYPE_CHECKING:
    from outlast.store import Store

log = logging.getLogger("outlast.http")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765


def is_loopback(host: str) -> bool:
    """True when every address ``host`` names is a loopback one (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(
        ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos
    )


def check_exposure(host: str, token: str | None) -> None:
    """Raise :class:`InvalidInput` for a non-loopback ``host`` without a token."""
    if not isinstance(host, str) or not host:
        raise InvalidInput("host must be a non-empty string")
    if not token and not is_loopback(host):
        raise InvalidInput(
            f"refusing to serve on {host} without a token: anyone who can reach it could read "
            "and cancel jobs. Pass --token (or set $OUTLAST_TOKEN), or bind 127.0.0.1"
        )


def _raise_fd_limit() -> None:
    """Lift the soft descriptor limit to the hard one (as servers do): the stream cap
    (``OUTLAST_MAX_STREAMS``) is lowered to what the limit can hold, so a low soft limit
    would refuse streams the machine allows."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1 << 16 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def serve(
    store_url: str | None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    token: str | None = None,
    *,
    imports: Sequence[str] = (),
) -> None:
    """Serve the API and dashboard until interrupted (SIGINT/SIGTERM end it cleanly).

    ``store_url`` None means ``$OUTLAST_STORE`` or the default store; ``token`` None means
    ``$OUTLAST_TOKEN``. A non-loopback ``host`` without a token raises
    :class:`~outlast.errors.InvalidInput` before anything is opened. ``imports`` are modules
    that register the job functions ``POST /jobs`` may queue.
    """
    token = token or config.token()
    check_exposure(host, token)
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise InvalidInput(f"port must be a number from 0 to 65535, not {port!r}")
    import uvicorn

    from outlast.http.app import create_app
    from outlast.run.maintain import Maintainer
    from outlast.run.registry import import_modules
    from outlast.run.schedules import sync_declared
    from outlast.store import open_store

    import_modules(list(imports))
    _raise_fd_limit()
    sock = bind(host, port)
    store = open_store(store_url)
    maintainer = Maintainer(store)  # the server takes its turn at the store's maintenance
    try:
        _warm_listener(store)
        sync_declared(store)  # @outlast.job(cron=…) of the imported modules
        maintainer.start()
        # without a token the server is for this machine only: requests must name it so
        hosts = None if token else {"localhost", "127.0.0.1", "::1", host.strip("[]")}
        app = create_app(store, token=token, hosts=hosts)
        server = _server_class()(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                log_level="info",
                proxy_headers=False,
                server_header=False,
                timeout_graceful_shutdown=3,
            )
        )
        from outlast.run.presence import present

        with present(store, "server"):
            server.run(sockets=[sock])
    finally:
        sock.close()
        maintainer.stop()
        store.close()


def _warm_listener(store: Store) -> None:
    """Open what every stream's listener shares once, at start-up (a local store's pulse
    files and its inotify watcher): a stream then needs one descriptor of its own beside its
    socket, and a crowd that takes the rest cannot leave the first streams without them."""
    from outlast.errors import OutlastError

    try:
        store.listen(None).close()
    except (OutlastError, OSError) as exc:  # the streams will say so, one by one
        log.warning("cannot watch the store for changes yet: %s", exc)


async def prepare_loop() -> None:
    """Ready the running loop to serve a crowd: its exception handler (:func:`_loop_errors`)
    and its default executor, made (and its module imported) before any client comes: under
    a crowd that holds every descriptor, the first stream could not import it."""
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(_loop_errors)
    await loop.run_in_executor(None, int)


def _loop_errors(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
    """The loop's exception handler: running out of descriptors while accepting (asyncio
    pauses accepting for a second, and the waiting clients are answered then) is one line in
    the log, at most once a second, not a traceback per refusal; anything else is asyncio's."""
    exc = context.get("exception")
    accepting = str(context.get("message", "")).startswith("socket.accept() out of")
    if accepting and isinstance(exc, OSError) and exc.errno in _OUT_OF:
        now = time.monotonic()
        if now - _accept_warned[0] >= 1.0:
            _accept_warned[0] = now
            what = "file descriptors" if exc.errno in (errno.EMFILE, errno.ENFILE) else "memory"
            log.warning("out of %s (%s): new connections wait until some close", what, exc.strerror)
        return
    loop.default_exception_handler(context)


_accept_warned = [-1e9]
#: What pauses asyncio's accepting (its own list): out of descriptors, or of memory.
_OUT_OF = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def _server_class() -> type:
    import uvicorn

    from outlast.run import procs

    class Server(uvicorn.Server):
        """uvicorn's server, telling systemd (``Type=notify``) once it listens."""

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await prepare_loop()
            await super().startup(sockets=sockets)
            if self.started:
                procs.sd_notify("READY=1")

        def handle_exit(self, sig: int, frame: object) -> None:
            procs.sd_notify("STOPPING=1")
            super().handle_exit(sig, frame)  # type: ignore[arg-type]

    return Server


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; :class:`InvalidInput` saying why not (a port in
    use, an address this machine does not have)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise InvalidInput(f"cannot serve on {host}: {exc.strerror or exc}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        why = "it is in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise InvalidInput(f"cannot serve on {host}:{port}: {why}") from None
    sock.set_inheritable(False)
    return sock
