"""Two summaries (or any parts of them) held equal, as the tests of the operator report's paths compare them."""

import dataclasses

import pytest


def assert_same(a, b, where: str, ordered: bool = False) -> None:
    """Equal, floats to their last bits (sums taken in another order); with ``ordered``, dicts' keys in the
    same order too (the order the report lists rows in when their figures tie)."""
    if isinstance(b, dict):
        assert (list(a) == list(b)) if ordered else (a.keys() == b.keys()), where
        for key in b:
            assert_same(a[key], b[key], f"{where}[{key!r}]", ordered)
    elif isinstance(b, (list, tuple)) or hasattr(b, "typecode"):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]", ordered)
    elif isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-6), where
    elif dataclasses.is_dataclass(b):  # field by field: asdict would make a Counter's items its keys
        for f in dataclasses.fields(b):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}", ordered)
    else:
        assert a == b, where
