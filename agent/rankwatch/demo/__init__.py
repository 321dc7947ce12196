"""Stand-ins for the programs rankwatch watches, for `rankwatch demo` and the tests.

``python -m rankwatch.demo.trainer`` plays one rank of a training job: it prints what a
real framework prints and fails the way real jobs fail, without torch or a GPU.
"""
