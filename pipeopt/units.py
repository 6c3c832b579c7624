"""Bandwidths and memory sizes written with units that cannot be misread.

pipeopt computes in bytes and bytes per second (docs/cost-model.md). People write network links in
*bits* per second (``100Gbps``, ``10Gbit/s``) and memory in bytes (``16GiB``); a parser that
reads ``10Gbps`` as 10 GB/s is off by a factor of 8 without a word. Here the letter case of
the unit carries the meaning, as in the SI/IEC conventions, and every form that could be
read two ways is refused:

Bandwidth (:func:`parse_bandwidth`), result in **bytes per second**:

====================  ==========================================  ===================
form                  meaning                                     ``"10<unit>"`` =
====================  ==========================================  ===================
a bare number         bytes per second                            ``10.0``
``bps``, ``bit/s``    bits per second (``Kbps`` .. ``Pbps``,      ``1.25e9`` (Gbps)
                      ``Gbit/s``; ``Gibit/s`` binary)
``B/s``               bytes per second (``kB/s`` .. ``PB/s``)     ``1e10`` (GB/s)
``iB/s``              binary bytes per second (``KiB/s`` ..)      ``10 * 2**30``
====================  ==========================================  ===================

Memory size (:func:`parse_size`), result in **bytes**: a bare number, or a number with
``B``, ``kB``/``KB`` .. ``PB`` (powers of 1000) or ``KiB`` .. ``PiB`` (powers of 1024).

Refused, with a :class:`~pipeopt.errors.InvalidUnitError` that lists the accepted forms: a
prefix without a unit (``10G``), bits for a memory size (``16Gb``), ``Bps``/``b/s`` (one
letter's case away from the other meaning), a lower-case ``b`` in a size (``16gib``), any
other word (``10 gigs``), and values that are zero, negative, not a number or infinite --
except two spellings of "no limit": a bandwidth of ``inf`` (also ``infinity``, any case, or
``math.inf``) means **free communication** (every transfer takes zero seconds, as many papers
assume; see :func:`parse_bandwidth`), and :func:`parse_size` takes ``inf`` when asked, as
"no memory limit". An overflowing number (``1e999``) is still refused.

Prefixes are SI and decimal: ``GB`` is 10**9 bytes, ``GiB`` is 2**30 (a "16 GB" GPU usually
has 16 GiB: write what you mean). Decimal prefixes (k = 1e3, M = 1e6, G = 1e9, T = 1e12,
P = 1e15) are case-insensitive (``mB/s`` is MB/s: milli-bytes make no sense here); ``Ki``,
``Mi``, ... are binary (2**10, 2**20, ...). A space between the number and the unit is allowed.

Examples
--------
>>> parse_bandwidth("10Gbps"), parse_bandwidth("10GB/s"), parse_bandwidth("1.25e9")
(1250000000.0, 10000000000.0, 1250000000.0)
>>> parse_size("16GiB") == 16 * 2**30, parse_size("1.5e9")
(True, 1500000000.0)
"""

from __future__ import annotations

import math
import numbers
import re

from .errors import InvalidUnitError

__all__ = [
    "BANDWIDTH_FORMS",
    "SIZE_FORMS",
    "LATENCY_FORMS",
    "as_bandwidth",
    "as_latency",
    "as_size",
    "parse_bandwidth",
    "parse_latency",
    "parse_size",
]

BANDWIDTH_FORMS = (
    "a number of bytes per second (1.25e10), or a number with a unit: bits per second "
    "(100Gbps, 100Gbit/s, 25Gibit/s), bytes per second (12.5GB/s) or binary bytes per "
    "second (10GiB/s); prefixes k, M, G, T, P; or inf (free communication)"
)
"""The accepted bandwidth forms, as quoted in error messages."""

SIZE_FORMS = (
    "a number of bytes (1.5e9), or a number with a unit: B, kB/KB, MB, GB, TB, PB "
    "(powers of 1000) or KiB, MiB, GiB, TiB, PiB (powers of 1024), e.g. 16GiB, 40GB"
)
"""The accepted memory-size forms, as quoted in error messages."""

LATENCY_FORMS = (
    "a number of seconds (3e-4), or a number with a unit: s, ms, us (or \u00b5s), ns, e.g. 0.3ms; 0 for none"
)
"""The accepted latency forms, as quoted in error messages."""

_DECIMAL = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
_BINARY = {"k": 2.0**10, "m": 2.0**20, "g": 2.0**30, "t": 2.0**40, "p": 2.0**50}

