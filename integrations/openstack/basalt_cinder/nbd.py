"""Moving a volume's bytes through Basalt's NBD endpoint with qemu-img.

Basalt serves NBD over TCP only with TLS and a pre-shared key (``basalt server
--nbd-listen``): a client completes STARTTLS with a key from ``basalt nbd-key
create`` (``POST /api/v1/nbd-keys``) before anything else, and sees the
volumes of the key's project. qemu-img speaks that with a ``tls-creds-psk``
object, whose directory holds a ``keys.psk`` file of ``IDENTITY:HEXKEY``
lines, and an NBD block node given with ``--image-opts`` (the source) or
``--target-image-opts`` (the target).

This module knows nothing of Cinder: it parses the endpoints and the key
file, writes the key file, and builds qemu-img's command lines; the driver
runs them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

#: The NBD port (IANA), Basalt's default for ``--nbd-listen``.
DEFAULT_PORT = 10809
#: The id of the TLS credentials object on qemu-img's command line.
TLS_OBJECT_ID = "basalt-tls"
#: A ``keys.psk`` line: the identity (no ':' or blanks) and 32 bytes in hex.
PSK_LINE = re.compile(r"^([^:\s]+):([0-9a-fA-F]{64})$")


@dataclass(frozen=True)
class Endpoint:
    """A node's NBD-over-TLS address."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"nbds://{host}:{self.port}"


def parse_endpoint(uri: str) -> Endpoint:
    """An endpoint from ``nbds://HOST[:PORT][/]`` or ``HOST:PORT`` (IPv6 in
    brackets). Plain NBD (``nbd://``, ``nbd+unix://``) is refused: Basalt's
    NBD over TCP without TLS has no authentication."""
    text = uri.strip()
    if not text:
        raise ValueError("an empty NBD URI")
    if "://" not in text:
        text = "nbds://" + text
    parts = urlsplit(text)
    if parts.scheme != "nbds":
        raise ValueError(
            f"{uri!r}: only nbds://HOST:PORT (NBD over TLS with a pre-shared key) is "
            "supported; plain NBD has no authentication"
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(
            f"{uri!r}: give the node's address only (nbds://HOST:PORT); the export is "
            "the volume and the key comes from basalt_nbd_psk_file"
        )
    if parts.username or parts.password:
        raise ValueError(f"{uri!r}: the PSK identity comes from basalt_nbd_psk_file")
    try:
        port = parts.port
    except ValueError as e:
        raise ValueError(f"{uri!r}: {e}") from e
    if not parts.hostname:
        raise ValueError(f"{uri!r}: no host")
    return Endpoint(parts.hostname, port or DEFAULT_PORT)


def first_reachable(endpoints: Sequence[Endpoint], timeout: float) -> Endpoint:
    """The first endpoint accepting a TCP connection within ``timeout``
    seconds; ConnectionError naming each failure when none does."""
    failures = []
    for endpoint in endpoints:
        try:
            with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout):
                return endpoint
        except OSError as e:
            failures.append(f"{endpoint}: {e}")
    raise ConnectionError("no Basalt NBD endpoint accepted a connection: " + "; ".join(failures))


@dataclass(frozen=True)
class Psk:
    """An NBD pre-shared key: its identity and 32 bytes of key, in hex."""

    identity: str
    key: str

    @property
    def line(self) -> str:
        return f"{self.identity}:{self.key}"

    def __repr__(self) -> str:  # never the key
        return f"Psk(identity={self.identity!r})"

    @classmethod
    def parse(cls, line: str) -> Psk:
        match = PSK_LINE.match(line.strip())
        if not match:
            raise ValueError("not a keys.psk line (IDENTITY:64 hex digits)")
        return cls(match.group(1), match.group(2).lower())


def read_psk_file(path: str) -> Psk:
    """The key in ``path``, which only its owner may read or write.

    FileNotFoundError when it does not exist; ValueError when it is readable
    by others or holds something else than one ``IDENTITY:HEXKEY`` line."""
    with open(path, encoding="ascii") as f:
        mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
        if mode & 0o077:
            raise ValueError(
                f"{path} is mode {mode:04o}: an NBD key file must be readable by its "
                "owner only (chmod 600)"
            )
        lines = [line for line in f.read().splitlines() if line.strip()]
    if len(lines) != 1:
        raise ValueError(f"{path} must hold one IDENTITY:HEXKEY line, not {len(lines)}")
    try:
        return Psk.parse(lines[0])
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e


def write_psk_file(path: str, psk: Psk) -> bool:
    """Write ``psk`` to ``path``, mode 0600, whole or not at all.

    Returns False, writing nothing, when ``path`` exists already (another
    process wrote it first). Missing directories are created 0700."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".basalt-nbd-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(psk.line + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # atomic, and refuses an existing path
        except FileExistsError:
            return False
        return True
    finally:
        os.unlink(tmp)


@contextlib.contextmanager
def credentials_dir(psk: Psk, parent: str | None = None) -> Iterator[str]:
    """A private directory holding ``keys.psk`` for qemu's tls-creds-psk,
    removed on exit."""
    directory = tempfile.mkdtemp(prefix="basalt-nbd-creds-", dir=parent)  # mode 0700
    try:
        path = os.path.join(directory, "keys.psk")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(psk.line + "\n")
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _opt(value: str) -> str:
    """A value in a QEMU option string (',' is doubled)."""
    return value.replace(",", ",,")


def tls_object(creds_dir: str, identity: str) -> str:
    return (f"tls-creds-psk,id={TLS_OBJECT_ID},endpoint=client,dir={_opt(creds_dir)},"
            f"username={_opt(identity)}")


def nbd_image_opts(endpoint: Endpoint, export: str) -> str:
    """The NBD block node of ``export`` (a volume, or ``VOLUME@SNAPSHOT``)."""
    return (f"driver=nbd,server.type=inet,server.host={_opt(endpoint.host)},"
            f"server.port={endpoint.port},export={_opt(export)},tls-creds={TLS_OBJECT_ID}")


def write_command(source: str, source_format: str, endpoint: Endpoint, export: str,
                  creds_dir: str, identity: str, disable_sparse: bool = False) -> list[str]:
    """qemu-img convert of the image file ``source`` onto the existing volume
    ``export``. Zeros of the image are written as NBD zero writes (holes) unless
    ``disable_sparse``; nothing past the image's virtual size is touched."""
    cmd = ["qemu-img", "convert", "-n", "-W", "-f", source_format]
    if disable_sparse:
        cmd += ["-S", "0"]
    cmd += ["--object", tls_object(creds_dir, identity),
            "--target-image-opts", source, nbd_image_opts(endpoint, export)]
    return cmd


def read_command(endpoint: Endpoint, export: str, creds_dir: str, identity: str,
                 dest: str) -> list[str]:
    """qemu-img convert of the volume ``export`` into a sparse raw file ``dest``."""
    return ["qemu-img", "convert", "-O", "raw",
            "--object", tls_object(creds_dir, identity),
            "--image-opts", nbd_image_opts(endpoint, export), dest]
