"""A tensor-parallel Llama-architecture model for measuring what the communication paths do to
a model: decode and prefill timing, logits against the unsharded model, and fidelity of the
low-precision paths on a trained model. Run it as ``python -m ferrocomm.bench_model`` under
torchrun (docs/model-bench.md). It needs torch; the rest of ferrocomm does not.
"""


def _entry(argv=None):
    try:
        import torch  # noqa: F401
    except ImportError:
        import sys

        print("bench_model: error: torch is not installed, and the model bench needs it "
              "(pip install torch)", file=sys.stderr)
        return 2
    from .cli import main

    return main(argv)
