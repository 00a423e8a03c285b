"""Timings of the driver's lifecycle calls through Cinder's VolumeManager,
for issue 24's report (not part of the default run: pytest collects test_*.py).

    BASALT_CINDER_CAPACITY=200G PYTEST_ARGS="-s bench_lifecycle.py" \
        integrations/openstack/run-tests.sh

- create, snapshot, clone and create-from-snapshot of a 100 GiB volume;
- the seed-style check: 10 volumes created from one image-backed snapshot
  (a volume holding 512 MiB of written data), wall time for all 10, each
  one checked to read the image's data.
"""

from __future__ import annotations

import time

from basalt_cinder import driver as basalt_driver
from conftest import BasaltManagerTestCase, has_pattern, qemu_io

IMAGE = 0x5D


class LifecycleTimings(BasaltManagerTestCase):
    def test_timings(self) -> None:
        def timed(what: str, call):  # type: ignore[no-untyped-def]
            t = time.monotonic()
            result = call()
            print(f"  {what}: {(time.monotonic() - t) * 1000:.0f} ms")
            return result

        print("\n100 GiB volume through Cinder's VolumeManager:")
        vol = timed("create", lambda: self.create(size=100))
        snap = timed("snapshot", lambda: self.snapshot(vol))
        clone = timed("clone", lambda: self.create(size=100, source_volid=vol.id))
        from_snap = timed(
            "create from snapshot", lambda: self.create(size=100, snapshot_id=snap.id)
        )
        for v in (vol, clone, from_snap):
            self.assertEqual("available", v.status)

        print("10 volumes from one image-backed snapshot:")
        image = self.create(size=2)
        image_name = basalt_driver.volume_name(image)
        qemu_io(image_name, f"write -P {IMAGE:#x} 0 512M")
        image_snap = self.snapshot(image)
        t = time.monotonic()
        vms = [self.create(size=2, snapshot_id=image_snap.id) for _ in range(10)]
        print(f"  all 10: {(time.monotonic() - t) * 1000:.0f} ms")
        for v in vms:
            self.assertEqual("available", v.status)
            self.assertTrue(has_pattern(basalt_driver.volume_name(v), IMAGE, 0, 512 << 20))
