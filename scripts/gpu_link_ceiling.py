"""What the NVLink between two GPUs carries, as the ceiling for the bench's figures.

Peer copies by the copy engines (torch's cross-device copy_), one direction alone and both
directions at once (each GPU's stream copies its buffer into the other GPU), 20 copies per
measurement (wall time between synchronisations of both GPUs), median of 5:

    python3 scripts/gpu_link_ceiling.py [SIZES...]     (default 16M 64M 256M; needs 2 GPUs)

Prints GB/s per direction (1 GB = 1e9 bytes), and the time one direction takes per copy.
"""
import statistics
import sys
import time

import torch


def size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def timed(pairs, reps=5, n=20):
    """pairs: [(dst, src, stream)]; each stream issues n copies, both streams at once; returns
    the median wall time per copy (the devices synchronised before and after)."""
    devs = [torch.device("cuda:0"), torch.device("cuda:1")]
    out = []
    for _ in range(reps):
        for d in devs:
            torch.cuda.synchronize(d)
        t0 = time.perf_counter()
        for _ in range(n):
            for dst, src, st in pairs:
                with torch.cuda.stream(st):
                    dst.copy_(src, non_blocking=True)
        for d in devs:
            torch.cuda.synchronize(d)
        out.append((time.perf_counter() - t0) / n)
    return statistics.median(out)


def main():
    if torch.cuda.device_count() < 2:
        sys.exit("gpu_link_ceiling: needs two GPUs")
    d0, d1 = torch.device("cuda:0"), torch.device("cuda:1")
    assert torch.cuda.can_device_access_peer(0, 1), "no peer access between GPU 0 and 1"
    s0, s1 = torch.cuda.Stream(d0), torch.cuda.Stream(d1)
    print(f"{'bytes':>12} {'one way GB/s':>13} {'us':>9} {'both ways GB/s each':>20} {'us':>9}")
    for arg in sys.argv[1:] or ["16M", "64M", "256M"]:
        b = size(arg)
        a0 = torch.randint(0, 255, (b,), dtype=torch.uint8, device=d0)
        a1 = torch.randint(0, 255, (b,), dtype=torch.uint8, device=d1)
        r0, r1 = torch.empty_like(a0), torch.empty_like(a1)  # r0 on GPU 0 receives from GPU 1
        for _ in range(3):
            r1.copy_(a0)
            r0.copy_(a1)
        torch.cuda.synchronize(d0)
        torch.cuda.synchronize(d1)
        one = timed([(r1, a0, s0)])
        both = timed([(r1, a0, s0), (r0, a1, s1)])
        assert torch.equal(r1.cpu(), a0.cpu()) and torch.equal(r0.cpu(), a1.cpu())
        print(f"{b:>12} {b / one / 1e9:>13.1f} {one * 1e6:>9.2f} {b / both / 1e9:>20.1f} {both * 1e6:>9.2f}")


if __name__ == "__main__":
    main()
