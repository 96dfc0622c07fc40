"""Pinned host memory is mapped at its recorded address on replay (replay/hostplace.py)."""
import ctypes
import mmap

from cudasnap.replay import hostplace


def _free_address(n):
    """An address the kernel picks for n bytes, then released: free at the moment."""
    m = mmap.mmap(-1, n)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    m.close()
    return addr


def test_map_at_places_exactly_and_never_over_a_mapping():
    n = 3 * mmap.PAGESIZE + 5
    addr = _free_address(4 * mmap.PAGESIZE)
    assert hostplace.map_at(addr, n)
    buf = (ctypes.c_char * n).from_address(addr)
    buf[0], buf[n - 1] = b"x", b"y"                      # usable, zeroed elsewhere
    assert buf[1] == b"\0"
    assert not hostplace.map_at(addr, n)                 # taken: never mapped over
    hostplace.unmap(addr, n)
    assert hostplace.map_at(addr, n)                     # free again
    hostplace.unmap(addr, n)


class _Refusing:
    class cu:
        @staticmethod
        def cuMemHostRegister(p, n, flags):
            return (1,)


def test_place_leaves_nothing_mapped_when_the_driver_refuses():
    n = 2 * mmap.PAGESIZE
    addr = _free_address(n)
    assert hostplace.place(_Refusing, addr, n) is None
    assert hostplace.map_at(addr, n)                     # the range was given back
    hostplace.unmap(addr, n)


def test_span_rounds_to_pages():
    p = mmap.PAGESIZE
    assert hostplace.span(p + 10, 1) == (p, p)
    assert hostplace.span(p, p + 1) == (p, 2 * p)


def test_reserved_ranges_are_taken_over_and_kept():
    """Recorded ranges reserved before the driver loads: map_at takes them over (once), unmap
    gives them back to the reservation, a foreign mapping is never replaced."""
    n = 2 * mmap.PAGESIZE
    addr = _free_address(4 * n)
    assert hostplace.reserve([(addr, n), (addr + 2 * n, n)]) == 2
    assert hostplace.reserve([(addr, n)]) == 0                       # already held
    assert hostplace.map_at(addr, n)
    buf = (ctypes.c_char * n).from_address(addr)
    buf[0] = b"z"
    assert not hostplace.map_at(addr, n)                             # in use: never mapped over
    hostplace.unmap(addr, n)
    assert hostplace.map_at(addr, n) and buf[0] == b"\0"             # fresh zeroed memory again
    hostplace.unmap(addr, n)
    other = _free_address(n)
    assert hostplace.reserve([(other, n)]) == 1 and hostplace.map_at(other, n)
    hostplace.unmap(other, n)
