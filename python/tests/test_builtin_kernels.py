"""The CUDA kernels built into the package, checked without a GPU: the installed module and the
wheel file it came from (scripts/test.sh builds the wheel into target/wheels-test and installs
it; FERROCOMM_TEST_WHEEL names another) hold the cubins of every default target, each a CUDA
ELF file for its architecture with every kernel the runtime looks up (read back by
`kernels::check_builtin`)."""

import glob
import json
import os
import subprocess
import sys
import zipfile


from ferrocomm import _native

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The targets the crate's build makes by default (crates/ferrocomm/build.rs).
DEFAULT_TARGETS = ["sm_80", "sm_90", "sm_100", "compute_90"]
# The limit the package keeps to (the wheel of a release build is measured in README.md).
WHEEL_LIMIT = 40 * 1000 * 1000


def _check(report):
    assert report["notes"] == [], report["notes"]
    assert report["targets"] == DEFAULT_TARGETS, report["targets"]
    assert report["nvrtc"] is not None
    rows = {r["target"]: r for r in report["checked"]}
    assert sorted(rows) == sorted(DEFAULT_TARGETS)
    # f32 15 units (the window unit among them), f16 and bf16 10 each, four integer types 8
    # each; sm_80 lacks the six FP8 ones (low precision and norm of the three float types).
    for t, r in rows.items():
        assert r["units"] == (61 if t == "sm_80" else 67), (t, r)
        assert r["symbols"] > r["units"] and r["bytes"] > r["compressed_bytes"] > 0, (t, r)


def test_the_installed_module_has_every_default_target():
    _check(_native.builtin_kernels())


def _wheel():
    named = os.environ.get("FERROCOMM_TEST_WHEEL")
    if named:
        return named
    found = sorted(glob.glob(os.path.join(ROOT, "target", "wheels-test", "ferrocomm-*.whl")),
                   key=os.path.getmtime)
    assert found, ("no wheel in target/wheels-test: scripts/test.sh builds it "
                   "(or set FERROCOMM_TEST_WHEEL)")
    return found[-1]


def test_the_wheel_holds_the_kernels(tmp_path):
    wheel = _wheel()
    size = os.path.getsize(wheel)
    with zipfile.ZipFile(wheel) as z:
        natives = [n for n in z.namelist() if n.startswith("ferrocomm/_native") and n.endswith(".so")]
        assert len(natives) == 1, z.namelist()
        z.extract(natives[0], tmp_path)
    path = str(tmp_path / natives[0])
    # The wheel's own native module, loaded by path in a fresh interpreter (not the installed
    # one), reports and checks its kernels.
    code = (
        "import importlib.util, json, sys\n"
        "spec = importlib.util.spec_from_file_location('_native', sys.argv[1])\n"
        "m = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(m)\n"
        "print(json.dumps(m.builtin_kernels()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    _check(report)
    # The same kernels as the installed package's.
    assert report == json.loads(json.dumps(_native.builtin_kernels()))
    # A dev-profile wheel carries debug information; the kernels alone must leave room in a
    # release wheel.
    compressed = sum(r["compressed_bytes"] for r in report["checked"])
    assert compressed < WHEEL_LIMIT // 2, compressed
    print(f"{os.path.basename(wheel)}: {size} bytes, kernels {compressed} bytes compressed")
