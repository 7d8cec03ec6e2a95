"""Exceptions raised by ferrocomm. The native layer raises these classes by name."""

__all__ = [
    "FerrocommError",
    "FerrocommValueError",
    "FerrocommTimeout",
    "FerrocommUnsupported",
    "FerrocommPeerFailed",
    "PeerFailed",
]


class FerrocommError(RuntimeError):
    """Any error reported by ferrocomm (the message is the library's)."""


class FerrocommValueError(FerrocommError, ValueError):
    """A bad argument: wrong dtype, shape or size, non-contiguous tensor, wrong device, bad rank."""


class FerrocommTimeout(FerrocommError, TimeoutError):
    """A peer did not arrive in time (it died, hangs, or called something else)."""


class FerrocommUnsupported(FerrocommError, NotImplementedError):
    """The backend cannot do this (or a library it needs is absent)."""


class FerrocommPeerFailed(FerrocommError):
    """A peer died or gave up on the communicator (the message names its rank); the
    communicator is aborted."""


PeerFailed = FerrocommPeerFailed
