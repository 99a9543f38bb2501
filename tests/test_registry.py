"""The registry helper: duplicates refused, misses list the valid names."""

import pytest

from sparrow.registry import Registry


def test_register_get_and_errors():
    reg = Registry("policy loss")

    @reg.register("b")
    def b():
        return 2

    reg.register("a")(lambda: 1)
    assert reg.get("b") is b and reg.names() == ["a", "b"] and "a" in reg
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(lambda: 3)
    with pytest.raises(KeyError, match="unknown policy loss 'c'; valid: a, b"):
        reg.get("c")
    assert reg.unregister("a")() == 1 and reg.names() == ["b"]
    with pytest.raises(KeyError, match="not registered"):
        reg.unregister("a")
