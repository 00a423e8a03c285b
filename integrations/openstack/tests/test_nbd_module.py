"""basalt_cinder.nbd on its own: endpoint parsing, the key file, qemu-img's
option strings (the live copies are in test_images.py)."""

from __future__ import annotations

import os
import stat
import tempfile

import pytest

from basalt_cinder import nbd

KEY = "0123456789abcdef" * 4


def test_endpoints() -> None:
    assert nbd.parse_endpoint("nbds://10.0.0.1:10810") == nbd.Endpoint("10.0.0.1", 10810)
    assert nbd.parse_endpoint("nbds://node1/") == nbd.Endpoint("node1", nbd.DEFAULT_PORT)
    assert nbd.parse_endpoint("10.0.0.2:1234") == nbd.Endpoint("10.0.0.2", 1234)
    v6 = nbd.parse_endpoint("nbds://[fd00::1]:10809")
    assert v6 == nbd.Endpoint("fd00::1", 10809)
    assert str(v6) == "nbds://[fd00::1]:10809"
    for bad, words in (("nbd://10.0.0.1:10809", "no authentication"),
                       ("nbd+unix:///?socket=/run/nbd.sock", "no authentication"),
                       ("nbds://id@10.0.0.1:10809", "identity"),
                       ("nbds://10.0.0.1:10809/volume-1", "address only"),
                       ("nbds://10.0.0.1:99999", "99999"),
                       ("", "empty")):
        with pytest.raises(ValueError, match=words):
            nbd.parse_endpoint(bad)


def test_key_file_is_written_once_and_owner_only() -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "sub", "keys.psk")
        first = nbd.Psk("p1.0001", KEY)
        assert nbd.write_psk_file(path, first)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        assert not nbd.write_psk_file(path, nbd.Psk("p1.0002", KEY))
        assert nbd.read_psk_file(path) == first
        assert sorted(os.listdir(os.path.dirname(path))) == ["keys.psk"]  # no temp left
        assert KEY not in repr(first)
        with open(path, "a") as f:
            f.write(f"p1.0003:{KEY}\n")
        with pytest.raises(ValueError, match="one IDENTITY:HEXKEY line"):
            nbd.read_psk_file(path)
        os.chmod(path, 0o640)
        with pytest.raises(ValueError, match="chmod 600"):
            nbd.read_psk_file(path)
        with pytest.raises(FileNotFoundError):
            nbd.read_psk_file(os.path.join(d, "missing.psk"))
    with pytest.raises(ValueError):
        nbd.Psk.parse("p1:short")


def test_option_strings_escape_commas() -> None:
    endpoint = nbd.Endpoint("10.0.0.1", 10809)
    opts = nbd.nbd_image_opts(endpoint, "odd,name")
    assert "export=odd,,name," in opts
    assert opts.endswith(f"tls-creds={nbd.TLS_OBJECT_ID}")
    assert "dir=/tmp/a,,b," in nbd.tls_object("/tmp/a,b", "p1.0001")
    cmd = nbd.write_command("/tmp/img", "qcow2", endpoint, "v", "/tmp/c", "p1.0001",
                            disable_sparse=True)
    assert cmd[:6] == ["qemu-img", "convert", "-n", "-W", "-f", "qcow2"]
    assert ["-S", "0"] == cmd[6:8]
    assert cmd[-2:] == ["/tmp/img", nbd.nbd_image_opts(endpoint, "v")]
