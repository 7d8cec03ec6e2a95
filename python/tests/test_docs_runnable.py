"""Every command of README.md and docs/*.md in a code block marked `runnable` (the word in the
fence's info string: ```sh runnable) runs as written: from the checkout's root, on the host
backend (NCCL and GPUs out of the way), with .venv/bin and the test build's `ferrocomm`
(target/debug) first on PATH, and exits with 0. A block marked `file=PATH` shows that file of
the checkout and must match it."""

import glob
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.M | re.S)
# Seconds one block may take (the bench's four ranks and the model check take about 30 s on
# two loaded cores).
BLOCK_LIMIT = 300


def _blocks():
    docs = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    out = []
    for path in docs:
        text = open(path, encoding="utf-8").read()
        for m in FENCE.finditer(text):
            words = m.group(1).split()
            line = text[:m.start()].count("\n") + 1
            where = f"{os.path.relpath(path, ROOT)}:{line}"
            if "runnable" in words:
                out.append(("run", where, m.group(2)))
            for w in words:
                if w.startswith("file="):
                    out.append(("file", where, (w[len("file="):], m.group(2))))
    return out


BLOCKS = _blocks()


def test_the_docs_mark_commands_runnable():
    kinds = [k for k, _, _ in BLOCKS]
    # README's bench, host example and Rust example, python.md's check, model-bench.md's check.
    assert kinds.count("run") >= 5, BLOCKS
    assert kinds.count("file") >= 1, BLOCKS


def _env():
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.join(ROOT, ".venv", "bin"),
                                   os.path.join(ROOT, "target", "debug"), env.get("PATH", "")])
    # The host backend: no GPU, no NCCL, whatever this machine has.
    env.update(CUDA_VISIBLE_DEVICES="", FERROCOMM_NCCL_LIB="/nonexistent", PYTHONUNBUFFERED="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


@pytest.mark.parametrize("kind,where,body", BLOCKS, ids=[w for _, w, _ in BLOCKS])
def test_block(kind, where, body):
    if kind == "file":
        path, shown = body
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            assert f.read() == shown, f"{where} shows {path} otherwise than it is"
        return
    assert os.path.exists(os.path.join(ROOT, "target", "debug", "ferrocomm")), \
        "target/debug/ferrocomm: build it first (cargo build -p ferrocomm-cli)"
    try:
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=ROOT, env=_env(),
                           capture_output=True, text=True, timeout=BLOCK_LIMIT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{where} ran past {BLOCK_LIMIT} s:\n{body}")
    assert r.returncode == 0, f"{where} exited with {r.returncode}:\n{body}\n{r.stdout}\n{r.stderr}"
