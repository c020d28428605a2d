"""Byte sizes as users write them: `1GiB`, `64MiB`, `32KB`, `4096`, and ranges `1KiB..1GiB`."""

from __future__ import annotations

import math
import re

from mlopt.errors import InputError

UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
    "K": 2**10, "M": 2**20, "G": 2**30,  # nccl-tests' -b/-e shorthand is binary
}
MAX_SIZE_BYTES = 2**53  # exactly representable as a float; far beyond any machine's memory
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str, source: str = "--size") -> int:
    """Bytes in `text`; InputError naming `source` when it is not a positive size."""
    m = _SIZE.match(str(text))
    unit = m.group(2).upper() if m else None
    if not m or unit not in UNITS:
        raise InputError(source, "$", f"{text!r} is not a size like 1GiB, 64MiB, 32KB or 4096")
    value = float(m.group(1)) * UNITS[unit]
    if not math.isfinite(value) or value > MAX_SIZE_BYTES:  # 1e400 reads as infinity; int() of it would crash
        raise InputError(source, "$", f"{text!r} is beyond 2**53 bytes (8 PiB), larger than any buffer")
    if value < 1 or value != int(value):
        raise InputError(source, "$", f"{text!r} is not a whole positive number of bytes")
    return int(value)


def parse_size_range(text: str, source: str = "--sizes", factor: int = 4) -> list[int]:
    """`LO..HI` -> LO, LO*factor, ... up to HI (HI always included); `A,B,C` -> those sizes."""
    if ".." in text:
        lo_text, _, hi_text = text.partition("..")
        lo, hi = parse_size(lo_text, source), parse_size(hi_text, source)
        if hi < lo:
            raise InputError(source, "$", f"range {text!r} ends below its start")
        sizes = [lo]
        while sizes[-1] * factor <= hi:
            sizes.append(sizes[-1] * factor)
        if sizes[-1] != hi:
            sizes.append(hi)
        return sizes
    sizes = [parse_size(part, source) for part in text.split(",") if part.strip()]
    if not sizes:
        raise InputError(source, "$", f"{text!r} names no size")
    return sizes


def format_size(n: int) -> str:
    """Shortest exact binary spelling: 1073741824 -> '1GiB', 1536 -> '1536B'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"
