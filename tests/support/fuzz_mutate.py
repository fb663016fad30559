"""The mutation engine the fuzz targets share: one place that turns a valid seed input into a
hostile one, used by the hypothesis tests (tests/fuzz/test_fuzz_*.py) and by the long-run
driver's built-in engine (tests/fuzz/run.py --engine mutate).

Mutations are the classic ones of a byte-level fuzzer: bit flips, random bytes, truncation,
deletion, duplication, insertion, splicing with another seed, and arithmetic on 1- to 4-byte
integers of either byte order at a random position, which is how a length field (HTTP/2's
24-bit frame length, gRPC's 32-bit prefix, a protobuf varint, the WAL's little-endian header)
gets tweaked without the engine knowing where the length fields are.
"""

import random

# Values that sit on the edges length and size checks are written against.
INTERESTING = (0, 1, 0x7F, 0x80, 0xFF, 0x100, 0x3FFF, 0x4000, 0x7FFF, 0x8000, 0xFFFF,
               0x10000, 0xFFFFFF, 0x1000000, 0x3FFFFFFF, 0x40000000, 0x7FFFFFFF, 0x80000000,
               0xFFFFFFFF)


def _flip_bit(data, rnd, seeds):
    if not data:
        return data
    i = rnd.randrange(len(data) * 8)
    data[i // 8] ^= 1 << (i % 8)
    return data


def _random_byte(data, rnd, seeds):
    if data:
        data[rnd.randrange(len(data))] = rnd.randrange(256)
    return data


def _truncate(data, rnd, seeds):
    return data[:rnd.randrange(len(data) + 1)]


def _delete(data, rnd, seeds):
    if not data:
        return data
    start = rnd.randrange(len(data))
    del data[start:start + rnd.randint(1, max(1, len(data) // 4))]
    return data


def _insert(data, rnd, seeds):
    pos = rnd.randrange(len(data) + 1)
    data[pos:pos] = rnd.randbytes(rnd.choice((1, 2, 4, 9, 16, 64)))
    return data


def _duplicate(data, rnd, seeds):
    if not data:
        return data
    start = rnd.randrange(len(data))
    chunk = data[start:start + rnd.randint(1, 64)]
    pos = rnd.randrange(len(data) + 1)
    data[pos:pos] = chunk * rnd.randint(1, 4)
    return data


def _splice(data, rnd, seeds):
    other = rnd.choice(seeds) if seeds else bytes(data)
    cut = rnd.randrange(len(data) + 1)
    return data[:cut] + other[rnd.randrange(len(other) + 1):]


def _integer(data, rnd, seeds):
    """Arithmetic or an interesting value on a 1-4 byte integer, big or little endian."""
    width = rnd.choice((1, 2, 3, 4))
    if len(data) < width:
        return data
    pos = rnd.randrange(len(data) - width + 1)
    order = rnd.choice(("big", "little"))
    mask = (1 << (8 * width)) - 1
    if rnd.random() < 0.5:
        value = int.from_bytes(data[pos:pos + width], order) + rnd.choice((-1, 1)) * \
            rnd.randint(1, 35)
    else:
        value = rnd.choice(INTERESTING)
    data[pos:pos + width] = (value & mask).to_bytes(width, order)
    return data


MUTATIONS = (_flip_bit, _random_byte, _truncate, _delete, _insert, _duplicate, _splice,
             _integer, _integer, _flip_bit)


def mutate(seed: bytes, rnd: random.Random, seeds=(), rounds: int | None = None,
           max_size: int = 1 << 16) -> bytes:
    """`seed` after 1-8 random mutations (or `rounds`), capped at `max_size` bytes."""
    data = bytearray(seed)
    for _ in range(rounds if rounds is not None else rnd.randint(1, 8)):
        data = MUTATIONS[rnd.randrange(len(MUTATIONS))](data, rnd, seeds)
    return bytes(data[:max_size])


def fuzz_inputs(seeds, max_random=512):
    """A hypothesis strategy: random bytes, or a seed after a few mutations (the seed drawn
    from `seeds`, the mutations from a hypothesis-controlled Random so that failures shrink
    and replay)."""
    from hypothesis import strategies as st

    seeds = [bytes(s) for s in seeds]
    mutated = st.builds(lambda seed, rnd, rounds: mutate(seed, rnd, seeds, rounds),
                        st.sampled_from(seeds), st.randoms(use_true_random=False),
                        st.integers(1, 8))
    return st.one_of(st.binary(max_size=max_random), mutated, st.sampled_from(seeds))


def fuzz_settings(max_examples):
    """Hypothesis settings of the short runs in the test command: no per-example deadline
    (the machine is shared; a hang is caught by the test timeout), and DANUBE_FUZZ_SCALE
    (a number) to run more examples than the default budget."""
    import os

    from hypothesis import HealthCheck, settings

    scale = float(os.environ.get("DANUBE_FUZZ_SCALE", "1"))
    return settings(max_examples=max(1, int(max_examples * scale)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture],
                    print_blob=True)
