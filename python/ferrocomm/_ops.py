"""Reduction operators, spelled as torchcomms spells them."""

from ._errors import FerrocommValueError

__all__ = ["ReduceOp"]


class ReduceOp:
    """A reduction operator: ``ReduceOp.SUM``, ``PRODUCT``, ``MIN``, ``MAX``, ``AVG``,
    ``BAND``, ``BOR``, ``BXOR`` and ``ReduceOp.PREMUL_SUM(factor)`` (inputs multiplied by
    ``factor`` before summing; float dtypes only).
    """

    __slots__ = ("_name", "_factor")

    # Filled in below; declared for readers and type checkers.
    SUM = PRODUCT = MIN = MAX = AVG = BAND = BOR = BXOR = None

    def __init__(self, name, factor=1.0):
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
    def PREMUL_SUM(factor):  # noqa: N802 (torchcomms' spelling)
        """Sum of ``factor * x`` over ranks."""
        return ReduceOp("premul_sum", factor)

    @property
    def name(self):
        return self._name

    @property
    def factor(self):
        return self._factor

    @property
    def type(self):
        return self._name.upper()

    def native(self):
        """(op name, factor) as the native layer takes them."""
        return _NATIVE[self._name], self._factor

    def __eq__(self, other):
        return (
            isinstance(other, ReduceOp)
            and self._name == other._name
            and (self._name != "premul_sum" or self._factor == other._factor)
        )

    def __hash__(self):
        return hash((self._name, self._factor if self._name == "premul_sum" else None))

    def __repr__(self):
        if self._name == "premul_sum":
            return f"ReduceOp.PREMUL_SUM({self._factor})"
        return f"ReduceOp.{self.type}"

    @classmethod
    def coerce(cls, op):
        """A ReduceOp from a ReduceOp, a name ("sum"), or torch.distributed.ReduceOp."""
        if isinstance(op, ReduceOp):
            return op
        if isinstance(op, str):
            return ReduceOp(op)
        name = getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]
        return ReduceOp(str(name).lower())


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

ReduceOp.SUM = ReduceOp("sum")
ReduceOp.PRODUCT = ReduceOp("product")
ReduceOp.MIN = ReduceOp("min")
ReduceOp.MAX = ReduceOp("max")
ReduceOp.AVG = ReduceOp("avg")
ReduceOp.BAND = ReduceOp("band")
ReduceOp.BOR = ReduceOp("bor")
ReduceOp.BXOR = ReduceOp("bxor")
