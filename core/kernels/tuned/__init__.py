"""The tuned kernels: the fast path for large inputs and training.

A regular package (not a namespace one): Streamlit then watches only its .py files, not the
whole folder, so the cache files Numba writes into its __pycache__ when a kernel compiles never
show a "File change" notice.
"""
