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
