# python/examples/host.py: ferrocomm launch -n 4 .venv/bin/python python/examples/host.py
# (or torchrun --nproc_per_node 4 python/examples/host.py)
import numpy as np, ferrocomm
comm = ferrocomm.new_comm("host", "cpu", "world")
x = np.arange(8, dtype=np.float32) * (comm.rank + 1)
comm.all_reduce(x, ferrocomm.ReduceOp.SUM)
print(comm.rank, x)
