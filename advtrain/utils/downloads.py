"""A quick reachability check before a download, so offline runs fail fast
(TFDS retries an unresolvable name for 3 min 24 s, Keras's `get_file` waits
out its socket timeout)."""

from __future__ import annotations

import socket
import threading
import urllib.parse
import urllib.request

# Name resolution and TCP connect, each; a reachable host answers in far less.
PROBE_TIMEOUT_S = 5.0
_PORTS = {"http": 80, "https": 443, "ftp": 21}


def _resolve(host: str, port: int, timeout: float) -> list:
    # getaddrinfo with a deadline (it has none of its own).
    result: dict = {}

    def run():
        try:
            result["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            result["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise OSError(f"cannot resolve {host}: no answer in {timeout:g}s")
    if "error" in result:
        reason = getattr(result["error"], "strerror", None) or result["error"]
        raise OSError(f"cannot resolve {host} ({reason})")
    return result["infos"]


def _endpoint(url: str) -> tuple[str, int]:
    # (host, port) a request for `url` connects to: its proxy's, if any.
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        parts = urllib.parse.urlsplit(proxy if "//" in proxy else f"//{proxy}")
        return parts.hostname or "", parts.port or 80
    return host, parts.port or _PORTS.get(parts.scheme, 443)


def check_reachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Raises OSError (one line) unless `url`'s host (or its proxy) accepts
    a TCP connection; sends nothing."""
    host, port = _endpoint(url)
    if not host:
        raise OSError(f"no host in the URL {url!r}")
    last: OSError = OSError(f"cannot connect to {host}:{port}")
    for family, kind, proto, _, address in _resolve(host, port, timeout):
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(timeout)
                sock.connect(address)
            return
        except OSError as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or "timed out"
            last = OSError(f"cannot connect to {host}:{port} ({reason})")
    raise last
