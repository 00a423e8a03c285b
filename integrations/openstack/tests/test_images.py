"""Image copies over Basalt's NBD endpoint (TLS with a pre-shared key), through
Cinder's real VolumeManager and its create-volume flow, with images made by
qemu-img and served by Cinder's own fake Glance (cinder.tests.unit.image.fake).
Data is checked over the server's NBD socket, keys through Basalt's API."""

from __future__ import annotations

import glob
import logging
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import uuid
from typing import Any

import cinder.privsep
import fixtures
from cinder import exception, objects
from cinder.tests.unit.image import fake as fake_image

from basalt_cinder import driver as basalt_driver
from basalt_cinder import nbd
from basalt_cinder.client import BasaltError
from conftest import (
    BACKEND,
    BasaltManagerTestCase,
    GiB,
    admin,
    env,
    exists,
    has_pattern,
    nbd_uri,
    write_pattern,
)

MiB = 1 << 20
A, B, C = 0xA1, 0xB2, 0xC3


class ImageService(fake_image._FakeImageService):
    """Cinder's fake Glance keeping image data in files (a raw upload is as
    large as its volume) and without the MagicMock it puts in temp_images, so
    that Cinder's TemporaryImages tracks downloaded images as with Glance."""

    def __init__(self, directory: str) -> None:
        super().__init__()
        self.temp_images = None
        self.directory = directory
        self.files: dict[str, str] = {}

    def add(self, path: str, disk_format: str, container_format: str = "bare") -> str:
        image_id = str(uuid.uuid4())
        self.files[image_id] = path
        self.create(None, {"id": image_id, "name": os.path.basename(path),
                           "status": "active", "visibility": "private",
                           "disk_format": disk_format, "container_format": container_format,
                           "size": os.path.getsize(path), "properties": {}})
        return image_id

    def queued(self, disk_format: str, container_format: str = "bare") -> dict[str, Any]:
        """A new image waiting for its data, as the API makes for an upload."""
        image_id = str(uuid.uuid4())
        self.create(None, {"id": image_id, "name": "upload", "status": "queued",
                           "disk_format": disk_format, "container_format": container_format,
                           "properties": {}})
        return {"id": image_id, "disk_format": disk_format,
                "container_format": container_format}

    def download(self, context: Any, image_id: str, data: Any) -> None:
        self.show(context, image_id)
        with open(self.files[image_id], "rb") as f:
            shutil.copyfileobj(f, data, MiB)

    def update(self, context: Any, image_id: str, metadata: Any, data: Any = None,
               purge_props: bool = False, store_id: Any = None,
               base_image_ref: Any = None) -> Any:
        if data is not None:
            path = os.path.join(self.directory, f"uploaded-{image_id}")
            with open(path, "wb") as f:
                shutil.copyfileobj(data, f, MiB)
            self.files[image_id] = path
            metadata = {**metadata, "status": "active", "size": os.path.getsize(path)}
        return super().update(context, image_id, metadata, purge_props=purge_props)


def run(*args: str) -> str:
    out = subprocess.run(list(args), capture_output=True, text=True, timeout=120, check=False)
    if out.returncode != 0:
        raise AssertionError(f"{args}: rc={out.returncode} {out.stdout}{out.stderr}")
    return out.stdout


def make_image(path: str, fmt: str, size: str, writes: list[tuple[int, int, int]],
               *extra: str) -> str:
    """An image made by qemu-img, with ``writes`` (byte, offset, length) by qemu-io."""
    run("qemu-img", "create", "-q", "-f", fmt, *extra, path, size)
    for byte, offset, length in writes:
        run("qemu-io", "-f", fmt, "-c", f"write -P {byte:#x} {offset} {length}", path)
    return path


