"""bench.scale (issue 53): many reliable topics, many active topics and many connections on
one broker, against a baseline build. `python -m bench.scale`; see runner.py and
bench/README.md, "bench.scale"."""
