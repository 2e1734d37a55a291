"""`python -m bench`: the benches, as docs/benchmarks.md lists them."""

from . import listing

print(listing(), end="")