def dead_nbds() -> str:
    """A loopback NBD address nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"nbds://127.0.0.1:{s.getsockname()[1]}"


def creds_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "basalt-nbd-creds-*")))


class ImageTestCase(BasaltManagerTestCase):
    """The driver with basalt_nbd_uri set to the server's NBD-over-TLS address
    and a key file in a temporary directory (created through the API)."""

    def setUp(self) -> None:
        super().setUp()
        self.dir = tempfile.mkdtemp(prefix="basalt-cinder-images-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.conversion_dir = os.path.join(self.dir, "conversion")
        self.flags(image_conversion_dir=self.conversion_dir)
        self.psk_file = os.path.join(self.dir, "keys", "basalt-nbd.psk")
        self.flags(group=BACKEND, basalt_nbd_uri=[f"nbds://{env('BASALT_NBD_TLS')}"],
                   basalt_nbd_psk_file=self.psk_file)
        # Cinder's format inspector (qemu_img_info) is a privsep entrypoint; the
        # unit-test base forbids starting privsep's helper, so it runs in this
        # process, as root like the helper would.
        cinder.privsep.sys_admin_pctxt.set_client_mode(False)
        self.addCleanup(cinder.privsep.sys_admin_pctxt.set_client_mode, True)
        self.images = ImageService(self.dir)
        fake_image._fakeImageService = self.images
        fake_image.mock_image_service(self)
        self.addCleanup(fake_image.FakeImageService_reset)
        self.creds_before = creds_dirs()
        self.driver.check_for_setup_error()  # creates the key
        self.addCleanup(self._revoke_key)

    def _revoke_key(self) -> None:
        try:
            identity = nbd.read_psk_file(self.psk_file).identity
            admin().revoke_nbd_key(identity)
        except (OSError, ValueError, BasaltError):
            pass

    def assert_nothing_left(self) -> None:
        """No temporary image or key directory of this test is left."""
        left = os.listdir(self.conversion_dir) if os.path.isdir(self.conversion_dir) else []
        self.assertEqual([], left)
        self.assertEqual(set(), creds_dirs() - self.creds_before)

    def from_image(self, image_id: str, size: int = 1) -> objects.Volume:
        """A volume created from an image through the manager (no reschedule)."""
        vol = self.new_volume(size=size)
        try:
            self.manager.create_volume(self.context, vol,
                                       request_spec={"image_id": image_id})
        finally:
            vol.refresh()
        return vol


class ImageToVolumeTest(ImageTestCase):
    def check_created(self, image_id: str) -> None:
        vol = self.from_image(image_id)
        self.assertEqual("available", vol.status)
        self.assertTrue(vol.bootable)
        name = basalt_driver.volume_name(vol)
        self.assertTrue(has_pattern(name, A, 0, MiB))
        self.assertTrue(has_pattern(name, B, 40 * MiB, 3 * MiB))
        self.assertTrue(has_pattern(name, 0, MiB, 39 * MiB))
        self.assertTrue(has_pattern(name, 0, 64 * MiB, 16 * MiB))  # past the image
        self.assertFalse(has_pattern(name, 0, 40 * MiB, MiB))  # (the check can fail)
        meta = objects.Volume.get_by_id(self.context, vol.id).glance_metadata
        self.assertEqual(image_id, meta["image_id"])
        # Holes stayed holes: Basalt allocated about what the image holds.
        self.assertLess(admin().get_volume(name)["allocated_bytes"], 16 * MiB)
        self.assert_nothing_left()
        self.manager.delete_volume(self.context, vol)
        self.assertFalse(exists(name))

    def test_raw_image(self) -> None:
        path = make_image(os.path.join(self.dir, "img.raw"), "raw", "64M",
                          [(A, 0, MiB), (B, 40 * MiB, 3 * MiB)])
        self.check_created(self.images.add(path, "raw"))

    def test_qcow2_image(self) -> None:
        path = make_image(os.path.join(self.dir, "img.qcow2"), "qcow2", "64M",
                          [(A, 0, MiB), (B, 40 * MiB, 3 * MiB)])
        self.assertLess(os.path.getsize(path), 8 * MiB)
        self.check_created(self.images.add(path, "qcow2"))

    def test_reimage_writes_over_old_data(self) -> None:
        # Re-imaging (Nova's rebuild of a volume-backed server) reaches the
        # driver's copy_image_to_volume with disable_sparse on a used volume.
        vol = self.create(size=1)
        name = basalt_driver.volume_name(vol)
        write_pattern(name, C, 0, 64 * MiB)
        path = make_image(os.path.join(self.dir, "img.qcow2"), "qcow2", "32M",
                          [(A, 0, MiB)])
        image_id = self.images.add(path, "qcow2")
        vol.status = "downloading"
        vol.previous_status = "available"
        vol.save()
        self.manager.reimage(self.context, vol, self.images.show(None, image_id))
        vol.refresh()
        self.assertEqual("available", vol.status)
        self.assertTrue(has_pattern(name, A, 0, MiB))
        self.assertTrue(has_pattern(name, 0, MiB, 31 * MiB))  # the image's zeros
        self.assert_nothing_left()


class RefusedImageTest(ImageTestCase):
    def too_large(self) -> str:
        path = make_image(os.path.join(self.dir, "big.qcow2"), "qcow2", "2G", [(A, 0, MiB)])
        return self.images.add(path, "qcow2")

    def with_backing_file(self) -> str:
        base = make_image(os.path.join(self.dir, "base.raw"), "raw", "16M", [(A, 0, MiB)])
        path = make_image(os.path.join(self.dir, "top.qcow2"), "qcow2", "16M", [],
                          "-b", base, "-F", "raw")
        self.assertIn("backing file", run("qemu-img", "info", path))
        return self.images.add(path, "qcow2")

    def test_create_from_refused_images_leaves_nothing(self) -> None:
        # Cinder's create flow checks the downloaded image before it asks the
        # driver for a volume. A backing file fails Cinder's format inspector
        # (exception.Invalid); Cinder 29's flow then looks for the volume's
        # image metadata to clean it up and raises GlanceMetadataNotFound.
        for what, image_id, raised, words in (
                ("larger than the volume", self.too_large(), exception.ImageUnacceptable,
                 "doesn't fit"),
                ("with a backing file", self.with_backing_file(),
                 (exception.Invalid, exception.GlanceMetadataNotFound), "")):
            with self.subTest(what):
                vol = self.new_volume(size=1)
                try:
                    self.manager.create_volume(self.context, vol,
                                               request_spec={"image_id": image_id})
                except raised as e:
                    self.assertIn(words, str(e))
                else:
                    self.fail(f"an image {what} was accepted")
                vol.refresh()
                self.assertEqual("error", vol.status)
                self.assertFalse(exists(basalt_driver.volume_name(vol)))
                self.assert_nothing_left()

    def test_reimage_with_refused_images_leaves_the_volume_alone(self) -> None:
        # Here the driver's own checks refuse the image, before any write.
        vol = self.create(size=1)
        name = basalt_driver.volume_name(vol)
        write_pattern(name, C, 0, 2 * MiB)
        for what, image_id, words in (
                ("larger than the volume", self.too_large(), "doesn't fit in a volume"),
                ("with a backing file", self.with_backing_file(), "safety check"),
                ("whose format is not the declared one",
                 self.images.add(make_image(os.path.join(self.dir, "liar.qcow2"), "qcow2",
                                            "16M", [(A, 0, MiB)]), "raw"),
                 "different format")):
            with self.subTest(what):
                vol.status = "downloading"
                vol.previous_status = "available"
                vol.save()
                err = self.assertRaises(exception.ImageUnacceptable, self.manager.reimage,
                                        self.context, vol, self.images.show(None, image_id))
                self.assertIn(words, str(err))
                vol.refresh()
                self.assertEqual("error", vol.status)
                self.assertTrue(has_pattern(name, C, 0, 2 * MiB))
                self.assert_nothing_left()

    def test_revoked_key_fails_the_copy_with_qemu_img_message(self) -> None:
        admin().revoke_nbd_key(nbd.read_psk_file(self.psk_file).identity)
        path = make_image(os.path.join(self.dir, "img.raw"), "raw", "16M", [(A, 0, MiB)])
        vol = self.new_volume(size=1)
        err = self.assertRaises(exception.ImageCopyFailure, self.manager.create_volume,
                                self.context, vol,
                                request_spec={"image_id": self.images.add(path, "raw")})
        self.assertIn("qemu-img could not write image", str(err))
        self.assertIn("qemu-img: ", str(err))  # qemu-img's own message follows
        vol.refresh()
        self.assertEqual("error", vol.status)  # never reported good
        name = basalt_driver.volume_name(vol)
        self.assertTrue(has_pattern(name, 0, 0, MiB))
        self.assert_nothing_left()
        self.manager.delete_volume(self.context, vol)
        self.assertFalse(exists(name))


class VolumeToImageTest(ImageTestCase):
    def volume_with_patterns(self) -> tuple[objects.Volume, str]:
        vol = self.create(size=1)
        name = basalt_driver.volume_name(vol)
        write_pattern(name, A, 0, MiB)
        write_pattern(name, B, 700 * MiB, 2 * MiB)
        write_pattern(name, C, GiB - MiB, MiB)
        vol.status = "uploading"
        vol.save()
        return vol, name

    def upload(self, vol: objects.Volume, disk_format: str) -> str:
        meta = self.images.queued(disk_format)
        self.manager.copy_volume_to_image(self.context, vol.id, meta)
        vol.refresh()
        self.assertEqual("available", vol.status)
        image = self.images.show(None, meta["id"])
        self.assertEqual("active", image["status"])
        self.assert_nothing_left()
        return self.images.files[meta["id"]]

    def test_raw_upload_gives_the_same_bytes(self) -> None:
        vol, name = self.volume_with_patterns()
        path = self.upload(vol, "raw")
        self.assertEqual(GiB, os.path.getsize(path))
        run("qemu-img", "compare", "-q", "-f", "raw", "-F", "raw", path, nbd_uri(name))
        run("qemu-io", "-f", "raw", "-r", "-c", f"read -P {B:#x} {700 * MiB} {2 * MiB}", path)

    def test_qcow2_upload_gives_the_same_bytes(self) -> None:
        vol, name = self.volume_with_patterns()
        path = self.upload(vol, "qcow2")
        self.assertIn('"format": "qcow2"', run("qemu-img", "info", "--output=json", path))
        self.assertLess(os.path.getsize(path), 64 * MiB)
        run("qemu-img", "compare", "-q", "-f", "qcow2", "-F", "raw", path, nbd_uri(name))
        # ... and back into a new volume, through the driver again.
        back = self.from_image(self.images.add(path, "qcow2"))
        self.assertEqual("available", back.status)
        back_name = basalt_driver.volume_name(back)
        run("qemu-img", "compare", "-q", "-f", "raw", "-F", "raw", nbd_uri(back_name),
            nbd_uri(name))

    def test_unreachable_endpoint_fails_the_upload_and_deletes_the_image(self) -> None:
        vol, _ = self.volume_with_patterns()
        self.flags(group=BACKEND, basalt_nbd_uri=[dead_nbds()])
        meta = self.images.queued("raw")
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.manager.copy_volume_to_image, self.context, vol.id, meta)
        self.assertRaises(exception.ImageNotFound, self.images.show, None, meta["id"])
        vol.refresh()
        self.assertEqual("available", vol.status)
        self.assert_nothing_left()


class NbdConfigurationTest(ImageTestCase):
    def test_key_is_created_once_for_the_tokens_project(self) -> None:
        psk = nbd.read_psk_file(self.psk_file)
        self.assertEqual(0o600, stat.S_IMODE(os.stat(self.psk_file).st_mode))
        self.assertTrue(psk.identity.startswith(env("BASALT_PROJECT") + "."), psk.identity)
        keys = admin().request("GET", "/api/v1/nbd-keys")["keys"]
        mine = [k for k in keys if k["identity"] == psk.identity]
        self.assertEqual(env("BASALT_PROJECT"), mine[0]["project"])
        # Set up again: the same key, no new one.
        self.driver.check_for_setup_error()
        self.assertEqual(psk, nbd.read_psk_file(self.psk_file))
        after = admin().request("GET", "/api/v1/nbd-keys")["keys"]
        self.assertEqual(len(keys), len(after))

    def test_key_file_readable_by_others_is_refused(self) -> None:
        os.chmod(self.psk_file, 0o644)
        err = self.assertRaises(exception.VolumeBackendAPIException,
                                self.driver.check_for_setup_error)
        self.assertIn("chmod 600", str(err))

    def test_plain_nbd_uri_is_refused(self) -> None:
        self.flags(group=BACKEND, basalt_nbd_uri=["nbd://127.0.0.1:10809"])
        err = self.assertRaises(exception.InvalidConfigurationValue,
                                self.driver.do_setup, self.context)
        self.assertIn("no authentication", str(err))

    def test_the_next_endpoint_is_used_when_the_first_is_down(self) -> None:
        dead = dead_nbds()
        self.flags(group=BACKEND,
                   basalt_nbd_uri=[dead, f"nbds://{env('BASALT_NBD_TLS')}"])
        path = make_image(os.path.join(self.dir, "img.raw"), "raw", "8M", [(A, 0, MiB)])
        vol = self.from_image(self.images.add(path, "raw"))
        self.assertEqual("available", vol.status)
        self.assertTrue(has_pattern(basalt_driver.volume_name(vol), A, 0, MiB))
        self.assertEqual(nbd.parse_endpoint(env("BASALT_NBD_TLS")),
                         self.driver._nbd_preferred)

    def test_without_nbd_the_generic_path_is_taken(self) -> None:
        """basalt_nbd_uri unset: Cinder's generic copy, which attaches the volume
        to this host with os-brick. Here os-brick may not run its privileged
        helper, so the attach fails: that failure, and the log line, show which
        path was taken (the NBD path never calls os-brick)."""
        self.flags(group=BACKEND, basalt_nbd_uri=[])
        path = make_image(os.path.join(self.dir, "img.raw"), "raw", "8M", [(A, 0, MiB)])
        image_id = self.images.add(path, "raw")
        logger = self.useFixture(fixtures.FakeLogger(name="basalt_cinder.driver",
                                                     level=logging.INFO))
        vol = self.new_volume(size=1)
        err = self.assertRaises(exception.ImageCopyFailure, self.manager.create_volume,
                                self.context, vol, request_spec={"image_id": image_id})
        # The generic path got as far as os-brick's privileged helper, which
        # Cinder's unit-test base forbids (PrivsepNoHelperFixture).
        self.assertIn("privsep helper", str(err))
        self.assertIn("through Cinder's generic path", logger.output)
        self.assertIn("basalt_nbd_uri is not set", logger.output)
        vol.refresh()
        self.assertEqual("error", vol.status)
        self.assertFalse(has_pattern(basalt_driver.volume_name(vol), A, 0, MiB))
        # Nothing was left attached by the generic path's attempt.
        self.assertEqual([], admin().get_volume(basalt_driver.volume_name(vol))
                         .get("nvme_hosts") or [])
