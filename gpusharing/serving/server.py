"""Running a service's Flask app under gunicorn: gthread workers, keep-alive, optional TLS."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import importlib
import logging
import os
import shutil
import ssl
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import prometheus_client.values
from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger as GunicornLogger
from gunicorn.http import wsgi
from prometheus_client import multiprocess

from gpusharing.serving.logs import configure_logging
from gpusharing.serving.metrics import MULTIPROC_ENV

# A worker makes short-lived objects by the thousand each second, and each pass of the garbage collector stops all its
# threads: the young generation is collected every 20,000 allocations instead of 700, and what the worker made at
# start is frozen out of every pass (docs/development.md, the timekeeper's ingest, has the figures).
GC_THRESHOLDS = (20_000, 20, 20)


# An app's extensions[ON_STOP]: what its worker calls, once it has finished its requests in flight, before it exits
# (background threads that must finish what they hold: the timekeeper's report batches and demotion pass).
ON_STOP = "gpusharing.on_stop"

MAX_WORKERS = 64
MAX_THREADS = 1024
# On SIGTERM a worker stops accepting and finishes the requests it has (admissions; reports, each answered once its
# batch has committed) for up to this long. The manifests' terminationGracePeriodSeconds leave room for it.
GRACEFUL_TIMEOUT_SECONDS = 10


@dataclass(frozen=True)
class ServerOptions:
    """How gunicorn serves an app: where, with how many workers and threads, TLS and its client CA."""

    host: str = "127.0.0.1"
    port: int = 8443
    workers: int = 2
    threads: int = 8
    certfile: str | None = None
    keyfile: str | None = None
    # Client certificates signed by this CA are asked for (and verified) on every connection; a client without one
    # still connects (probes, /metrics), and the app decides what it may do (the socket's getpeercert()).
    client_ca_file: str | None = None
    keepalive: int = 75  # longer than the API server's idle connection timeout, so connections are reused
    timeout: int = 30
    access_log: bool = False
    # glibc gives each thread that allocates its own arena (up to 8 per core) and keeps what is freed in each, so
    # a worker whose threads take turns on large bodies grows to the sum of their peaks; None: glibc's default.
    malloc_arenas: int | None = None


class _Server(BaseApplication):
    def __init__(self, app_factory: str, options: ServerOptions, on_starting: Callable[[], None] | None):
        self._factory = app_factory
        self._options = options
        self._on_starting = on_starting
        super().__init__()

    def load_config(self) -> None:
        o = self._options
        settings: dict[str, Any] = {
            "bind": f"[{o.host}]:{o.port}" if ":" in o.host else f"{o.host}:{o.port}",
            "workers": o.workers,
            "worker_class": "gthread",
            "threads": o.threads,
            "keepalive": o.keepalive,
            "timeout": o.timeout,
            "graceful_timeout": GRACEFUL_TIMEOUT_SECONDS,
            "accesslog": "-" if o.access_log else None,
            "errorlog": "-",
            "loglevel": logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower(),
            "logger_class": _Logs,
            "child_exit": _child_exit,
            "worker_exit": _worker_exit,
            "post_worker_init": lambda _worker: _init_worker(o.malloc_arenas),
        }
        # gunicorn >= 25.1 opens a control socket at one path per user ($XDG_RUNTIME_DIR or ~/.gunicorn): a second
        # server on the host would take it over, and a read-only root filesystem has no ~/.gunicorn. Not used here.
        if "control_socket_disable" in self.cfg.settings:
            settings["control_socket_disable"] = True
        if o.certfile:
            settings["certfile"] = o.certfile
            settings["keyfile"] = o.keyfile
            settings["ssl_context"] = _ReloadingContext()
            if o.client_ca_file:
                settings["ca_certs"] = o.client_ca_file
                settings["cert_reqs"] = ssl.CERT_OPTIONAL
        if self._on_starting is not None:
            hook = self._on_starting
            settings["on_starting"] = lambda _arbiter: hook()
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        # Imported here, in each worker, so that the app's metrics are created in multiprocess mode.
        module, _, name = self._factory.partition(":")
        return getattr(importlib.import_module(module), name)()


class _Logs(GunicornLogger):
    """gunicorn's lines (start, workers, errors) through the root logger, formatted like every other line."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for log in (self.error_log, self.access_log):
            for handler in [h for h in log.handlers if getattr(h, "_gunicorn", False)]:
                log.removeHandler(handler)
            log.propagate = True


