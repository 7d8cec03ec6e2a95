"""One rank of the first-use measurement (scripts/gpu_first_use.sh): the time from the start
of this program (before `import torch` and `import ferrocomm`) to the first all-reduce's result
on the GPU, in parts, as one JSON line; ranks come from `ferrocomm launch` (torchrun's
variables)."""

import time

T0 = time.perf_counter()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

T_TORCH = time.perf_counter()

import ferrocomm  # noqa: E402

T_IMPORT = time.perf_counter()


def main():
    torch.cuda.init()
    # With fewer GPUs than ranks, the ranks share them (local rank mod the GPUs).
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    comm = ferrocomm.new_comm("ferrocomm", dev, name="first_use")
    t_comm = time.perf_counter()
    t = torch.full((1024,), float(comm.rank + 1), device=dev)
    comm.all_reduce(t, ferrocomm.ReduceOp.SUM, async_op=False)
    torch.cuda.synchronize()
    t_done = time.perf_counter()
    want = comm.size * (comm.size + 1) / 2
    ok = bool(torch.all(t == want).item())
    print(json.dumps({
        "rank": comm.rank,
        "world": comm.size,
        "builtin_kernels": os.environ.get("FERROCOMM_BUILTIN_KERNELS", "1"),
        "import_torch_s": round(T_TORCH - T0, 3),
        "import_ferrocomm_s": round(T_IMPORT - T_TORCH, 3),
        "new_comm_s": round(t_comm - T_IMPORT, 3),
        "first_all_reduce_s": round(t_done - t_comm, 3),
        "import_to_result_s": round(t_done - T_TORCH, 3),
        "total_s": round(t_done - T0, 3),
        "correct": ok,
    }), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
