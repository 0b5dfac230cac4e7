"""A test skipped for a missing optional dependency says which extra runs it."""

from __future__ import annotations

import os
import re
import sys
import tomllib

import pytest

from tests._support.helpers import EXTRAS, require

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("module,extra", [("PIL.Image", "image"), ("gymnasium", "gym"), ("ale_py", "atari"),
                                          ("torch", "torch"), ("minari", "minari")])
def test_skip_message_names_the_extra(monkeypatch, module, extra):
    monkeypatch.delenv("CI", raising=False)
    if "." in module:
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setitem(sys.modules, module.split(".")[0], None)  # as if not installed
    with pytest.raises(pytest.skip.Exception) as skipped:
        require(module)
    assert f"pip install -e '.[{extra}]'" in str(skipped.value) and "'.[ci]'" in str(skipped.value)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=re.escape(f".[{extra}]")):
        require(module)


def test_every_optional_module_the_tests_need_has_an_extra():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    needed = set()
    for folder, _, names in os.walk(os.path.join(ROOT, "tests")):
        for name in names:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    needed |= {m.split(".")[0] for m in re.findall(r'require\("([\w.]+)"\)', f.read())}
    assert needed and needed <= EXTRAS.keys(), needed - EXTRAS.keys()
    for module in needed:
        assert EXTRAS[module] in extras, (module, EXTRAS[module])
        if EXTRAS[module] != "ci":  # test-only tools (the S3 server) are in [ci] itself
            assert EXTRAS[module] in " ".join(extras["ci"]), f"[ci] must include [{EXTRAS[module]}]"