class _ReloadingContext:
    """gunicorn's ssl_context hook: one context per certificate, made anew when the files change on disk.

    cert-manager (or `gpusharing certs`) renews the Secret; the kubelet updates the mounted files; new
    connections get the new certificate (and the new client CA) without a restart.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stamp: tuple[float, ...] | None = None
        self._context: ssl.SSLContext | None = None

    def __call__(self, conf: Any, default_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        stamp = tuple(os.stat(path).st_mtime for path in (conf.certfile, conf.keyfile, conf.ca_certs) if path)
        with self._lock:
            if self._context is None or stamp != self._stamp:
                self._context = default_factory()
                self._stamp = stamp
            return self._context


class _OneWriteResponse(wsgi.Response):
    """gunicorn's response, its headers held back and sent with the first bytes of the body, in one write: between
    two writes the thread may wait for the GIL while the client holds half an answer (docs/design/core.md)."""

    _held = b""

    def send_headers(self) -> None:
        if self.headers_sent:
            return
        lines = self.default_headers()
        lines.extend(f"{name}: {value}\r\n" for name, value in self.headers)
        self._held = ("".join(lines) + "\r\n").encode("latin-1")
        self.headers_sent = True

    def _emit_body(self, data: bytes) -> None:
        held, self._held = self._held, b""
        if self.chunked:  # gunicorn's framing of a chunk (util.write_chunk)
            data = b"%X\r\n%s\r\n" % (len(data), data)
        self.sock.sendall(held + data)

    def _send_held(self) -> None:
        held, self._held = self._held, b""
        if held:
            self.sock.sendall(held)

    def sendfile(self, respiter: Any) -> bool:
        self.send_headers()
        self._send_held()  # the file goes out by os.sendfile (plain HTTP), after the headers
        return bool(super().sendfile(respiter))

    def close(self) -> None:
        self.send_headers()
        if self.chunked:  # the last chunk, with headers still held (no body was written)
            self._held += b"0\r\n\r\n"
            self._send_held()
            return
        self._send_held()
        super().close()


def _one_write_responses() -> None:
    # gunicorn's gthread worker makes each response with gunicorn.http.wsgi.create, which builds the module's Response.
    wsgi.Response = _OneWriteResponse  # type: ignore[misc]


def _glibc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


_GLIBC = _glibc()
M_ARENA_MAX = -8  # mallopt's parameter


def stated_length(environ: Mapping[str, Any], bound: int) -> int | None:
    """A request's Content-Length when it is plain digits within `bound`, else None: a body framed otherwise (chunked,
    of no stated length, over the bound, or of more digits than int() reads) is Flask's to answer, as it always was.
    The services answer their hot paths ahead of Flask only for the bodies this gives a length."""
    length = environ.get("CONTENT_LENGTH") or ""
    if "HTTP_TRANSFER_ENCODING" in environ or not (length.isascii() and length.isdigit()) or len(length) > 16:
        return None
    value = int(length)
    return value if value <= bound else None


def release_memory() -> None:
    """Frees now what a large request left: its reference cycles (which, with the thresholds above, could wait
    long for a full collection) and the free memory the C allocator keeps (glibc keeps it unless trimmed)."""
    gc.collect()
    if _GLIBC is not None:
        _GLIBC.malloc_trim(0)


def _init_worker(arenas: int | None) -> None:
    _one_write_responses()
    _settle_memory(arenas)


def _settle_memory(arenas: int | None) -> None:
    if arenas is not None and _GLIBC is not None:
        _GLIBC.mallopt(M_ARENA_MAX, arenas)
    gc.freeze()  # the app, its modules and settings: alive as long as the worker, never garbage
    gc.set_threshold(*GC_THRESHOLDS)


def _worker_exit(_server: Any, worker: Any) -> None:
    for stop in getattr(getattr(worker, "wsgi", None), "extensions", {}).get(ON_STOP, []):
        stop()


def _child_exit(_server: Any, worker: Any) -> None:
    multiprocess.mark_process_dead(worker.pid)


def serve(app_factory: str, options: ServerOptions, on_starting: Callable[[], None] | None = None) -> None:
    """Serve `app_factory` ("module:function") until stopped.

    Metrics from all workers are merged through a fresh multiprocess directory. Logging is set up here, before
    the workers are forked, so that they write their lines the same way.
    """
    configure_logging()
    metrics_dir = tempfile.mkdtemp(prefix="gpusharing-metrics-")
    os.environ[MULTIPROC_ENV] = metrics_dir
    # prometheus_client picks its value store when first imported; pick again now that the directory is set.
    prometheus_client.values.ValueClass = prometheus_client.values.get_value_class()
    master = os.getpid()
    try:
        _Server(app_factory, options, on_starting).run()
    finally:
        # gunicorn forks each worker inside run(), and a worker leaves by SystemExit through here too: the directory
        # is the other workers' still, and goes with the master alone.
        if os.getpid() == master:
            shutil.rmtree(metrics_dir, ignore_errors=True)
