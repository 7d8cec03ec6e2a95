"""The ``torch.backends`` entry point: torch calls ``autoload()`` at the end of ``import torch``,
so that ``dist.init_process_group("ferrocomm")`` needs no import of ferrocomm."""


def autoload() -> None:
    import torch.distributed as dist

    # A torch built without distributed support has nothing to register with.
    if dist.is_available():
        from . import torch as _backend  # noqa: F401 (registers "ferrocomm")
