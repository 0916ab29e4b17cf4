from __future__ import annotations

import pytest

from api.cli.serve import parse_adapter_flag


@pytest.mark.parametrize("flag,ok", [("a=/p", True), ("a=", False), ("=/p", False), ("a", False)])
def test_parse_adapter_flag(flag, ok):
    if ok:
        assert parse_adapter_flag(flag)[0] == "a"
    else:
        with pytest.raises(ValueError):
            parse_adapter_flag(flag)
