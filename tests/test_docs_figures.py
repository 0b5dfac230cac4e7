"""Docs and figures agree: every measured figure the README quotes appears in BENCHMARKS.md, and a
BENCHMARKS section's stated target status quotes its own table."""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNITS = r"x|ms|us|s|MB|GB|MiB|GiB|KB|%"
# A number with a decimal point or thousands separators, or one with a unit: "0.662 GB", "83,209",
# "19 ms", "1.06-1.34x" (each end of a range is a figure). Not: "84x84", "stack 4", "v0", "(84, 84)".
FIGURE = re.compile(rf"(?<![\w.\-/`])(\d[\d,]*(?:\.\d+)?)(?:-(\d[\d,]*(?:\.\d+)?))?\s*({UNITS})?(?![\w.])")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


def figures(text: str) -> list[str]:
    """The figures of ``text``'s prose (code blocks and inline code left out: commands, not measurements)."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    prose = re.sub(r"`[^`\n]*`", "", prose)
    prose = re.sub(r"Python\s*(?:>=\s*)?\d+(?:\.\d+)+", "", prose)  # versions are not figures
    out = []
    for m in FIGURE.finditer(prose):
        for n in (m.group(1), m.group(2)):
            if n and ("." in n or "," in n.rstrip(",") or m.group(3)):
                out.append(n.rstrip(","))
    return out


def test_the_parser_finds_figures():
    assert figures("takes 0.662 GB; 83,209 per second; 19 ms; 1.06-1.34x the rate; 84x84 frames, stack 4") == \
        ["0.662", "83,209", "19", "1.06", "1.34"]
    assert figures("`mmreplay bench --capacity 10` and\n```python\nx = 1.5\n```\nPython >= 3.11") == []


def test_every_figure_the_readme_quotes_is_in_benchmarks():
    quoted = figures(_read("README.md"))
    assert len(quoted) >= 20, quoted  # the README's claims section quotes many figures
    measured = set(NUMBER.findall(_read("BENCHMARKS.md")))
    missing = sorted({n for n in quoted if n not in measured})
    assert not missing, f"README.md quotes figures BENCHMARKS.md does not have: {missing}"


def test_the_prioritized_target_quotes_its_table():
    text = _read("BENCHMARKS.md").split("## Prioritized replay", 1)[1].split("\n## ", 1)[0]
    ratio = re.search(r"\| Atari 84x84, stack 4 \|[^\n]*?\| \*\*([\d.]+)\*\* \|", text)
    assert ratio, text
    said = re.search(r"on the Atari workload \((?:met|\*\*not met\*\*):\s+([\d.]+)\)", text)
    assert said and said.group(1) == ratio.group(1), (said, ratio.group(1))
