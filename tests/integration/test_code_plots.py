"""Rich output end to end: a template that installs matplotlib (from the
Debian mirror) gets figures back from run_code as PNG, with no display."""

import base64
import shutil
import tempfile

import pytest

from harness import Daemon, keep_rootfs, seed_rootfs

SPEC = {"name": "tpl-plots", "packages": ["python3-matplotlib"], "memory_mb": 512}


@pytest.fixture
def plots():
    tdir = tempfile.mkdtemp(prefix="hxplt-", dir="/tmp")
    # The rootfs (debootstrap with matplotlib, minutes) comes from the test
    # cache when it has one for these packages; the build through the API,
    # its checkpoint bake and everything after are this test's own.
    seed_rootfs(tdir, SPEC["name"])
    d = Daemon(extra_args=["--pool-size", "0"], templates_dir=tdir).start()
    r = d.request("POST", "/v1/templates", SPEC)
    assert r.status == 202, r
    events = d.stream(None, None, path=r.json()["events_url"], method="GET", timeout=900)
    assert events[-1][0] == "done", events[-5:]
    keep_rootfs(tdir, SPEC["name"])
    yield d
    d.cleanup()
    shutil.rmtree(tdir, ignore_errors=True)


def is_png(b64):
    return base64.b64decode(b64)[:8] == b"\x89PNG\r\n\x1a\n"


# Longer than the default: with the cache cold, its fixture debootstraps
# a rootfs with matplotlib (minutes).
@pytest.mark.timeout(1200)
def test_matplotlib_figures_come_back_as_png(plots):
    d = plots
    sid = d.create(template="tpl-plots")
    src = (
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [1, 4, 9])\n"
        "plt.title('squares')\n"
        "print('drawn')"
    )
    r = d.request("POST", f"/v1/sandboxes/{sid}/code", {"code": src, "timeout_seconds": 60})
    assert r.status == 200, r
    r = r.json()
    assert r["error"] is None and r["stdout"] == "drawn\n", r
    pngs = [x for x in r["results"] if "image/png" in x["data"]]
    assert len(pngs) == 1 and is_png(pngs[0]["data"]["image/png"]), r["results"]
    assert pngs[0]["data"]["text/plain"].startswith("<Figure size")
    # plt.show() flushes at once; a figure as the last expression is the
    # main result, sent once.
    r = d.request("POST", f"/v1/sandboxes/{sid}/code",
                  {"code": "fig = plt.figure()\nplt.bar([1], [2])\nplt.show()\nfig2 = plt.figure()\nfig2"}).json()
    kinds = [(("image/png" in x["data"]), x["is_main_result"]) for x in r["results"]]
    assert kinds == [(True, False), (True, True)], r["results"]
    assert all(is_png(x["data"]["image/png"]) for x in r["results"])
