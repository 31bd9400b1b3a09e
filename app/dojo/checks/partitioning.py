"""Kafka's default partitioner, as the Java client computes it.

Checks use it to say where a key must land: a Python producer configured with
`partitioner=murmur2_random` puts keyed records exactly where a Java producer would.
"""

from __future__ import annotations

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2) as a signed 32-bit int."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    for i in range(length // 4):
        k = int.from_bytes(data[i * 4:i * 4 + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    tail = length & ~3
    extra = length % 4
    # Java's switch falls through from case 3 to case 1.
    if extra == 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for a non-null key."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
