"""The lessons' own computations: hand-set heads, measures, parameter counts, exercises.

A regular package (not a namespace one): Streamlit then watches only its .py files, not the
whole folder, so files written into its __pycache__ never show a "File change" notice.
"""
