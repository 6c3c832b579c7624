"""Bandwidths and memory sizes: units that cannot be misread (pipeopt.units)."""

from __future__ import annotations

import math

import pytest

from pipeopt import Cluster, Device
from pipeopt.errors import InvalidClusterError, InvalidUnitError, PipeoptError
from pipeopt.units import BANDWIDTH_FORMS, SIZE_FORMS, as_bandwidth, as_size, parse_bandwidth, parse_size

GIB = 2**30


@pytest.mark.parametrize(
    ("text", "bytes_per_s"),
    [
        ("10Gbps", 1.25e9),  # bits!
        ("10Gbit/s", 1.25e9),
        ("10 Gbps", 1.25e9),
        ("10gbps", 1.25e9),  # "bps" is bits whatever the prefix's case
        ("10GBit/s", 1.25e9),  # "bit" spelled out is bits
        ("100Mbps", 1.25e7),
        ("1kbps", 125.0),
        ("1Tbps", 1.25e11),
        ("1Gibit/s", GIB / 8),
        ("10GB/s", 1e10),
        ("12.5GB/s", 1.25e10),
        ("10GiB/s", 10 * GIB),
        ("1MiB/s", 2**20),
        ("1kB/s", 1e3),
        ("1KB/s", 1e3),
        ("3B/s", 3.0),
        ("1.25e10", 1.25e10),  # a bare number is bytes per second
        ("10", 10.0),
        (" 2.5e9 ", 2.5e9),
        (".5GB/s", 5e8),
    ],
)
def test_bandwidth_forms(text, bytes_per_s):
    assert parse_bandwidth(text) == pytest.approx(bytes_per_s, rel=1e-15)


@pytest.mark.parametrize(
    "text",
    [
        "10G",  # bits or bytes?
        "10 gigs",
        "10Gb/s",  # one letter's case away from GB/s
        "10gb/s",
        "10GBps",  # one letter's case away from Gbps
        "10Bps",
        "10Gbit",  # no "per second"
        "10GB",  # a size, not a rate
        "10iB/s",
        "10 B",
        "Gbps",
        "",
        "1e",
        "10Gbps/s",
        "1,000",
        "-1",
        "-10Gbps",
        "0",
        "0GB/s",
        "nan",
        "NaN",
        "-inf",
        "infGbps",  # inf means free communication: no unit
        "1e400",  # overflows to inf
        "1e308GB/s",
    ],
)
def test_bandwidth_rejected_with_the_forms(text):
    with pytest.raises(InvalidUnitError) as info:
        parse_bandwidth(text)
    assert BANDWIDTH_FORMS in str(info.value)
    assert isinstance(info.value, InvalidClusterError) and isinstance(info.value, PipeoptError)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("16GiB", 16 * GIB),
        ("16 GiB", 16 * GIB),
        ("16GB", 16e9),
        ("1.5e9", 1.5e9),
        ("123", 123.0),
        ("512MiB", 512 * 2**20),
        ("1TB", 1e12),
        ("1TiB", 2**40),
        ("2kB", 2e3),
        ("2KiB", 2048.0),
        ("7B", 7.0),
        ("1PB", 1e15),
    ],
)
def test_size_forms(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize(
    "text",
    ["16G", "16Gb", "16gib", "16gb", "16 gigs", "16iB", "-1", "0", "0GiB", "nan", "inf", "1e999", "", "16GiB/s"],
)
def test_size_rejected_with_the_forms(text):
    with pytest.raises(InvalidUnitError) as info:
        parse_size(text)
    assert SIZE_FORMS in str(info.value)


def test_unlimited_size_only_when_asked():
    for text in ("inf", "Infinity", "unlimited", "none"):
        assert parse_size(text, unlimited=True) == math.inf
    assert as_size(math.inf, unlimited=True) == math.inf
    with pytest.raises(InvalidUnitError):
        as_size(math.inf)
    with pytest.raises(InvalidUnitError):
        parse_size("nan", unlimited=True)


@pytest.mark.parametrize("value", [None, True, [1], {"a": 1}, b"10", -1.0, 0, math.nan, -math.inf])
def test_numbers_and_wrong_types(value):
    with pytest.raises(InvalidUnitError):
        as_bandwidth(value)
    with pytest.raises(InvalidUnitError):
        as_size(value)


def test_infinite_bandwidth_is_free_communication():
    """``inf`` is a bandwidth (no communication cost), not a memory size (unless unlimited)."""
    assert as_bandwidth(math.inf) == parse_bandwidth("inf") == parse_bandwidth(" Infinity ") == math.inf
    with pytest.raises(InvalidUnitError):
        as_size(math.inf)


def test_numbers_pass_through():
    assert as_bandwidth(1.25e10) == parse_bandwidth(1.25e10) == 1.25e10
    assert as_size(4) == parse_size(4) == 4.0


def test_cluster_and_device_take_unit_strings():
    cluster = Cluster.homogeneous(2, memory="16GiB", bandwidth="100Gbps")
    assert cluster.bandwidth == 1.25e10
    assert all(d.memory == 16 * GIB for d in cluster.devices)
    assert Device("a", {"gpu": 1}, "40GB").memory == 40e9
    assert Device("a", {"gpu": 1}, "inf").memory == math.inf
    with pytest.raises(InvalidUnitError, match="10G"):
        Cluster.homogeneous(2, bandwidth="10G")
    with pytest.raises(InvalidClusterError, match="16G"):
        Device("a", {"gpu": 1}, "16G")


def test_native_file_reads_unit_strings(tmp_path):
    import json

    from pipeopt.io import native, read

    cluster = Cluster.homogeneous(2, memory=8e9)
    import networkx as nx

    from pipeopt import Instance

    g = nx.DiGraph()
    g.add_node("a", fwd={"gpu": 1e-3}, bwd={"gpu": 2e-3}, out_bytes=1.0, act_bytes=1.0, param_bytes=1.0)
    d = native.to_dict(Instance(g, cluster))
    d["cluster"]["bandwidth"] = "200Gbps"
    d["cluster"]["devices"][0]["memory"] = "8GiB"
    path = tmp_path / "u.json"
    path.write_text(json.dumps(d))
    inst = read(path)
    assert inst.cluster.bandwidth == 2.5e10 and inst.cluster.devices[0].memory == 8 * GIB
    d["cluster"]["bandwidth"] = "200G"
    path.write_text(json.dumps(d))
    with pytest.raises(InvalidUnitError, match=r"u\.json: field 'cluster.bandwidth'"):
        read(path)