_NUMBER = r"(?P<num>[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?i:inf|infinity|nan))"
_PREFIX = r"(?P<prefix>[kKmMgGtTpP]?)(?P<binary>i?)"
# bits: "bps" (lower-case b) or "bit/s" (any case); bytes: "B/s" (upper-case B). Patterns as text:
# re compiles (and caches) them on first use, not at import
_RATE = rf"\s*{_NUMBER}\s*(?:{_PREFIX}(?P<unit>bps|(?i:bit)/s|B/s))?\s*"
_SIZE = rf"\s*{_NUMBER}\s*(?:{_PREFIX}(?P<unit>B))?\s*"
_UNLIMITED = ("inf", "infinity", "unlimited", "none")
_FREE = ("inf", "infinity", "+inf", "+infinity")
"""Spellings of an infinite bandwidth (free communication); no unit may follow."""


_TIME = rf"\s*{_NUMBER}\s*(?P<unit>s|ms|us|\u00b5s|ns)?\s*"
_TIME_SCALE = {None: 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "\u00b5s": 1e-6, "ns": 1e-9}


def _scale(m: re.Match) -> float | None:
    """The factor of the prefix of a unit match (``None`` for ``"iB"`` without a prefix)."""
    prefix = (m["prefix"] or "").lower()
    if m["binary"]:
        return _BINARY.get(prefix)
    return _DECIMAL[prefix]


def _check_value(value: float, text, what: str, forms: str) -> float:
    if math.isnan(value) or math.isinf(value) or value <= 0:
        raise InvalidUnitError(f"{what} must be a positive finite amount, got {text!r}; write {forms}")
    return value


def parse_bandwidth(text: str | float) -> float:
    """Read a bandwidth as bytes per second.

    Parameters
    ----------
    text
        A string in one of the forms of the module docstring (``"100Gbps"``,
        ``"12.5GB/s"``, ``"1.25e10"``), or a number (bytes per second).

    Returns
    -------
    float
        Bytes per second, positive; ``math.inf`` for ``"inf"`` / ``"infinity"`` (any case,
        no unit): free communication, every transfer takes 0 s (the cost rules divide bytes by
        the bandwidth, :func:`pipeopt.cost.rules.transfer_time`, so ``bytes / inf = 0``).

    Raises
    ------
    InvalidUnitError
        If the text is in no accepted form (``"10G"``, ``"10 gigs"``, ``"10GBps"``,
        ``"10Gb/s"``) or the value is zero, negative, not a number, or infinite by overflow
        (``"1e999"``) or with a unit (``"infGbps"``); the message lists the accepted forms.
    """
    if not isinstance(text, str):
        return as_bandwidth(text)
    if text.strip().lower() in _FREE:
        return math.inf
    m = re.fullmatch(_RATE, text)
    scale = _scale(m) if m is not None and m["unit"] else 1.0
    if m is None or scale is None:
        raise InvalidUnitError(f"not a bandwidth: {text!r}; write {BANDWIDTH_FORMS}")
    if m["unit"] and m["unit"] != "B/s":  # bits
        scale /= 8.0
    return _check_value(float(m["num"]) * scale, text, "bandwidth", BANDWIDTH_FORMS)


def parse_size(text: str | float, *, unlimited: bool = False) -> float:
    """Read a memory size as bytes.

    Parameters
    ----------
    text
        A string in one of the forms of the module docstring (``"16GiB"``, ``"40GB"``,
        ``"1.5e9"``), or a number (bytes).
    unlimited
        Also accept ``"inf"``, ``"infinity"``, ``"unlimited"`` and ``"none"`` (any case),
        and the number ``math.inf``, meaning "no limit" (returned as ``math.inf``).

    Returns
    -------
    float
        Bytes, positive (finite unless ``unlimited``).

    Raises
    ------
    InvalidUnitError
        If the text is in no accepted form (``"16G"``, ``"16Gb"``, ``"16gib"``) or the value
        is zero, negative, not a number, or infinite without ``unlimited``; the message
        lists the accepted forms.
    """
    if not isinstance(text, str):
        return as_size(text, unlimited=unlimited)
    if unlimited and text.strip().lower() in _UNLIMITED:
        return math.inf
    m = re.fullmatch(_SIZE, text)
    scale = _scale(m) if m is not None and m["unit"] else 1.0
    if m is None or scale is None:
        raise InvalidUnitError(f"not a memory size: {text!r}; write {SIZE_FORMS}")
    forms = SIZE_FORMS + (", or inf for no limit" if unlimited else "")
    return _check_value(float(m["num"]) * scale, text, "memory size", forms)


