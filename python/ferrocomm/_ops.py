"""Reduction operators, spelled as torchcomms spells them."""

from __future__ import annotations

import enum
from typing import Any, ClassVar

from ._errors import FerrocommValueError

__all__ = ["ReduceOp"]


class RedOpType(str, enum.Enum):
    """What ``ReduceOp.type`` returns (torchcomms' ``ReduceOp.RedOpType``). Members equal
    their names (``ReduceOp.SUM.type == "SUM"``) and torch.distributed's ``RedOpType`` of the
    same name."""

    SUM = "SUM"
    PRODUCT = "PRODUCT"
    MIN = "MIN"
    MAX = "MAX"
    AVG = "AVG"
    BAND = "BAND"
    BOR = "BOR"
    BXOR = "BXOR"
    PREMUL_SUM = "PREMUL_SUM"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return str.__eq__(self, other)
        # torch.distributed.ReduceOp.RedOpType (a pybind enum) compares by name.
        name = getattr(other, "name", None)
        return isinstance(name, str) and name == self.value

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__  # type: ignore[assignment]  # str's, not Enum's

    __hash__ = str.__hash__


# The enum under a name the class body does not shadow (ReduceOp.RedOpType is the same class).
_RedOpType = RedOpType


class ReduceOp:
    """A reduction operator: ``ReduceOp.SUM``, ``PRODUCT``, ``MIN``, ``MAX``, ``AVG``,
    ``BAND``, ``BOR``, ``BXOR`` and ``ReduceOp.PREMUL_SUM(factor)`` (inputs multiplied by
    ``factor`` before summing; float dtypes only).
    """

    __slots__ = ("_name", "_factor")

    # Filled in below; declared for readers and type checkers.
    SUM: ClassVar[ReduceOp]
    PRODUCT: ClassVar[ReduceOp]
    MIN: ClassVar[ReduceOp]
    MAX: ClassVar[ReduceOp]
    AVG: ClassVar[ReduceOp]
    BAND: ClassVar[ReduceOp]
    BOR: ClassVar[ReduceOp]
    BXOR: ClassVar[ReduceOp]
    RedOpType: ClassVar[type[_RedOpType]]

    def __init__(self, name: str, factor: float = 1.0) -> None:
        name = str(name).lower()
        if name not in _NATIVE:
            raise FerrocommValueError(
                f"unknown reduce op {name!r} (expected one of {', '.join(sorted(_NATIVE))})"
            )
        self._name = name
        try:
            self._factor = float(factor)
        except (TypeError, ValueError):
            raise FerrocommValueError(
                f"reduce op {name}: factor must be a number, not {factor!r}") from None

    @staticmethod
    def PREMUL_SUM(factor: float) -> ReduceOp:  # noqa: N802 (torchcomms' spelling)
        """Sum of ``factor * x`` over ranks."""
        return ReduceOp("premul_sum", factor)

    @property
    def name(self) -> str:
        return self._name

    @property
    def factor(self) -> float:
        return self._factor

    @property
    def type(self) -> _RedOpType:
        """A ``RedOpType``: compares equal to ``ReduceOp.RedOpType.SUM``, ``"SUM"`` and
        ``torch.distributed.ReduceOp.SUM``."""
        return RedOpType("PRODUCT" if self._name == "prod" else self._name.upper())

    def native(self) -> tuple[str, float]:
        """(op name, factor) as the native layer takes them."""
        return _NATIVE[self._name], self._factor

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReduceOp):
            # torch.distributed.ReduceOp values compare by operator.
            try:
                other = ReduceOp.coerce(other)
            except (ValueError, TypeError):
                return NotImplemented
        return self._name == other._name and (
            self._name != "premul_sum" or self._factor == other._factor
        )

    def __hash__(self) -> int:
        return hash((self._name, self._factor if self._name == "premul_sum" else None))

    def __repr__(self) -> str:
        if self._name == "premul_sum":
            return f"ReduceOp.PREMUL_SUM({self._factor})"
        return f"ReduceOp.{self.type.value}"

    @classmethod
    def coerce(cls, op: Any) -> ReduceOp:
        """A ReduceOp from a ReduceOp, a name ("sum"), or torch.distributed.ReduceOp."""
        if isinstance(op, ReduceOp):
            return op
        if isinstance(op, str):
            return _CONSTANTS.get(op) or ReduceOp(op)
        # torch.distributed.ReduceOp holds a RedOpType in `.op`; RedOpType has `.name`.
        inner = getattr(op, "op", None)
        if inner is not None and not callable(inner):
            op = inner
        name = getattr(op, "name", None)
        if not isinstance(name, str):
            raise TypeError(f"not a reduce op: {op!r}")
        if name == "PREMUL_SUM":
            raise ValueError(
                "torch.distributed's PREMUL_SUM keeps its factor out of reach of Python; "
                "pass ferrocomm.ReduceOp.PREMUL_SUM(factor)")
        # The class's own constant where there is one (callers short-cut `op is ReduceOp.SUM`).
        return _CONSTANTS.get(name.lower()) or ReduceOp(name.lower())


_NATIVE = {
    "sum": "sum",
    "product": "prod",
    "prod": "prod",
    "min": "min",
    "max": "max",
    "avg": "avg",
    "premul_sum": "premulsum",
    "band": "band",
    "bor": "bor",
    "bxor": "bxor",
}

ReduceOp.RedOpType = RedOpType
ReduceOp.SUM = ReduceOp("sum")
ReduceOp.PRODUCT = ReduceOp("product")
ReduceOp.MIN = ReduceOp("min")
ReduceOp.MAX = ReduceOp("max")
ReduceOp.AVG = ReduceOp("avg")
ReduceOp.BAND = ReduceOp("band")
ReduceOp.BOR = ReduceOp("bor")
ReduceOp.BXOR = ReduceOp("bxor")

# The constants by name, for coerce.
_CONSTANTS = {c.name: c for c in (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX,
                                  ReduceOp.AVG, ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)}
