"""Command line of `python -m ferrocomm.bench_model` (see docs/model-bench.md)."""

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from . import config, fidelity, hf, report, timing, train
from .config import BenchArgumentError
from .model import Model
from .paths import ALGOS, LP_FORMATS, Group, parse_paths

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _ints(text):
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, not {text!r}")
    if any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive integers, not {text!r}")
    return vals


def _positive(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}")
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}")
    return v


def _bytes(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    try:
        v = int(text[:-1] if mult > 1 else text) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a byte count (K, M, G suffixes), not {text!r}")
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a byte count >= 0, not {text!r}")
    return v


def parser():
    p = argparse.ArgumentParser(
        prog="python -m ferrocomm.bench_model",
        description="Tensor-parallel Llama-architecture model: decode/prefill timing per "
                    "communication path (default), --check against the unsharded model, "
                    "--fidelity of the low-precision paths. Run one process per rank under "
                    "torchrun.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="compare the TP model's logits on every path with the unsharded model")
    mode.add_argument("--fidelity", action="store_true",
                      help="logits and perplexity of every path and wire format")
    m = p.add_argument_group("model")
    m.add_argument("--model", default="llama3-8b",
                   help=f"size: {', '.join(config.SIZES)} (default llama3-8b)")
    for f in ("vocab", "hidden", "layers", "heads", "kv-heads", "head-dim", "ffn"):
        m.add_argument("--" + f, type=_positive, help=f"override the size's {f}")
    m.add_argument("--hf", metavar="DIR",
                   help="with --fidelity: a Hugging Face model directory instead of the trained "
                        "byte-level model (loaded with transformers, never downloaded)")
    m.add_argument("--text", metavar="FILE", help="with --hf: the text to measure perplexity on")
    m.add_argument("--dtype", choices=_DTYPES, help="bf16 on a GPU, fp32 on the CPU by default")
    m.add_argument("--seed", type=int, default=0)
    c = p.add_argument_group("communication")
    c.add_argument("--paths", help="comma-separated: nccl, gloo, ferrocomm, ferrocomm-lp, "
                                   "ferrocomm-fused, ferrocomm-fused-lp, none (default: every "
                                   "one that can run here)")
    c.add_argument("--device", help="cuda (LOCAL_RANK's GPU; ranks share GPUs when there are "
                                    "fewer) or cpu; default cuda when present")
    c.add_argument("--lp-format", choices=LP_FORMATS, default="e4m3",
                   help="wire format of the -lp paths (default e4m3)")
    c.add_argument("--lp-min-bytes", type=_bytes, default=0,
                   help="-lp paths: all-reduces smaller than this stay full precision (default 0)")
    c.add_argument("--algo", choices=ALGOS, default="auto",
                   help="force ferrocomm's all-reduce algorithm (default auto)")
    c.add_argument("--timeout", type=_positive, default=900,
                   help="seconds any rank waits for the others (default 900)")
    t = p.add_argument_group("timing")
    t.add_argument("--decode-batches", type=_ints, default=[1, 8, 32])
    t.add_argument("--context", type=_positive, default=2048,
                   help="KV cache positions a decode step attends to (default 2048)")
    t.add_argument("--steps", type=_positive, default=100, help="timed decode steps")
    t.add_argument("--warmup", type=_positive, default=20, help="untimed decode steps first")
    t.add_argument("--prefill", type=_ints, default=[512, 2048, 8192], help="prompt lengths")
    t.add_argument("--prefill-reps", type=_positive, default=5)
    t.add_argument("--no-decode", action="store_true")
    t.add_argument("--no-prefill", action="store_true")
    t.add_argument("--no-comm-share", dest="comm_share", action="store_false",
                   help="skip the run without communication (the 'comm' column)")
    k = p.add_argument_group("check and fidelity")
    k.add_argument("--check-batch", type=_positive, default=2)
    k.add_argument("--check-prompt", type=_positive, default=32)
    k.add_argument("--check-steps", type=_positive, default=32,
                   help="teacher-forced decode steps compared")
    k.add_argument("--tolerance", type=float,
                   help="--check: largest |TP - unsharded| relative to max(1, max |logit|) "
                        "(default 1e-4 in fp32, 5e-2 in bf16/fp16)")
    k.add_argument("--lm", default="byte-lm", help="size of the model --fidelity trains")
    k.add_argument("--lm-checkpoint", metavar="FILE",
                   help="load the trained model from FILE if it exists, else train and save there")
    k.add_argument("--train-steps", type=_positive, default=1500)
    k.add_argument("--train-batch", type=_positive, default=32)
    k.add_argument("--train-seq", type=_positive, default=512)
    k.add_argument("--lr", type=float, default=2e-3)
    k.add_argument("--corpus-bytes", type=_bytes, default=48 << 20,
                   help="standard-library source read for training and held-out text")
    k.add_argument("--eval-seq", type=_positive, default=512)
    k.add_argument("--eval-windows", type=_positive, default=64)
    k.add_argument("--eval-batch", type=_positive, default=8)
    p.add_argument("--out", help="run folder (default bench/results/<date>-<host>-model-<time>)")
    return p


def _launcher():
    """(rank, world, local rank, local world) from torchrun's variables."""
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
               if not os.environ.get(v)]
    if missing:
        raise BenchArgumentError(
            f"{', '.join(missing)} not set: run one process per rank under torchrun, e.g. "
            "torchrun --nproc_per_node 2 -m ferrocomm.bench_model ...")
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    except ValueError as e:
        raise BenchArgumentError(f"a launcher variable is not an integer: {e}")
    if world < 1 or not 0 <= rank < world or not 0 <= local < local_world:
        raise BenchArgumentError(f"RANK={rank} WORLD_SIZE={world} LOCAL_RANK={local} "
                                 f"LOCAL_WORLD_SIZE={local_world} do not fit together")
    return rank, world, local, local_world


def _fused_available():
    import ferrocomm

    return callable(getattr(ferrocomm.Comm, "all_reduce_rmsnorm", None))


def resolve(args):
    """Checks the arguments and fills in defaults (device, dtype, paths, model), before any
    rank waits for another."""
    rank, world, local, local_world = _launcher()
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device not in ("cuda", "cpu"):
        raise BenchArgumentError(f"--device must be cuda or cpu, not {args.device!r}")
    shared = False
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise BenchArgumentError("--device cuda but torch sees no GPU")
        n = torch.cuda.device_count()
        shared = local_world > n
        args.device = f"cuda:{local % n}"
        torch.cuda.set_device(args.device)
        if shared and "FERROCOMM_NCCL_LIB" not in os.environ:
            # NCCL refuses two ranks on one GPU; ferrocomm then runs without it.
            os.environ["FERROCOMM_NCCL_LIB"] = "/nonexistent"
    args.shared_gpu = shared
    if args.dtype is None:
        args.dtype = "fp32" if args.device == "cpu" else "bf16"
    args.torch_dtype = _DTYPES[args.dtype]
    if args.tolerance is None:
        args.tolerance = 1e-4 if args.dtype == "fp32" else 5e-2
    fused = _fused_available()
    if args.paths:
        paths = parse_paths(args.paths)
    elif args.device == "cpu" or shared:
        paths = ["gloo", "ferrocomm", "ferrocomm-lp"]
    else:
        paths = ["nccl", "ferrocomm", "ferrocomm-lp"]
    if not args.paths and fused:
        paths += ["ferrocomm-fused", "ferrocomm-fused-lp"]
    if "nccl" in paths and args.device == "cpu":
        raise BenchArgumentError("path nccl needs --device cuda (use gloo on the CPU)")
    if "nccl" in paths and shared:
        raise BenchArgumentError(
            f"path nccl: {local_world} ranks share {torch.cuda.device_count()} GPU(s) and NCCL "
            "refuses two ranks on one GPU; use gloo as the reference")
    if any(p.startswith("ferrocomm-fused") for p in paths) and not fused:
        import ferrocomm

        raise BenchArgumentError(
            "paths ferrocomm-fused and ferrocomm-fused-lp need Comm.all_reduce_rmsnorm (the "
            f"fused all-reduce + residual + RMSNorm), which the installed ferrocomm "
            f"{ferrocomm.__version__} ({ferrocomm.__file__}) does not have")
    args.paths_list, args.fused = paths, fused
    if args.text and not args.hf:
        raise BenchArgumentError("--text needs --hf DIR (the model to measure it with)")
    if args.hf and not args.fidelity:
        raise BenchArgumentError("--hf is for --fidelity (timing uses random weights)")
    if args.hf and not args.text:
        raise BenchArgumentError("--hf needs --text FILE (held-out text for the perplexity)")
    if args.text and not Path(args.text).is_file():
        raise BenchArgumentError(f"--text {args.text}: no such file")
    overrides = {k: getattr(args, k) for k in
                 ("vocab", "hidden", "layers", "heads", "kv_heads", "head_dim", "ffn")}
    cfg = config.from_hf(args.hf) if args.hf else config.resolve(args.model, **overrides)
    cfg.check_split(world)
    lm = None
    if args.fidelity and not args.hf:
        lm = config.resolve(args.lm)
        lm.check_split(world)
        if lm.vocab != 256:
            raise BenchArgumentError(f"--lm {args.lm}: the trained model reads bytes, so its "
                                     f"vocabulary must be 256, not {lm.vocab}")
    if args.no_decode:
        args.decode_batches = []
    if args.no_prefill:
        args.prefill = []
    return rank, world, cfg, lm


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    try:
        rank, world, cfg, lm = resolve(args)
    except BenchArgumentError as e:
        print(f"bench_model: error: {e}", file=sys.stderr)
        return 2

    def log(msg):
        if rank == 0:
            print(msg, flush=True)

    out = Path(args.out) if args.out else report.default_out()
    doc = {"command": [sys.executable, "-m", "ferrocomm.bench_model", *argv],
           "model": cfg.__dict__, "paths": args.paths_list}
    group = Group(args.device, "nccl" in args.paths_list, args.timeout)
    try:
        doc["machine"] = report.machine(args.device, world)
        failed = False
        if args.check:
            group.connect_ferrocomm()
            doc["check"] = fidelity.check(cfg, group, args.paths_list, args, log)
            failed = not doc["check"]["passed"]
        elif args.fidelity:
            doc["fidelity"] = _fidelity(cfg, lm, group, args, out, log)
        else:
            group.connect_ferrocomm()
            max_pos = max([args.context, *args.prefill])
            model = Model.random(cfg, args.seed, group.rank, world, args.device,
                                 args.torch_dtype, max_pos)
            log(f"model {cfg.name}: {cfg.params() / 1e9:.2f}B parameters, {world} ranks, "
                f"paths {', '.join(args.paths_list)}")
            doc["timing"] = timing.run(model, group, args.paths_list, args)
        group.barrier()
    finally:
        group.close()
    if rank == 0:
        print(report.tables(doc))
        report.write(out, doc)
        png = " and result.png" if (out / "result.png").exists() else ""
        print(f"\nwrote {out}/result.json{png}")
    return 1 if failed else 0


def _train(lm, ckpt, args, log):
    """Trains the byte-level model on the standard library's source and saves it at `ckpt`."""
    data, held, root = train.stdlib_corpus(args.corpus_bytes)
    log(f"training {lm.name} ({lm.params() / 1e6:.1f}M parameters) on {len(data)} bytes "
        f"of {root}, {len(held)} bytes held out")
    full, stats = train.train(
        lm, train.as_tokens(data), steps=args.train_steps, batch=args.train_batch,
        seq=args.train_seq, lr=args.lr, seed=args.seed, device=args.device, log=log)
    stats.update(corpus=root, train_bytes=len(data), held_out_bytes=len(held))
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"config": lm.__dict__, "weights": full, "stats": stats}, ckpt)