def _as_number(value, what: str, forms: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidUnitError(
            f"{what} must be a number or a string with a unit, got {type(value).__name__} {value!r}; write {forms}"
        )
    return float(value)


def as_bandwidth(value) -> float:
    """A bandwidth given as a number of bytes per second or a unit string, as bytes/s;
    ``math.inf`` (or ``"inf"``) is free communication (see :func:`parse_bandwidth`).

    Raises
    ------
    InvalidUnitError
        Wrong type, or a value that is not positive (zero, negative, NaN).
    """
    if isinstance(value, str):
        return parse_bandwidth(value)
    number = _as_number(value, "bandwidth", BANDWIDTH_FORMS)
    if number == math.inf:
        return number
    return _check_value(number, value, "bandwidth", BANDWIDTH_FORMS)


def as_size(value, *, unlimited: bool = False) -> float:
    """A memory size given as a number of bytes or a unit string, as bytes.

    ``unlimited`` lets ``math.inf`` (or ``"inf"``) through as "no limit".

    Raises
    ------
    InvalidUnitError
        Wrong type, or a value that is not positive (and finite, unless ``unlimited``).
    """
    if isinstance(value, str):
        return parse_size(value, unlimited=unlimited)
    number = _as_number(value, "memory size", SIZE_FORMS)
    if unlimited and number == math.inf:
        return number
    return _check_value(number, value, "memory size", SIZE_FORMS)


def parse_latency(text: str | float) -> float:
    """Read a per-message latency (the alpha of the alpha-beta communication model) as seconds.

    Parameters
    ----------
    text
        ``"0.3ms"``, ``"300us"``, ``"3e-4"`` (seconds), ``"0"``; or a number of seconds.

    Returns
    -------
    float
        Seconds, finite and >= 0.

    Raises
    ------
    InvalidUnitError
        If the text is in no accepted form or the value is negative, not a number or infinite
        (the message lists the accepted forms).
    """
    if not isinstance(text, str):
        return as_latency(text)
    m = re.fullmatch(_TIME, text)
    if m is None:
        raise InvalidUnitError(f"not a latency: {text!r}; write {LATENCY_FORMS}")
    return as_latency(float(m["num"]) * _TIME_SCALE[m["unit"]])


def as_latency(value) -> float:
    """A per-message latency given as seconds or a unit string (:func:`parse_latency`), as
    seconds.

    Raises
    ------
    InvalidUnitError
        Wrong type, or a value that is negative, not a number, infinite or above
        :data:`MAX_SECONDS`.
    """
    if isinstance(value, str):
        return parse_latency(value)
    number = _as_number(value, "latency", LATENCY_FORMS)
    if math.isnan(number) or math.isinf(number) or number < 0 or number > MAX_SECONDS:
        raise InvalidUnitError(f"latency must be a finite number of seconds >= 0, got {value!r}; write {LATENCY_FORMS}")
    return number + 0.0  # -0.0 -> 0.0


# ---- magnitudes the data model accepts -----------------------------------------------------
MAX_BYTES = 1e15
"""Largest byte amount pipeopt accepts (one petabyte): any one layer's or edge's bytes, the
layers' bytes added up, and a device's finite memory. Larger values are almost surely not
bytes (bits, or a unit mix-up), and the exact methods count bytes in 64-bit integers."""

MAX_SECONDS = 1e9
"""Largest time value pipeopt accepts for a layer (about 32 years on one resource unit):
larger values are a unit mix-up, and sums of them must stay finite."""

MAX_DEVICES = 100_000
"""Largest number of devices in a cluster (and of stages or workers asked for)."""

MAX_MICROBATCHES = 100_000
"""Largest number of microbatches per iteration (the simulator plays every one of them)."""

DEFAULT_MICROBATCHES = 8
"""M, microbatches per iteration, when none is given: **the one rule** of every command and
function is *the M given, else the instance's* ``settings.microbatches``; an instance built
without one (``Settings()``, an instance file without the key, ``pipeopt profile`` /
:func:`pipeopt.torch.from_torch`) carries this value, and so does ``pipeopt run`` without an
instance. (``pipeopt.zoo`` writes its instances with ``4 x devices``: their own setting,
which the rule then reads.)"""