def _fidelity(cfg, lm, group, args, out, log):
    """Trains (rank 0) or loads the small LM, then compares paths and measures perplexity."""
    res = {}
    ref = "gloo" if args.device == "cpu" or args.shared_gpu else "nccl"
    if ref == "nccl" and group.nccl is None:
        group.nccl = group.dist.new_group(backend="nccl")
    if args.hf:
        full = hf.weights(args.hf, args.torch_dtype)
        tokens = hf.tokens(args.hf, args.text)
        lm_cfg = cfg
        res["lm"] = {"name": cfg.name, "source": args.hf, "text": args.text}
    else:
        lm_cfg = lm
        ckpt = Path(args.lm_checkpoint) if args.lm_checkpoint else out / f"{lm.name}.pt"
        error = None
        if group.rank == 0 and not ckpt.exists():
            try:
                _train(lm, ckpt, args, log)
            except Exception as e:  # reported to every rank below, then raised here
                error = e
        # Every rank waits here for rank 0's training; a failure there ends every rank.
        if group.max(1.0 if error else 0.0):
            if error:
                raise error
            raise RuntimeError("rank 0 could not train the model (its error is in its output)")
        saved = torch.load(ckpt, weights_only=True)
        if saved["config"] != lm.__dict__:
            raise BenchArgumentError(f"--lm-checkpoint {ckpt} holds a model of another shape: "
                                     f"{saved['config']}")
        full = saved["weights"]
        _, held, _ = train.stdlib_corpus(args.corpus_bytes)
        tokens = train.as_tokens(held)
        res["lm"] = {"name": lm.name, "checkpoint": str(ckpt), "train": saved["stats"]}
    group.connect_ferrocomm()
    if args.hf:
        model = Model.from_full(lm_cfg, full, group.rank, group.world, args.device,
                                args.torch_dtype, max(args.eval_seq, args.check_prompt +
                                                      args.check_steps))
    else:
        model = Model.random(cfg, args.seed, group.rank, group.world, args.device,
                             args.torch_dtype, args.check_prompt + args.check_steps)
    t0 = time.perf_counter()
    res["paths"] = fidelity.compare_paths(model, group, ref, args, log, args.fused)
    del model
    model = Model.from_full(lm_cfg, full, group.rank, group.world, args.device,
                            args.torch_dtype, args.eval_seq)
    res["perplexity"] = fidelity.perplexity(model, group, tokens, ref, args, log, args.fused)
    res["eval_seconds"] = time.perf_counter() - t0
    return res
